"""Terms of `pod.step_model` that a real step pays besides its FLOPs and HBM bytes.

Each is printed as its own line of the report (`Program.lines`). Notation of `step_model`;
tp = chips per decode replica (mesh.tensor), R decode replicas, S slots, K chunk_steps.

  engine prefill   as `continuous.Engine` runs it: every prompt right-padded to its bucket
                   (`ops.prompt_bucket` with `run.sampling.build_sampler`'s prompt_buckets =
                   (data.max_prompt_tokens,)), one dense prefill per prompt, and the prefill
                   program runs on the whole mesh, so every decode replica computes every
                   prompt: per chip Σ_prompts F_fwd(1 × bucket) / tp at MFU, plus per prompt
                   (2L + 2) collectives × latency and the tensor-parallel activation
                   all-reduces, 2 L bucket D bf16 bytes, ring factor 2 (tp − 1) / tp, at the
                   collective bandwidth.
  host gap         ⌈decode steps / K⌉ chunks × the host work per chunk (`pod.host_gap`,
                   measured on this CPU at the engine's sizes and the phase's mean live KV).
  decode kernel    jax's Pallas ragged paged attention reads a slot's KV in blocks of
   blocks          pages_per_block pages (`paged_attention.tpu_decode_attention`: the
                   largest divisor of M not above EngineConfig.pages_per_block): a slot of ℓ
                   KV tokens reads ⌈ℓ / Bt⌉ Bt, Bt = pages × page_size, on average
                   (Bt − 1) / 2 tokens more per live slot and step (ℓ grows by one a step).
  train            read from compiled HLO (`pod.train_hlo`, --train_collectives=JSON):
   collectives     per program, micro-batches × per-trip + calls × per-call collectives;
                   exposed ones count × latency + wire bytes / collective bandwidth, the
                   overlapped ones (async, compute scheduled between start and done) are
                   printed, not counted.
Collective bandwidth = ICI per chip × `collective_bw_share` (a ring over one torus axis uses
2 of a 3-D torus chip's 6 links: 1/3); a collective-permute's = ICI × `permute_bw_share` (one
link in one direction: 1/6; `priced`).
"""

from __future__ import annotations

import inspect
import math
import types

import numpy as np

from vapo_jax.pod.step import counts as step_counts


def bucket_of(length: int, max_prompt: int, buckets: tuple) -> int:
  """`ops.prompt_bucket` of a prompt of `length` tokens with the engine's buckets."""
  from vapo_jax.sampler import ops  # pylint: disable=import-outside-toplevel
  return ops.prompt_bucket(int(length), types.SimpleNamespace(
      max_prompt_len=max_prompt, prompt_buckets=tuple(buckets), min_prompt_bucket=16))


def collective_bw(st) -> float:
  return st.ici * st.knobs.collective_bw_share


def replicas_per_prompt(prompts: int, n: int, slots: int, replicas: int) -> float:
  """Mean decode replicas a prompt's n responses land on under the engine's admission
  (free slots in order take the FIFO queue's head): the first fill puts the S / (R n)
  prompts of each replica's S / R slots on that replica alone; later a freed slot sits on
  any replica, so a prompt's n responses meet R (1 − (1 − 1/R)^n) of them on average
  (independent frees: an estimate, not a replay)."""
  if replicas <= 1 or prompts <= 0:
    return 1.0
  first = min(prompts, slots // max(1, n))
  spread = replicas * (1.0 - (1.0 - 1.0 / replicas) ** n)
  return (first + (prompts - first) * spread) / prompts


def engine_prefill(st, prompt_lengths: np.ndarray, tp: int, replicas: int, slots: int = 0,
                   n: int = 1) -> tuple[float, float, float, str]:
  """(seconds, FLOPs per chip, collectives per chip, line) of the engine's prefills of
  `prompt_lengths` (one per prompt) as it runs them (module docstring). With the engine's
  slots and the responses per prompt n, the line also gives what a prefill once per prompt
  per decode replica that decodes its responses would cost (not built:
  `replicas_per_prompt` of the R replicas instead of all of them)."""
  a, k = st.arch, st.knobs
  bk = np.array([bucket_of(p, st.prompt_len, st.prompt_buckets) for p in prompt_lengths])
  flops = sum(sum(step_counts.forward_flops(a, 1, int(b), 1).values()) for b in bk) / tp
  compute = flops / (st.peak * k.mfu)
  ncoll = len(bk) * (2 * a.layers + 2) if tp > 1 else 0
  wire = (2.0 * (tp - 1) / tp) * float(bk.sum()) * 2 * a.layers * a.d * 2 if tp > 1 else 0.0
  comm = ncoll * k.collective_latency_us * 1e-6 + wire / collective_bw(st)
  line = (f"engine prefill as run: {len(bk)} prompts padded to {sorted(set(bk.tolist()))} "
          f"tokens (real mean {np.mean(prompt_lengths):.0f}), each on all {replicas} decode "
          f"replicas: compute {compute:.1f} s + TP collectives {comm:.1f} s "
          f"({ncoll:.0f}, {wire / 1e9:.1f} GB per chip)")
  if replicas > 1 and slots:
    per = replicas_per_prompt(len(bk), n, slots, replicas)
    line += (f"; once per prompt per decode replica that decodes it (not built): "
             f"{per:.1f} of {replicas} replicas per prompt, "
             f"{(compute + comm) * per / replicas:.1f} s")
  return compute + comm, flops, ncoll, line


def host_gap(st, engine, steps: int, live_tokens: float, responses: int,
             decode_s: float = 0.0) -> tuple[float, str]:
  """(seconds, line): the engine's host work per chunk × its chunks (`pod.host_gap`).

  With `engine.overlap` the host works while the next chunk decodes: per chunk only
  max(0, host − device) is exposed, the device's share being decode_s / chunks (decode_s:
  the slowest replica's decode seconds)."""
  from vapo_jax.sampler import paged  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import host_gap as hg  # pylint: disable=import-outside-toplevel
  chunks = math.ceil(steps / max(1, engine.chunk_steps)) if steps > 0 else 0
  if st.knobs.host_chunk_ms is not None:
    per, how = st.knobs.host_chunk_ms * 1e-3, "given (--host_chunk_ms)"
  else:
    max_pages = paged.pages_for(st.prompt_len + st.max_new - 1, engine.page_size)
    per = hg.measure_chunk(
        engine.slots, engine.page_size, max_pages, engine.kv_tokens // engine.page_size,
        engine.replicas, engine.chunk_steps, int(max(1, live_tokens)), st.prompt_len // 4,
        max(0, round(responses / max(1, chunks))), overlap=engine.overlap)
    how = "CPU time of the engine's host loop replayed on this machine"
  secs = hg.gap_seconds(per, steps, engine.chunk_steps)
  head = (f"host gap per decode chunk: {chunks:,} chunks × {per * 1e3:.1f} ms ({how}; "
          f"{engine.slots} slots, mean live KV {live_tokens:,.0f} tokens/slot)")
  if not engine.overlap or not chunks:
    return secs, f"{head} = {secs:.0f} s, chips idle"
  dev = decode_s / chunks
  exposed = hg.exposed_seconds(per, dev, chunks)
  return exposed, (f"{head} = {secs:.0f} s, overlapped with the chunk in flight "
                   f"({dev * 1e3:.0f} ms of device work per chunk): {exposed:.0f} s exposed")


def decode_allreduce_s(st, tp: int) -> float:
  """Seconds per row and decode step of the engine's tensor-parallel all-reduces: two per
  layer (attention output, MLP down projection) of the row's D activations in bf16, a ring
  moving 2 (tp − 1) / tp of each buffer per chip at `collective_bw`:

    2 L · D · 2 bytes · 2 (tp − 1) / tp / collective_bw                 (0 at tp = 1)

  qwen2.5-32b at TP4 with 128 slots per replica and 200 GB/s: 1.26 ms per step. Their
  latency is `Knobs.collective_latency_us` per collective, apart."""
  if tp <= 1:
    return 0.0
  return 2.0 * st.arch.layers * st.arch.d * 2.0 * 2.0 * (tp - 1) / tp / collective_bw(st)


def kernel_block_tokens(engine, max_pages: int) -> int:
  """Tokens per KV block the Pallas kernel reads (0 with the pure-JAX attention)."""
  if engine is None or engine.kernel != "tpu":
    return 0
  ppb = max(d for d in range(1, min(engine.pages_per_block, max_pages) + 1)
            if max_pages % d == 0)
  return ppb * engine.page_size


def queries_per_block() -> int:
  """`tpu_decode_attention`'s default queries per block (the engine passes none)."""
  from vapo_jax.models import paged_attention  # pylint: disable=import-outside-toplevel
  return inspect.signature(paged_attention.tpu_decode_attention).parameters[
      "queries_per_block"].default


def slot_groups(engine, max_pages: int) -> tuple[int, int]:
  """(calls, slots per call) of the Pallas kernel per layer and decode step on one replica
  (`paged_attention.slot_group_of`: its page table in scalar memory)."""
  from vapo_jax.models import paged_attention  # pylint: disable=import-outside-toplevel
  per = engine.slots // max(1, engine.replicas)
  group = paged_attention.slot_group_of(per, max_pages)
  return -(-per // group), group


def kernel_line(st, engine, block_tokens: int, extra_s: float, tp: int,
                max_pages: int = 0) -> str:
  if engine is None:
    return ""
  if not block_tokens:
    return ("decode kernel: pure-JAX paged attention (no Pallas kernel for this model or "
            "platform); KV read at live length")
  a = st.arch
  page_bytes = engine.page_size * 2 * a.k / tp * a.dh * 2
  calls, group = slot_groups(engine, max_pages or 1)
  groups = (f"; {calls} calls of {group} slots per layer and step (a call's page table, "
            f"{group} × {max_pages} int32, in the kernel's scalar memory)" if calls > 1 else "")
  return (f"decode kernel blocks: Pallas ragged paged attention, {block_tokens // engine.page_size}"
          f" pages × {engine.page_size} tokens = {block_tokens} tokens per KV block "
          f"({page_bytes / 1e3:.0f} KB per page DMA per chip), {queries_per_block()} queries "
          f"per block{groups}; KV reads rounded up to whole blocks: +{extra_s:.0f} s; "
          f"bandwidth efficiency {st.knobs.bw_efficiency} assumed (unmeasured)")


def permute_bw(st) -> float:
  """Bytes/s of one collective-permute: `Knobs.permute_bw_share` of the chip's ICI (one
  link, one direction, by default: the hand-written rings send one way)."""
  return st.ici * st.knobs.permute_bw_share


def priced(st, count: float, wire: float, permute_wire: float | None) -> float:
  """Seconds of `count` collectives sending `wire` bytes per chip, `permute_wire` of them by
  collective-permutes: count × latency + (wire − permute) / collective_bw + permute /
  permute_bw. permute_wire None (a file from before it was recorded): every byte at
  permute_bw (at most as fast as the rings of the others)."""
  perm = wire if permute_wire is None else permute_wire
  return (count * st.knobs.collective_latency_us * 1e-6 + (wire - perm) / collective_bw(st)
          + perm / permute_bw(st))


def train_collectives(st, name: str, micro_batches: float, calls: float
                      ) -> tuple[float, float, str]:
  """(exposed seconds, hidden seconds, line) of one train program from the HLO figures
  (--train_collectives; `priced`); (0, 0, "") where the file lacks the program or was
  compiled for another train layout (its tensor shards: `train_hlo.train_tp_of`; the caller
  then counts them from the layout: `layout_collectives`). Hidden: the collectives XLA
  scheduled beside compute; the caller bounds the program's time below by them."""
  from vapo_jax.pod import train_hlo  # pylint: disable=import-outside-toplevel
  path = st.knobs.train_collectives
  if not path:
    return 0.0, 0.0, ""
  figs = _load(path)
  if name not in figs or train_hlo.train_tp_of(path, st.tensor) != st.train_tp:
    return 0.0, 0.0, ""
  sp: train_hlo.Split = figs[name]
  t, c = sp.per_trip, sp.per_call
  exposed = (micro_batches * priced(st, t.exposed, t.exposed_wire, t.exposed_permute_wire)
             + calls * priced(st, c.exposed, c.exposed_wire, c.exposed_permute_wire))
  hidden = (micro_batches * priced(st, t.overlapped, t.overlapped_wire,
                                   t.overlapped_permute_wire)
            + calls * priced(st, c.overlapped, c.overlapped_wire, c.overlapped_permute_wire))
  perm = [x for x in (t.exposed_permute_wire, t.overlapped_permute_wire) if x is not None]
  split = (f"{sum(perm) / 1e9:.0f} GB of them permutes" if len(perm) == 2
           else "permutes not told apart: every byte")
  probes = f", {sp.probes[0]}- and {sp.probes[1]}-layer probes" if sp.probes else ""
  return exposed, hidden, (
      f"{name} collectives from compiled HLO{probes}: {micro_batches:,.0f} micro-batches × "
      f"{t.count:,.0f} sending {(t.exposed_wire + t.overlapped_wire) / 1e9:.1f} GB per chip "
      f"({split} at {permute_bw(st) / 1e9:.0f} GB/s, the rest at "
      f"{collective_bw(st) / 1e9:.0f} GB/s) + {calls:,.0f} calls × {c.count:,.0f}; exposed "
      f"{exposed:.0f} s; hidden by XLA's schedule {hidden:.0f} s")


def layout_collectives(st, name: str, micro: list, update: bool, params: float, *,
                       compute_s: float) -> tuple[float, str]:
  """(exposed seconds, line) of one train program's collectives from its layout, for a
  program not compiled into --train_collectives (`train_layout`'s arithmetic, per program).

  micro: [(n, T)] of its micro-batches (all its calls); W = params of the learner. On the train
  mesh of tp = st.train_tp tensor shards and D = chips / tp batch shards, per micro-batch:
  FSDP all-gathers of the master weights (1 per forward pass; 2 + r per update, r the
  fraction of blocks that recompute their forward: `Arch.full_remat`, selective blocks
  recompute no matmul), a gradient reduce-scatter per update micro-batch (fp32), and
  with tp > 1 the activation all-reduces (2 per layer forward, 4 + 2 r per update). The
  FSDP collectives are taken as overlapped with the layers' compute (XLA's async
  collectives) except one layer's gather per micro-batch pass (the first layer waits for
  it) and any excess over the program's compute; the all-reduces sit between a layer's
  matmuls: exposed. An assumption, not XLA's schedule: `pod.train_hlo` measures that.
  """
  a, k = st.arch, st.knobs
  tp = max(1, st.train_tp)
  d = max(1, st.chips // tp)
  lat, bw = k.collective_latency_us * 1e-6, collective_bw(st)
  shard = (d - 1) / d / tp
  passes = (2 + a.full_remat) if update else 1
  m = len(micro)
  gather = m * passes * params * st.param_bytes * shard
  scatter = m * params * 4.0 * shard if update else 0.0
  fsdp_n = m * (passes + update) * a.layers
  fsdp_s = fsdp_n * lat + (gather + scatter) / bw
  first = m * passes * (params / a.layers * st.param_bytes * shard / bw + lat)
  ar_s, ar_bytes, ar_n = 0.0, 0.0, 0.0
  if tp > 1:
    ring = 2.0 * (tp - 1) / tp
    per_layer = (4 + 2 * a.full_remat) if update else 2
    for n, t in micro:
      ar_bytes += per_layer * a.layers * ring * (n * t / d) * a.d * 2.0
      ar_n += per_layer * a.layers
    ar_s = ar_n * lat + ar_bytes / bw
  exposed = ar_s + first + max(0.0, fsdp_s - first - compute_s)
  mesh = f"FSDP {d} × TP {tp}" if tp > 1 else f"FSDP {d} only"
  tp_part = (f"; TP all-reduces {ar_n:,.0f} ({ar_bytes / 1e9:,.0f} GB), exposed {ar_s:.0f} s"
             if tp > 1 else "")
  return exposed, (
      f"{name} collectives from the layout ({mesh}; not compiled: pod.train_hlo "
      f"--programs={name}): {m} micro-batches × {passes:g} weight gathers"
      f"{' + a gradient reduce-scatter' if update else ''}: {fsdp_n:,.0f} FSDP collectives "
      f"({(gather + scatter) / 1e9:,.0f} GB per chip, {fsdp_s:.0f} s) taken as overlapped "
      f"with {compute_s:.0f} s of compute but the first layer's gather per pass ({first:.0f} "
      f"s){tp_part}; exposed {exposed:.0f} s (assumed, not XLA's schedule)")


_CACHE: dict = {}


def _load(path: str) -> dict:
  from vapo_jax.pod import train_hlo  # pylint: disable=import-outside-toplevel
  if path not in _CACHE:
    _CACHE[path] = train_hlo.load(path)
  return _CACHE[path]


# ------------------------------------------------------------ train layouts (issue 44 item 3)
def train_layout(st, tp: int, resp: np.ndarray, prompts: np.ndarray) -> dict:
  """The train side on a mesh of D = chips / tp batch (FSDP) shards × tp tensor shards,
  analytically (`--compare_layouts`; the trainer's train mesh is today's, mesh.tensor).

  Packed micro-batches: the code's planner with each pass's PackSpec at D shards and the
  same per-device token budget (so t_dev = n T / D tokens per chip per micro-batch, the same
  activations per chip). Per micro-batch and chip, W the learner's parameters, b the master
  weights' bytes (st.param_bytes: gathered as stored, an assumption):
    FSDP all-gathers    g · W b (D − 1) / (D tp), g = 1 per forward pass, fwd + remat fwd +
                        bwd (3; 2 without remat or with selective remat, which recomputes no
                        matmul) per update; L gathers each
    grad reduce-scatter W · 4 (D − 1) / (D tp) per update micro-batch (fp32 gradients)
    TP all-reduces      (tp > 1) per layer 2 per forward, 2 + 2 + 2 per update (with full
                        remat; 4 without or selective), each of t_dev · D_model bf16 bytes,
                        ring wire 2 (tp − 1) / tp times that
  seconds = count · latency + wire bytes / (ICI · collective_bw_share). FSDP collectives can
  overlap the layer's compute (XLA's async collectives; printed as overlappable), the TP
  all-reduces sit between a layer's matmuls (counted as exposed). Memory per chip: both
  TrainStates (as `Setup.resident`), remat checkpoints r L · t_dev · D_model · 2 bytes (r
  the rematerialised fraction of the blocks; the residual stream is not split over tensor)
  plus, per selective block, its kept matmul outputs t_dev · 2 (2 H Dh + 2 K Dh + 2 F) / tp
  (q, the attention output, k, v, gate, up) and the splash kernel's log-sum-exp t_dev · 4 H / tp,
  the kept blocks' activations (1 − r) L · t_dev · 2 (4 D + (2 H Dh + 2 K Dh + 3 F) / tp),
  and one layer's MLP intermediates 3 · t_dev ·
  F · 2 / tp bytes: a lower bound (XLA's buffers are compile_check's to measure).
  Not counted: the LM head's and embedding's own collectives, attention's key / value
  traffic between shards, the optimizer's.
  """
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  a, k = st.arch, st.knobs
  d = max(1, st.chips // tp)
  lat, bw = k.collective_latency_us * 1e-6, collective_bw(st)

  def at(spec):
    return packing.PackSpec.from_budget(spec.tokens_per_device, spec.row_len, d,
                                        spec.row_steps)

  def micro(spec, calls):
    """[(n, T)] of every packed micro-batch of one pass (one per plan's K)."""
    per = len(resp) // calls
    out = []
    for i in range(calls):
      n, kk, t = packing.plan(prompts[i * per:(i + 1) * per], resp[i * per:(i + 1) * per],
                              spec).shape
      out += [(n, t)] * kk
    return out

  fwd = micro(at(st.pack_forward), 1)
  upd = micro(at(st.pack_steps), max(1, st.minibatches)) * st.epochs
  shard = (d - 1) / d / tp
  ring = 2.0 * (tp - 1) / tp if tp > 1 else 0.0
  gathers = 2 + a.full_remat   # blocks that recompute their forward gather once more
  ars = 4 + 2 * a.full_remat
  out = {"tp": tp, "shards": d, "fwd_micro": len(fwd), "upd_micro": len(upd),
         "gather_bytes": 0.0, "scatter_bytes": 0.0, "ar_bytes": 0.0, "fsdp_count": 0.0,
         "ar_count": 0.0}
  learners = [("policy", a.params)] + ([("critic", a.critic_params)] if st.use_critic else [])
  fwd_passes = [w for name, w in learners if name == "critic" or st.old_logprobs_pass]
  for w in fwd_passes:
    out["gather_bytes"] += len(fwd) * w * st.param_bytes * shard
    out["fsdp_count"] += len(fwd) * a.layers
  for _, w in learners:
    out["gather_bytes"] += len(upd) * gathers * w * st.param_bytes * shard
    out["scatter_bytes"] += len(upd) * w * 4.0 * shard
    out["fsdp_count"] += len(upd) * (gathers + 1) * a.layers
  if tp > 1:
    for passes, mbs in ((len(fwd_passes), fwd), (len(learners), upd)):
      per_layer = 2 if mbs is fwd else ars
      for n, t in mbs:
        t_dev = n * t / d
        out["ar_bytes"] += passes * per_layer * a.layers * ring * t_dev * a.d * 2.0
        out["ar_count"] += passes * per_layer * a.layers
  out["fsdp_s"] = (out["fsdp_count"] * lat
                   + (out["gather_bytes"] + out["scatter_bytes"]) / bw)
  out["ar_s"] = out["ar_count"] * lat + out["ar_bytes"] / bw
  t_dev = max(n * t / d for n, t in upd)
  kept_selective = 2.0 * (2 * a.h * a.dh + 2 * a.k * a.dh + 2 * a.f) / tp + 4.0 * a.h / tp
  out["checkpoint_bytes"] = a.layers * t_dev * (a.remat * a.d * 2.0
                                                + a.selective * kept_selective)
  # A kept block (model.remat_layers < L) holds its activations for the backward: at least
  # x, both norms' inputs and outputs (4 D), q, k, v and the attention output, the MLP's
  # gate, up and product, bf16.
  kept = 2.0 * (4 * a.d + (2 * a.h * a.dh + 2 * a.k * a.dh + 3 * a.f) / tp)
  out["kept_bytes"] = (1.0 - a.remat) * a.layers * t_dev * kept
  out["mlp_bytes"] = 3.0 * t_dev * a.f * 2.0 / tp
  out["memory_bytes"] = (st.resident + out["checkpoint_bytes"] + out["kept_bytes"]
                         + out["mlp_bytes"])
  return out


def layout_line(st, lay: dict, compute_s: float) -> str:
  """One line of `train_layout` figures; compute_s: the train programs' matmul + attention
  seconds (the same per chip in every layout: an ideal split)."""
  tp, d = lay["tp"], lay["shards"]
  name = f"FSDP {d} × TP {tp}" if tp > 1 else f"FSDP {d} only"
  return (f"{name}: {lay['fwd_micro']} forward / {lay['upd_micro']} update micro-batches; "
          f"per chip per step FSDP gathers {lay['gather_bytes'] / 1e12:.2f} TB + gradient "
          f"reduce-scatters {lay['scatter_bytes'] / 1e12:.2f} TB = {lay['fsdp_s']:.0f} s "
          f"(overlappable), TP all-reduces {lay['ar_bytes'] / 1e12:.2f} TB = "
          f"{lay['ar_s']:.0f} s (exposed); memory ≥ {lay['memory_bytes'] / 1e9:.1f} GB per "
          f"chip (states {st.resident / 1e9:.1f}, remat checkpoints "
          f"{lay['checkpoint_bytes'] / 1e9:.1f}, kept blocks' activations "
          f"{lay['kept_bytes'] / 1e9:.1f}, one layer's MLP "
          f"{lay['mlp_bytes'] / 1e9:.1f}); train time {compute_s:.0f} s compute + "
          f"{lay['ar_s']:.0f} s exposed = {compute_s + lay['ar_s']:.0f} s "
          f"({compute_s + lay['ar_s'] + lay['fsdp_s']:.0f} s if nothing overlaps)")


NOT_COUNTED = ("not counted: the page-table upload, chunk dispatch and device_get per chunk; "
               "one `insert` per response; evictions and a chunk's early exits (more chunks); "
               "the reshard's and the optimizer's collectives beyond the HLO's; checkpoints; "
               "the compile (its own line, once per run); every efficiency (HFU, bandwidth, "
               "latency) is assumed, none measured")
