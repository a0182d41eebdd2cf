"""One RL step on a TPU slice, counted from the code's shapes: FLOPs, HBM bytes, collectives,
time at stated efficiencies, and the step's physical floor beside it.

  python -m vapo_jax.tools.step_model --config=configs/qwen32b.py --topology=v5p-128 \
      --arch=qwen2.5-32b --lengths=review --prompt_lengths=uniform:80,400 \
      --train_collectives=benchmarks/results/train_collectives_qwen32b_v5p-128.json
  ... --train=padded --rollout=static            # the code paths before packing / the engine
  ... --lengths=/run/metrics.jsonl               # a run's logged length quantiles

The code paths follow the config (rl.packing: packed train rows; sampling.engine: the
continuous engine of `sampler/continuous.py`, or the static sampler of `sampler/static.py`);
`--train` / `--rollout=static|continuous` override them.

Everything is per chip and analytic (no compile; `decode_hlo` gives the collectives of the
compiled decode loop, `--decode_collectives` takes its count). The FLOP counts are in
`step_counts`. Notation: L layers, D width,
F MLP width, H query / K kv heads of Dh, V vocabulary (padded embedding rows included), N
parameters, P = data.max_prompt_tokens, R = sampling.max_new_tokens, C = attention_block.

FLOPs (2 per multiply-add):
  matmul per token   m = 2 L (D Dh (H + 2K) + H Dh D + 3 D F)      (+ 2 D V for the LM head)
  attention          a = 4 L H Dh per (query, key) pair computed    (q·k and p·v)
  pairs              exactly what the kernels compute (`attention_pairs`): blocked causal =
                     per query group [a, e) of `attention._query_groups`, (e − a) · ⌈e/C⌉ C;
                     causal dense = per `causal_query_blocks` block (e − a) · e; decode = W
                     keys per row at window W
  train pass         fwd + remat fwd + bwd: 4 m − down per token (the recompute's last
                     matmul, the MLP down projection 2 L D F, is dead: XLA drops it),
                     4.5 a per pair (bwd 2.5 a:
                     `attention._backward` has five pair products), LM head 4× (checkpointed
                     chunks of 128 positions over the R response positions)
Time of a program = its matmul FLOPs / (peak · MFU) + max(attention FLOPs / (peak · MFU),
attention score bytes / (BW · bw_eff)) for the train side (the pure-JAX blocked scan writes
its [B, K, G, T, C] float32 scores to HBM: `--attn_score_bytes` per (pair, head) forward;
where model.attention_kernel runs jax's Pallas splash kernel on the TPU slice, `train_kernel`,
the pairs are its per-row live blocks × c² (`step_counts.splash_pairs`), 5.5 a per pair in
an update with remat, and its bytes the key / value blocks it reads, 4 Dh / c per pair and
head), and per decode step max(FLOPs / (peak · MFU), bytes / (BW · bw_eff)) + collectives ·
latency. `--compare_layouts` also prints the packed train side on FSDP × tensor and
FSDP-only meshes (`step_terms.train_layout`).

Padded and static (`--train=padded --rollout=static`): every train row is P + R tokens; the
rollout is B / (prompts_per_call · n) sampler calls, each a prefill of P-token prompts and
the windowed while loops of `sampler.static._generate` (`ops.decode_windows`), which stop
at the call's longest row (steps t = 1 .. max ℓ − 1); each step reads the weight shards in place
(`--decode_weights=stationary`: the TPU compile shows no weight gather in the loop, and XLA
hoists the fp32 -> bf16 casts out of it, so (N − untied embedding) · 2 / chips bytes,
`--decode_weight_itemsize`; `gathered` adds a per-step gather of N · 4 / tensor) and the
whole window W of the cache for every row.
Alternatives: `--train=packed` (the code's planner, `packing.plan`, on the sampled lengths
with each pass's PackSpec as the trainer builds it: rows of rl.packing_row_tokens, K packed
micro-batches of n rows from the token budget, each computed whole: n K T tokens, the LM head
at every slot, and the attention key blocks `attention._live_blocks` keeps for that layout,
`step_counts.packed_pairs`), `--rollout=continuous` (continuous batching, bf16 decode weights, KV
read at live lengths, slots refilled FIFO while the live KV fits; one bf16 reshard per step).
Its layout, `--engine_layout`: `built` (default) is `sampler/continuous.py` as it is: decode
replicas of mesh.tensor chips (one per data x fsdp shard, `EngineConfig.replicas`), each with
S / R of the slots and its own part of the pool, heads split over mesh.tensor, the slots,
pages and pool of the run's own `EngineConfig` (`Setup.engine`: sampling.slots / page_size /
chunk_steps, the pool sized by `sampler.kv_pool` from HBM less the train state); `replicas`
is what replicas of `--engine_tp` chips would buy, each with no slot limit and a KV budget
of HBM less train state, weights and `--workspace_gb`.

Floor: real tokens only, exact causal attention per sequence (T (T+1) / 2 pairs), no remat
(fwd 1, bwd 2 matmul, 2.5 attention), LM head on response tokens, at `--mfu_ceiling`; rollout
as the engine with 100 % bandwidth, no collective latency, compute at peak.

Terms a real step pays beyond FLOPs and bytes (`step_terms`, each printed on its own line):
the engine's prefill as it runs, the host gap per decode chunk, the Pallas decode kernel's
KV blocks, the train programs' collectives: from compiled HLO where `--train_collectives`
has the program (for the config's mesh.train_layout), else from the train layout's
arithmetic (`step_terms.layout_collectives`: FSDP gathers and reduce-scatters taken as
overlapped with compute, tensor-parallel all-reduces exposed). What is still not counted
is printed as the report's last line (`step_terms.NOT_COUNTED`).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import types

import numpy as np

from vapo_jax.tools import step_counts
from vapo_jax.tools import step_terms

GB = 1e9


# ---------------------------------------------------------------------------- the setup
@dataclasses.dataclass(frozen=True)
class Knobs:
  """Stated efficiencies and switches (each a flag of the CLI, each printed)."""
  mfu: float = 0.4                   # train and prefill matmuls
  bw_efficiency: float = 0.7         # HBM bandwidth reached
  collective_latency_us: float = 7.0  # per collective in a decode step
  mfu_ceiling: float = 0.5           # the floor's train MFU
  attn_score_bytes: float = 16.0     # HBM bytes per (pair, head) of a blocked fwd (bwd 2.5×)
  decode_collectives: float | None = None  # per decode step; None: 9 L + 4
  decode_collective_bytes: float = 0.0  # per decode step and chip, over ICI (decode_hlo)
  decode_weights: str = "stationary"  # or "gathered" (FSDP weights all-gathered per step)
  # Bytes per weight a decode step reads: XLA hoists the fp32 -> bf16 casts of the stationary
  # weight shards out of the decode loop (its carry holds bf16 shards: `decode_hlo`), so 2.
  decode_weight_itemsize: float = 2.0
  # The code paths; None: as the config says (Setup.of: rl.packing -> "packed" else
  # "padded"; sampling.engine "continuous" (sampler/continuous.py) or "static"
  # (sampler/static.py)). A Setup built by hand with None runs padded / static.
  train: str | None = None           # "padded" | "packed"
  rollout: str | None = None         # "static" | "continuous"
  # The train passes' self-attention kernel; None: as model.attention_kernel picks it on
  # the TPU slice (`train_kernel`: "auto" -> jax's Pallas splash kernel where it takes one
  # shard's heads). "splash" | "jax" override it.
  train_attention: str | None = None
  engine_tp: int = 4
  engine_layout: str = "built"       # or "replicas" (see the module docstring)
  workspace_gb: float = 5.0          # per chip, kept free by the engine besides weights
  headroom: float = 0.05
  engine_admit: float = 0.9          # admit while live KV < this share of the KV budget
  # Host work per decode chunk of the built engine, ms; None: measured on this CPU at the
  # engine's sizes (`tools.host_gap`).
  host_chunk_ms: float | None = None
  # The train programs' collectives from compiled HLO (`tools.train_hlo --json`); None:
  # not counted (the report says so).
  train_collectives: str | None = None
  # Share of a chip's ICI a collective gets (a ring over one torus axis: 2 of 6 links).
  collective_bw_share: float = 1.0 / 3.0
  # Also print the packed train side on FSDP × tensor (mesh.tensor) and FSDP-only meshes
  # (`step_terms.train_layout`; the estimate stays the config's).
  compare_layouts: bool = False


@dataclasses.dataclass(frozen=True)
class Setup:
  arch: step_counts.Arch
  chips: int
  tensor: int
  peak: float                 # bf16 FLOP/s per chip
  bw: float                   # HBM bytes/s per chip
  hbm: float                  # bytes per chip
  ici: float                  # ICI bytes/s per chip
  rows: int                   # B
  n: int                      # responses per prompt
  prompt_len: int             # P
  max_new: int                # R
  per_call: int               # prompts per sampler call
  windows: tuple              # ops.decode_windows(P, ...)
  epochs: int
  use_critic: bool
  param_bytes: int            # itemsize of the master weights
  eval_rows: int              # per evaluation
  eval_per_call: int          # rows per eval sampler call
  eval_every: int
  knobs: Knobs = Knobs()
  minibatches: int = 1
  eval_n: int = 1             # samples per evaluation problem
  engine: "EngineShape | None" = None      # the rollout engine as built (--engine_layout)
  eval_engine: "EngineShape | None" = None
  # --train=packed: the PackSpecs of the policy / critic steps and of the old-log-prob /
  # value forwards, as `run.learners.pass_spec` builds them (batch shards = chips / tensor).
  pack_steps: object = None
  pack_forward: object = None
  # The engine's prompt buckets, as `run.parts.build_sampler` builds its SamplingConfig
  # ((data.max_prompt_tokens,): every prompt padded to P); () = powers of two.
  prompt_buckets: tuple = ()
  micro_rows: int = 0         # rows per padded micro-batch of an update (0: a mini-batch)
  # The old-log-prob forward runs (Config.old_logprobs "recompute"); "exact" / "behaviour"
  # save it: no `logprobs` program in the estimate or the floor.
  old_logprobs_pass: bool = True
  # Tensor shards of the train passes (config.mesh.train_layout: mesh.tensor when "shared",
  # 1 when "fsdp"); 0: `tensor`, as the decode replicas.
  train_tensor: int = 0

  @property
  def train_tp(self) -> int:
    return self.train_tensor or self.tensor

  @classmethod
  def of(cls, cfg, mcfg, s, knobs: Knobs = Knobs(), engines: dict | None = None
         ) -> "Setup":
    """engines: {"rollout", "eval": EngineShape} of the built engines (compile_check passes
    its plan's); default `engine_shapes`, sized from the slice's HBM the run's way."""
    from vapo_jax.sampler import ops  # pylint: disable=import-outside-toplevel
    p, r = cfg.data.max_prompt_tokens, cfg.sampling.max_new_tokens
    wins = ops.decode_windows(p, types.SimpleNamespace(max_new_tokens=r,
                                                       decode_windows=cfg.sampling.decode_windows))
    n = cfg.responses_per_prompt
    per_call = cfg.sampling.prompts_per_call or cfg.prompts_per_step
    ev = cfg.eval
    eval_rows = ev.num_examples * ev.samples_per_problem if ev.every else 0
    from vapo_jax import packing  # pylint: disable=import-outside-toplevel
    rows, micro = cfg.prompts_per_step * n, cfg.rl.micro_batch_size
    train_tp = 1 if cfg.mesh.train_layout == "fsdp" else max(1, cfg.mesh.tensor)
    shards = max(1, s.chips // train_tp)
    spec = lambda per_micro, pass_rows: packing.spec_for(  # noqa: E731
        p + r, per_micro, shards, cfg.rl.packing_row_tokens, cfg.rl.packing_tokens_per_device,
        cfg.rl.packing_row_steps, pass_rows)
    knobs = dataclasses.replace(
        knobs, train=knobs.train or ("packed" if cfg.rl.packing else "padded"),
        rollout=knobs.rollout or ("continuous" if cfg.sampling.engine == "continuous"
                                  else "static"))
    kernel = knobs.train_attention or train_kernel(mcfg, train_tp)
    knobs = dataclasses.replace(knobs, train_attention=kernel)
    arch = dataclasses.replace(step_counts.Arch.of(mcfg), kernel=kernel)
    st = cls(arch, s.chips, cfg.mesh.tensor, s.gen.bf16_flops,
             s.gen.hbm_bandwidth, s.gen.hbm_bytes, s.gen.ici_bandwidth, rows, n, p, r,
             per_call, wins, cfg.rl.ppo_epochs, cfg.uses_critic,
             np.dtype(mcfg.param_dtype).itemsize, eval_rows,
             ev.batch_prompts * ev.samples_per_problem, max(1, ev.every or 1), knobs,
             cfg.rl.num_minibatches, ev.samples_per_problem,
             pack_steps=spec(micro or rows // cfg.rl.num_minibatches,
                             rows // cfg.rl.num_minibatches),
             pack_forward=spec(micro or rows, rows),
             prompt_buckets=(ops.power_buckets(p, cfg.sampling.prompt_bucket_min)
                             if cfg.sampling.engine == "continuous" else (p,)),
             micro_rows=micro or rows // cfg.rl.num_minibatches,
             old_logprobs_pass=cfg.old_logprobs == "recompute", train_tensor=train_tp)
    engines = engines or engine_shapes(cfg, mcfg, st)
    return dataclasses.replace(st, engine=engines["rollout"], eval_engine=engines["eval"])

  @property
  def resident(self) -> float:
    """Both TrainStates per chip (fp32 params + two Adam moments)."""
    return 3.0 * self.param_bytes * (self.arch.params + self.use_critic
                                     * self.arch.critic_params) / self.chips


@dataclasses.dataclass(frozen=True)
class EngineShape:
  """The sizes of a built rollout engine (`continuous.EngineConfig`)."""
  slots: int
  page_size: int
  kv_tokens: int              # the pool: whole pages (all replicas)
  chunk_steps: int
  replicas: int = 1           # decode replicas: each S / R slots and kv_tokens / R
  kernel: str = "jax"         # decode attention: "tpu" (jax's Pallas kernel) or "jax"
  pages_per_block: int = 8    # EngineConfig.pages_per_block
  overlap: bool = True        # EngineConfig.overlap: the host works while a chunk runs

  @classmethod
  def of(cls, ecfg) -> "EngineShape":
    return cls(ecfg.slots, ecfg.page_size, ecfg.num_pages * ecfg.page_size, ecfg.chunk_steps,
               ecfg.replicas, ecfg.kernel, ecfg.pages_per_block, ecfg.overlap)


def engine_shapes(cfg, mcfg, st: "Setup") -> dict:
  """The engines `run.parts.build_sampler` builds, analytically (no mesh, no compile): slots
  as there (sampling.slots, else the static sampler's rows), the pool by `sampler.kv_pool`
  from the chip's HBM less the train state (`Setup.resident`, the reference, the rollout
  batch and the decode copy, counted from the architecture; compile_check passes the built
  engines' own shapes instead)."""
  from vapo_jax.sampler import kv_pool  # pylint: disable=import-outside-toplevel
  sm, a = cfg.sampling, st.arch
  shards = st.tensor if (2 * mcfg.num_kv_heads) % st.tensor == 0 else 1
  tok_b = kv_pool.token_bytes(mcfg, mcfg.dtype) / shards
  ref = cfg.rl.kl_coef > 0
  batch = st.rows * (st.prompt_len + st.max_new) * 8 + st.rows * st.max_new * 4 * (5 + ref)
  dtype = mcfg.dtype if sm.decode_dtype == "auto" else sm.decode_dtype
  copy = a.params * np.dtype(dtype).itemsize / st.tensor
  resident = (st.resident + ref * a.params * st.param_bytes / st.chips
              + batch / st.chips + copy)
  mem = kv_pool.Memory(st.hbm, resident, sm.kv_headroom)
  out = {}
  for key, rows in (("rollout", st.rows),
                    ("eval", cfg.eval.batch_prompts * cfg.eval.samples_per_problem)):
    slots = sm.slots or rows
    # run.parts.decode_replicas: the batch shards, if they divide the slots and the tensor
    # axis splits the kv heads whole.
    reps = max(1, st.chips // st.tensor)
    if slots % reps or mcfg.num_kv_heads % shards:
      reps = 1
    try:
      pool = kv_pool.size(slots=slots, page_size=sm.page_size,
                          whole_tokens=st.prompt_len + st.max_new - 1, token_bytes_=tok_b,
                          memory=mem, explicit=sm.kv_tokens, replicas=reps)
    except ValueError:  # no room for one response: `estimate` says so if it needs the engine
      out[key] = None
      continue
    pages = -(-(st.prompt_len + st.max_new - 1) // sm.page_size)
    out[key] = EngineShape(slots, sm.page_size, pool.tokens, sm.chunk_steps, reps,
                           _kernel(sm.attention_kernel, mcfg, shards, sm.page_size,
                                   (slots // reps, pages)),
                           overlap=sm.overlap)
  return out


def train_kernel(mcfg, tp: int) -> str:
  """The train passes' self-attention kernel on a TPU slice, analytically, as
  `splash_attention.choose` picks it in `layers.Attention`: "jax" when
  model.attention_kernel is "jax", when the q and kv heads do not split alike over
  mesh.tensor, or when jax's splash kernel refuses one shard's heads
  (`splash_attention.refusal`, traced for TPU on abstract arrays); else "splash"."""
  if mcfg.attention_kernel == "jax":
    return "jax"
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  h, k = mcfg.num_heads, mcfg.num_kv_heads
  if (h % tp == 0) != (k % tp == 0):
    return "jax"
  split = tp if h % tp == 0 else 1
  why = splash_attention.refusal(h // split, k // split, mcfg.head_dim, mcfg.dtype,
                                 block=mcfg.attention_block, target="tpu")
  return "jax" if why else "splash"


def _kernel(want: str, mcfg, tp: int, page_size: int, table: tuple[int, int] | None = None
            ) -> str:
  """`continuous.attention_kernel` on a TPU slice, analytically: "tpu" unless "jax" is asked
  for or jax's Pallas kernel refuses one shard's shapes (`paged_attention.tpu_kernel_refusal`)."""
  if want == "jax":
    return "jax"
  from vapo_jax.models import paged_attention  # pylint: disable=import-outside-toplevel
  k2, h = 2 * mcfg.num_kv_heads, mcfg.num_heads
  if k2 % tp or (k2 // tp) % 2 or h % tp:
    return "jax"
  why = paged_attention.tpu_kernel_refusal(h // tp, k2 // tp // 2, mcfg.head_dim, mcfg.dtype,
                                           page_size)
  if table is not None and not why:
    why = paged_attention.table_refusal(*table)
  return "jax" if why else "tpu"


@dataclasses.dataclass
class Program:
  """One program's figures per chip for one RL step (all its calls)."""
  name: str
  flops: float = 0.0
  hbm_bytes: float = 0.0
  collectives: float = 0.0
  ici_bytes: float = 0.0
  terms: dict = dataclasses.field(default_factory=dict)   # seconds by cause
  note: str = ""
  steps: int = 0              # decode steps (the engine simulation's slowest replica)
  lines: list = dataclasses.field(default_factory=list)  # the step_terms, one line each

  @property
  def time(self) -> float:
    return sum(self.terms.values())


# ---------------------------------------------------------------------------- train side
def _train_program(st: Setup, name: str, rows_t: list[tuple[int, int, float, float]],
                   critic: bool, train: bool, floor: bool) -> Program:
  """rows_t: [(count, T, pairs per row, head positions per row)]."""
  a, k = st.arch, st.knobs
  mfu = k.mfu_ceiling if floor else k.mfu
  splash = a.kernel == "splash" and not floor
  fac = (step_counts.train_factors(0.0 if floor else a.remat, "splash" if splash else "jax")
         if train else {"matmul": 1.0, "attention": 1.0, "head": 1.0})
  if floor and train:
    fac = {"matmul": 3.0, "attention": 3.5, "head": 3.0}
  tokens = sum(c * t for c, t, _, _ in rows_t)
  mm = tokens * a.matmul * fac["matmul"]
  if train and a.remat and not floor:
    mm -= tokens * a.down * a.remat
  at = sum(c * pr for c, _, pr, _ in rows_t) * a.pair * fac["attention"]
  hd = sum(c * hp for c, _, _, hp in rows_t) * (2.0 * a.d if critic else a.head) * fac["head"]
  chips, rate = st.chips, st.peak * mfu
  # HBM bytes per (pair, head): the pure-JAX scan's f32 scores (--attn_score_bytes), or the
  # splash kernel's key / value block reads (its scores stay on chip).
  per_pair = ((lambda t: a.splash_score_bytes(t)) if splash
              else (lambda t: k.attn_score_bytes))
  score_bytes = 0.0 if floor else (sum(c * pr * per_pair(t) for c, t, pr, _ in rows_t)
                                   * a.layers * a.h * fac["attention"])
  weights = (a.critic_params if critic else a.params) * 2.0 / st.train_tp
  prog = Program(name, (mm + at + hd) / chips, score_bytes / chips + weights)
  prog.terms = {"matmul": (mm + hd) / chips / rate,
                "attention": max(at / chips / rate,
                                 score_bytes / chips / (st.bw * k.bw_efficiency))}
  if score_bytes / chips / (st.bw * k.bw_efficiency) > at / chips / rate:
    prog.note = ("attention bound by its HBM " + ("key / value block reads" if splash
                                                  else "score traffic"))
  return prog


def attention_line(st: Setup, rows_t: list, seq: np.ndarray) -> str:
  """What a train pass's attention and rows compute against the exact work: its kernel,
  pairs / Σ n (n + 1) / 2 of the real sequences, real / computed tokens, row lengths."""
  a = st.arch
  if a.kernel == "splash":
    kind = "jax's Pallas splash kernel (block tables per row, no score traffic)"
  elif a.uses_blocked(st.prompt_len + st.max_new, st.prompt_len + st.max_new):
    kind = (f"the pure-JAX blocked scan (C = {a.block}; key blocks skipped per micro-batch; "
            f"f32 scores through HBM, {st.knobs.attn_score_bytes:g} B per pair and head)")
  else:
    kind = "the pure-JAX dense path"
  seq = np.asarray(seq, np.float64)
  exact = float((seq * (seq + 1) / 2).sum())
  pairs = sum(c * pr for c, _, pr, _ in rows_t)
  tokens = sum(c * t for c, t, _, _ in rows_t)
  lens = sorted({t for _, t, _, _ in rows_t})
  return (f"attention: {kind}: {pairs / exact:.2f}× the exact causal pairs per pass; "
          f"{seq.sum() / tokens:.1%} of its {tokens / 1e6:.1f}M computed tokens real; "
          f"rows of {', '.join(str(t) for t in lens)}")


def head_positions(plan, micro: int, chunk: int = 128) -> float:
  """Per row, the LM head's positions in packed micro-batch `micro`: each shard runs the
  chunks up to the shard with the most response tokens (`policy.packed_logprobs`)."""
  d = plan.shards
  per_shard = plan.rows // d
  here = (plan.micro_B == micro) & (plan.response_B > 0)
  counts = np.bincount(plan.row_B[here] // per_shard, plan.response_B[here], minlength=d)
  return float(-(-int(counts.max(initial=0)) // chunk) * chunk) / per_shard


def packed_groups(st: Setup, spec, prompts: np.ndarray, resp: np.ndarray, calls: int = 1
                  ) -> list[tuple[int, int, float, float]]:
  """The `_train_program` rows of a packed pass run on `calls` equal slices of the batch:
  each slice planned by the code's own planner (`packing.plan` with the pass's PackSpec),
  per packed micro-batch (n rows of T, the attention pairs `step_counts.packed_pairs` gives
  for its layout, the LM head at the response slots: `policy.packed_logprobs` projects each
  shard's response tokens rounded up to a chunk, `head_positions` per row)."""
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  out = []
  per = len(resp) // calls
  for i in range(calls):
    plan = packing.plan(prompts[i * per:(i + 1) * per], resp[i * per:(i + 1) * per], spec)
    n, k, t = plan.shape
    segs = packing.row_segments(plan)
    for mk in range(k):
      pairs = step_counts.packed_pairs(st.arch, [segs.get((mk, r), []) for r in range(n)], t)
      out.append((n, t, pairs / n, head_positions(plan, mk)))
  return out


def train_side(st: Setup, resp: np.ndarray, prompts: np.ndarray, floor: bool = False
               ) -> list[Program]:
  """logprobs (unless st.old_logprobs_pass is off), values, policy_step (all mini-batches ×
  epochs), critic_step."""
  a, k = st.arch, st.knobs
  t_row = st.prompt_len + st.max_new
  if floor:
    seq = prompts + resp
    groups = [(1, int(t), t * (t + 1) / 2.0, int(r)) for t, r in zip(seq, resp)]
  elif k.train == "packed":
    groups = packed_groups(st, st.pack_forward, prompts, resp)
    steps = packed_groups(st, st.pack_steps, prompts, resp, max(1, st.minibatches))
  elif a.kernel == "splash":
    # Padded rows on the splash kernel: per row its one segment [P − p_b, P + l_b).
    head = step_counts.padded_head_positions(st.max_new)
    count: dict[float, int] = {}
    for p_b, l_b in zip(prompts, resp):
      pr = step_counts.splash_pairs(a, [(st.prompt_len - int(p_b), int(p_b + l_b))], t_row)
      count[pr] = count.get(pr, 0) + 1
    groups = [(c, t_row, pr, head) for pr, c in sorted(count.items())]
  else:
    pr = step_counts.attention_pairs(a, t_row, t_row, causal=True)
    groups = [(st.rows, t_row, pr, step_counts.padded_head_positions(st.max_new))]
  if floor or k.train != "packed":
    steps = groups
  progs = ([_train_program(st, "logprobs", groups, False, False, floor)]
           if st.old_logprobs_pass else [])
  if st.use_critic:
    progs.append(_train_program(st, "values", groups, True, False, floor))
  ep = [(c * st.epochs, t, pr, hp) for c, t, pr, hp in steps]
  progs.append(_train_program(st, "policy_step", ep, False, True, floor))
  if st.use_critic:
    progs.append(_train_program(st, "critic_step", ep, True, True, floor))
  if floor:
    return progs
  for prog in progs:
    prog.lines.append(attention_line(st, steps if prog.name.endswith("_step") else groups,
                                     prompts + resp))
  # The micro-batches [(n rows, T)] and calls of each program per step, for its collectives.
  if k.train == "packed":  # one per packed micro-batch
    mbs = {"fwd": [(c, t) for c, t, _, _ in groups],
           "upd": [(c, t) for c, t, _, _ in steps] * st.epochs}
  else:
    per = max(1, st.micro_rows or st.rows // max(1, st.minibatches))
    mbs = {"fwd": [(per, t_row)] * -(-st.rows // per),
           "upd": [(per, t_row)] * (-(-st.rows // per) * st.epochs)}
  fwd_micro, upd_micro = len(mbs["fwd"]), len(mbs["upd"])
  upd_calls = max(1, st.minibatches) * st.epochs
  for prog in progs:
    update = prog.name.endswith("_step")
    secs, line = step_terms.train_collectives(
        st, prog.name, upd_micro if update else fwd_micro, upd_calls if update else 1)
    if not line:  # not compiled: counted from the layout (`step_terms.layout_collectives`)
      secs, line = step_terms.layout_collectives(
          st, prog.name, mbs["upd" if update else "fwd"], update,
          a.critic_params if prog.name.startswith(("critic", "values")) else a.params,
          compute_s=sum(prog.terms.values()))
    if line:
      prog.terms["collectives"] = secs
      prog.lines.append(line)
  return progs


# ---------------------------------------------------------------------------- rollout
def _decode_collectives(st: Setup) -> float:
  k = st.knobs
  return k.decode_collectives if k.decode_collectives is not None else 9.0 * st.arch.layers + 4


def static_rollout(st: Setup, resp: np.ndarray, name: str = "rollout",
                   rows_per_call: int | None = None, n: int | None = None) -> Program:
  """Today's sampler: sequential calls, each prefill + windowed loops to its longest row
  (n responses per prompt: the prefill runs once per prompt)."""
  a, k = st.arch, st.knobs
  n = n or st.n
  b = rows_per_call or st.per_call * n
  calls = -(-len(resp) // b)
  kvb = a.kv_bytes()
  # Weights read per step, in place; an untied embedding is only looked up (B rows).
  w_bytes = a.decode_weights * k.decode_weight_itemsize / st.chips
  gathered = a.params * st.param_bytes / st.tensor if k.decode_weights == "gathered" else 0.0
  ncoll = _decode_collectives(st)
  lat = ncoll * k.collective_latency_us * 1e-6 + k.decode_collective_bytes / st.ici
  eff_bw = st.bw * k.bw_efficiency
  terms = {"decode weights": 0.0, "decode KV": 0.0, "decode logits": 0.0, "decode compute": 0.0,
           "decode latency": 0.0, "window copies": 0.0, "prefill": 0.0}
  prog = Program(name)
  steps_total = 0
  for ci in range(calls):
    lmax = int(resp[ci * b:(ci + 1) * b].max())
    # Prefill of the call's prompts (P padded slots), causal, one head position each.
    bp = max(1, b // n)
    pf = step_counts.forward_flops(a, bp, st.prompt_len, 1)
    pf_flops = sum(pf.values()) / st.chips
    terms["prefill"] += pf_flops / (st.peak * k.mfu) + b * st.prompt_len * kvb / st.chips / eff_bw
    prog.flops += pf_flops
    for t0, t1, w in st.windows:
      steps = max(0, min(t1, lmax) - t0)
      copy = 4.0 * b * w * kvb / st.chips                  # cut + write back, read + write
      terms["window copies"] += copy / eff_bw
      prog.hbm_bytes += copy
      if not steps:
        continue
      steps_total += steps
      kv = b * w * kvb / st.chips
      logits = 4.0 * b * a.vocab * 4 / st.tensor
      byts = w_bytes + gathered + kv + logits
      fl = step_counts.decode_step_flops(a, b, w) / st.chips
      t_mem, t_cmp = byts / eff_bw, fl / (st.peak * k.mfu)
      if t_mem >= t_cmp:
        terms["decode weights"] += steps * (w_bytes + gathered) / eff_bw
        terms["decode KV"] += steps * kv / eff_bw
        terms["decode logits"] += steps * logits / eff_bw
      else:
        terms["decode compute"] += steps * t_cmp
      terms["decode latency"] += steps * (lat + gathered / st.ici)
      prog.flops += steps * fl
      prog.hbm_bytes += steps * byts
      prog.collectives += steps * ncoll
      prog.ici_bytes += steps * gathered
  prog.terms = terms
  prog.note = (f"{calls} calls × {b} rows, {steps_total} decode steps "
               f"({steps_total / max(calls, 1):.0f} per call), token efficiency "
               f"{resp.sum() / max(b * steps_total, 1):.1%}, {ncoll:.0f} collectives/step")
  return prog


def kv_budget(st: Setup, tp: int) -> float:
  """KV bytes per chip the engine may fill: HBM less headroom, train state, bf16 weights and
  workspace."""
  k = st.knobs
  return ((1 - k.headroom) * st.hbm - st.resident - 2.0 * st.arch.params / tp
          - k.workspace_gb * GB)


def _interval_cost(m: int, x0: float, n: int, a_: float, b_: float, g: float) -> float:
  """Σ_{j<m} max(a_ + b_ (x0 + n j), g): m steps with x0 + n j live tokens."""
  if m <= 0:
    return 0.0
  if b_ * n > 0:
    kstar = min(m, max(0, math.ceil((g - a_ - b_ * x0) / (b_ * n))))
  else:
    kstar = m if a_ + b_ * x0 < g else 0
  rest = m - kstar
  lin = rest * (a_ + b_ * x0) + b_ * n * (kstar * rest + rest * (rest - 1) / 2.0)
  return kstar * g + lin


def continuous_rollout(st: Setup, resp: np.ndarray, prompts: np.ndarray, floor: bool,
                       name: str = "rollout", n: int | None = None,
                       engine: EngineShape | None = None) -> Program:
  """Continuous batching on replicas of tp chips: event-driven, step cost linear in live KV.

  Per replica (sequences dealt round robin, admitted FIFO while live KV tokens < the cap
  and fewer than `slots` are live): a step with n live sequences holding X tokens costs
  max((weights + X kv_bytes / tp) / BW', n (m + head) / tp / (peak · mfu')) + latency.
  The rollout ends with the slowest replica. A response of ℓ tokens is ℓ steps (its first
  token comes from the prefill: one fewer decode step in fact, as compile_check counts).

  engine (with `--engine_layout=built`, never for the floor): the engine as built, its
  `replicas` of tp = Setup.tensor chips (heads over mesh.tensor), each with slots / replicas
  slots and kv_tokens / replicas as the cap. Otherwise replicas of `--engine_tp` chips, no
  slot limit, a cap of admit · kv_budget · tp / kv_bytes tokens.
  """
  a, k = st.arch, st.knobs
  n = n or st.n                  # responses per prompt: one prefill per prompt
  kvb = a.kv_bytes()
  if engine is not None and not floor:
    reps = engine.replicas
    tp, cap, max_live = st.tensor, engine.kv_tokens / reps, engine.slots // reps
  else:
    tp = k.engine_tp
    reps, max_live = max(1, st.chips // tp), None
    cap = k.engine_admit * kv_budget(st, tp) * tp / kvb
  bw = st.bw * (1.0 if floor else k.bw_efficiency)
  rate = st.peak * (1.0 if floor else k.mfu)
  w = 2.0 * a.decode_weights / tp   # bf16 copy; an untied embedding is only looked up
  a_, b_ = w / bw, kvb / tp / bw
  per_tok = (a.matmul + a.head) / tp / rate
  lat = 0.0 if floor else (2.0 * a.layers + 2) * k.collective_latency_us * 1e-6
  # The engine as built: its prefill as it runs (every prompt at its bucket, on every
  # replica: `step_terms.engine_prefill`) instead of real prompt tokens ÷ replicas; the
  # Pallas kernel's KV blocks (a slot reads whole blocks: (Bt − 1) / 2 tokens more per step).
  built = engine is not None and not floor
  max_pages = -(-(st.prompt_len + st.max_new - 1) // engine.page_size) if built else 0
  block = step_terms.kernel_block_tokens(engine, max_pages) if built else 0
  pad = (block - 1) / 2.0 if block else 0.0
  worst, worst_terms, flops, steps_max, worst_live = 0.0, {}, 0.0, 0, 0.0
  for r in range(reps):
    lens, ps = resp[r::reps], prompts[r::reps]
    if not len(lens):
      continue
    now, x, live, q, heap = 0, 0.0, 0, 0, []
    cost = pre = 0.0
    w_time = kv_time = pad_time = live_sum = slot_steps = 0.0
    while q < len(lens) or heap:
      while q < len(lens) and (x + ps[q] < cap or live == 0) and (
          max_live is None or live < max_live):
        heapq.heappush(heap, (now + int(lens[q]), int(ps[q]) + int(lens[q])))
        x += ps[q]
        if not built:
          pre += ps[q] * (a.matmul / tp) / (st.peak * (k.mfu_ceiling if floor else k.mfu)) / n
        live += 1
        q += 1
      nxt = heap[0][0]
      m = nxt - now
      c = _interval_cost(m, x + live * pad, live, a_, b_, live * per_tok)
      cost += c + m * lat
      w_time += m * a_
      kv_time += _interval_cost(m, x, live, 0.0, b_, 0.0)
      pad_time += m * live * pad * b_
      live_sum += m * x + live * m * (m - 1) / 2.0   # Σ over the m steps of live tokens
      slot_steps += m * live
      x += live * m
      now = nxt
      while heap and heap[0][0] == now:
        _, tot = heapq.heappop(heap)
        x -= tot
        live -= 1
    total = cost + pre
    flops += (a.matmul + a.head) * float(lens.sum() + (0 if built else ps.sum() / n)) / tp
    if total > worst:
      worst, steps_max = total, now
      worst_live = live_sum / max(1.0, slot_steps)
      mem = w_time + kv_time + pad_time
      worst_terms = {"decode weights": w_time, "decode KV": kv_time,
                     "decode compute": max(0.0, cost - now * lat - mem),
                     "decode latency": now * lat, "prefill": pre}
      if built:
        worst_terms["decode kernel blocks"] = pad_time
  mem_time = worst_terms.get("decode weights", 0.0) + worst_terms.get("decode KV", 0.0)
  prog = Program(name, flops / reps, mem_time * bw,
                 0 if floor else steps_max * (2 * a.layers + 2))
  if not floor:
    reshard = 2.0 * a.params / tp / st.ici
    worst_terms["bf16 reshard"] = reshard
  prog.terms = worst_terms
  prog.steps = steps_max
  if built:
    secs, pf_flops, pf_coll, line = step_terms.engine_prefill(st, prompts[::n], tp, reps)
    prog.terms["prefill"] = secs
    prog.flops += pf_flops
    prog.collectives += pf_coll
    prog.lines.append(line)
    decode_s = worst - pre   # the slowest replica's decode: what a chunk in flight hides
    secs, line = step_terms.host_gap(st, engine, steps_max, worst_live, len(resp), decode_s)
    prog.terms["host gap"] = secs
    prog.lines.append(line)
    line = step_terms.kernel_line(st, engine, block, prog.terms["decode kernel blocks"], tp)
    prog.lines.append(line)
  if max_live is not None:
    prog.note = (f"as built: {reps} replicas × TP{tp} of {max_live} slots, a pool of "
                 f"{cap:.0f} tokens each ({cap * kvb / tp / GB:.1f} GB/chip), slowest "
                 f"replica {steps_max} steps")
  else:
    prog.note = (f"{reps} replicas × TP{tp}, KV budget {kv_budget(st, tp) / GB:.1f} GB/chip "
                 f"(≈{cap:.0f} live tokens), slowest replica {steps_max} steps")
  return prog


# ---------------------------------------------------------------------------- the step
@dataclasses.dataclass
class Step:
  programs: list[Program]

  @property
  def time(self) -> float:
    return sum(p.time for p in self.programs)

  def dominant(self, n: int = 3) -> list[tuple[str, float]]:
    terms = [(f"{p.name}: {k}", v) for p in self.programs for k, v in p.terms.items()]
    return sorted(terms, key=lambda kv: -kv[1])[:n]


def _eval_lengths(st: Setup, resp: np.ndarray) -> np.ndarray:
  """Evaluation response lengths: the rollout's distribution (an assumption), eval_rows rows."""
  if not st.eval_rows:
    return resp[:0]
  idx = np.linspace(0, len(resp) - 1, st.eval_rows).astype(int)
  return np.random.default_rng(1).permutation(np.sort(resp)[idx])


def estimate(st: Setup, resp: np.ndarray, prompts: np.ndarray) -> Step:
  """One RL step with the knobs' code paths (today: padded, static)."""
  built = st.knobs.engine_layout == "built"
  if built and st.knobs.rollout == "continuous" and st.engine is None:
    raise ValueError("the engine's KV pool cannot hold one whole response on this slice "
                     "(sampler.kv_pool); use a larger slice or --engine_layout=replicas")
  if st.knobs.rollout == "continuous":
    roll = continuous_rollout(st, resp, prompts, floor=False,
                              engine=st.engine if built else None)
  else:
    roll = static_rollout(st, resp)
  progs = [roll, Program("reward", note="host process pool, overlaps the forwards: 0 s")]
  progs += train_side(st, resp, prompts)
  ev_resp = _eval_lengths(st, resp)
  if len(ev_resp):
    ev = (continuous_rollout(st, ev_resp, prompts[:len(ev_resp)], False, "evaluation",
                             st.eval_n, engine=st.eval_engine if built else None)
          if st.knobs.rollout == "continuous" else
          static_rollout(st, ev_resp, "evaluation", st.eval_per_call, st.eval_n))
    ev.terms = {k: v / st.eval_every for k, v in ev.terms.items()}
    ev.flops /= st.eval_every
    ev.hbm_bytes /= st.eval_every
    ev.collectives /= st.eval_every
    ev.note = f"every {st.eval_every} steps, amortised; " + ev.note
    progs.append(ev)
  return Step(progs)


def floor(st: Setup, resp: np.ndarray, prompts: np.ndarray) -> Step:
  """The physical floor of the same step (see the module docstring)."""
  progs = [continuous_rollout(st, resp, prompts, floor=True)]
  progs += train_side(st, resp, prompts, floor=True)
  ev_resp = _eval_lengths(st, resp)
  if len(ev_resp):
    ev = continuous_rollout(st, ev_resp, prompts[:len(ev_resp)], True, "evaluation",
                            st.eval_n)
    ev.terms = {k: v / st.eval_every for k, v in ev.terms.items()}
    progs.append(ev)
  return Step(progs)


ENGINE_ONLY = ("decode_copy", "insert", "decode_chunk", "eval_insert", "eval_decode_chunk")


def program_flops(st: Setup, name: str, engine: bool = False) -> float:
  """Analytic FLOPs per chip of one call of a `tools.programs` program (padded shapes; the
  standalone decode steps attend the whole cache of P + R slots). engine: the rollout
  engine's programs (its prefill: one prompt, on every tensor group: FLOPs / tensor)."""
  if engine and name == "prefill":
    return sum(step_counts.forward_flops(st.arch, 1, st.prompt_len, 1).values()) / st.tensor
  a = st.arch
  t = st.prompt_len + st.max_new
  fwd = step_counts.forward_flops(a, 1, t, step_counts.padded_head_positions(st.max_new))
  crit = step_counts.forward_flops(a, 1, t, t, critic=True)
  fac = step_counts.train_factors(a.remat)
  mb = st.rows // max(1, st.minibatches)
  down = a.down * a.remat
  per_row = {
      "policy_step": mb * (sum(fac[k] * v for k, v in fwd.items()) - t * down),
      "critic_step": mb * (sum(fac[k] * v for k, v in crit.items()) - t * down),
      "logprobs": st.rows * sum(fwd.values()),
      "values": st.rows * sum(crit.values()),
      "prefill": sum(step_counts.forward_flops(a, st.per_call, st.prompt_len, 1).values()),
      "decode_step": step_counts.decode_step_flops(a, st.per_call * st.n, t),
      "eval_decode_step": step_counts.decode_step_flops(a, st.eval_per_call, t),
  }
  if name not in per_row:
    raise ValueError(f"no analytic count for program {name!r}; known: {sorted(per_row)}")
  return per_row[name] / st.chips


def crosscheck(st: Setup, programs: dict) -> list[str]:
  """Lines comparing compile_check's XLA FLOPs (loop bodies once × micro-batch trips) with
  `program_flops`; programs: {name: {"flops": ...}} (compile_check's report)."""
  out = []
  engine = any(n in programs for n in ENGINE_ONLY)
  for name, p in programs.items():
    if p.get("error") or name in ENGINE_ONLY or "[" in name:
      continue  # the engine's programs (a live-length loop) and the packed ones
      # (test_programs_packed) have no count here
    ours = program_flops(st, name, engine)
    out.append(f"  {name:16s} XLA {p['flops'] / 1e12:10.1f} TFLOP/chip, analytic "
               f"{ours / 1e12:10.1f} (XLA / analytic {p['flops'] / ours:.2f})")
  return out


# ---------------------------------------------------------------------------- report
def lengths_for(st: Setup, spec: str, prompt_spec: str) -> tuple[np.ndarray, np.ndarray]:
  """(response lengths [B], real prompt lengths [B]) of one step from the specs."""
  from vapo_jax.tools import lengths  # pylint: disable=import-outside-toplevel
  resp = lengths.sample(spec, st.rows, st.max_new)
  prompts = lengths.sample(prompt_spec, st.rows, st.prompt_len, seed=2,
                           prefix="prompt/length_")
  return resp, prompts


def run(st: Setup, spec: str, prompt_spec: str) -> dict:
  """Estimate and floor of one length spec, as a dict (for --json and the table)."""
  resp, prompts = lengths_for(st, spec, prompt_spec)
  est, flo = estimate(st, resp, prompts), floor(st, resp, prompts)
  return {"spec": spec, "mean_length": float(resp.mean()),
          "truncated": float((resp >= st.max_new).mean()),
          "estimate_s": est.time, "floor_s": flo.time, "ratio": est.time / flo.time,
          "dominant": est.dominant(), "programs": est.programs, "floor_programs": flo.programs,
          "layouts": layouts(st, est, resp, prompts) if st.knobs.compare_layouts else []}


def layouts(st: Setup, est: Step, resp: np.ndarray, prompts: np.ndarray) -> list[str]:
  """`step_terms.layout_line` of the packed train side on FSDP × mesh.tensor and on
  FSDP-only meshes of the same chips (issue 44 item 3; arithmetic, not a compile)."""
  if st.knobs.train != "packed":
    return ["train layouts: compared for packed rows only (--train=packed)"]
  compute = sum(p.terms.get("matmul", 0.0) + p.terms.get("attention", 0.0)
                for p in est.programs if p.name in ("logprobs", "values", "policy_step",
                                                    "critic_step"))
  tps = sorted({st.tensor, 1}, reverse=True)
  return [step_terms.layout_line(st, step_terms.train_layout(st, tp, resp, prompts), compute)
          for tp in tps]


def format_report(label: str, r: dict) -> str:
  lines = [f"{label} ({r['spec']}: mean {r['mean_length']:.0f} tokens, "
           f"{r['truncated']:.1%} truncated)",
           f"  {'program':12s} {'TFLOP/chip':>11s} {'HBM TB/chip':>12s} {'collectives':>12s} "
           f"{'time s':>9s}  terms"]
  for p in r["programs"]:
    terms = ", ".join(f"{k} {v:.0f}" for k, v in sorted(p.terms.items(), key=lambda kv: -kv[1])
                      if v >= 0.5)
    lines.append(f"  {p.name:12s} {p.flops / 1e12:11.1f} {p.hbm_bytes / 1e12:12.1f} "
                 f"{p.collectives:12.0f} {p.time:9.0f}  {terms}")
    if p.note:
      lines.append(f"  {'':12s} {p.note}")
    for extra in p.lines:
      if extra:
        lines.append(f"  {'':12s} + {extra}")
  fl = ", ".join(f"{p.name} {p.time:.0f}" for p in r["floor_programs"])
  lines.append(f"  step estimate {r['estimate_s']:.0f} s; floor {r['floor_s']:.0f} s ({fl}); "
               f"ratio {r['ratio']:.1f}×")
  lines.append("  dominant: " + "; ".join(f"{k} {v:.0f} s" for k, v in r["dominant"]))
  for line in r.get("layouts", []):
    lines.append("  train layout " + line)
  lines.append("  " + step_terms.NOT_COUNTED)
  return "\n".join(lines)


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.tools import archs, tpu_specs  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  if f.config is None:
    raise ValueError("--config=configs/<experiment>.py is needed")
  cfg = config_lib.from_command_line(f.config)
  mcfg = archs.model_config(cfg, f.arch)
  s = tpu_specs.parse(f.topology)
  knobs = knobs_from_flags(f)
  st = Setup.of(cfg, mcfg, s, knobs)
  print(f"{s.name}: {s.chips} chips; {mcfg.num_layers} layers, d={mcfg.hidden_size}, "
        f"{mcfg.num_params / 1e9:.2f} B parameters; {st.rows} rows of {st.prompt_len} + "
        f"{st.max_new} tokens")
  knobs = st.knobs   # the code paths resolved from the config
  print("assumed: " + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(knobs).items()))
  from vapo_jax.tools import lengths  # pylint: disable=import-outside-toplevel
  rows = []
  for label, spec in lengths.phases(f.lengths):
    r = run(st, spec, f.prompt_lengths)
    print(format_report(label, r), flush=True)
    rows.append(markdown_row(label, r, f"train={knobs.train}, rollout={knobs.rollout}"))
  if f.markdown:
    print("| phase | code | estimate s | floor s | ratio | dominant terms |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


def markdown_row(label: str, r: dict, code: str) -> str:
  dom = "; ".join(f"{k} {v:,.0f} s" for k, v in r["dominant"])
  return (f"| {label} (mean {r['mean_length']:,.0f}) | {code} | {r['estimate_s']:,.0f} | "
          f"{r['floor_s']:,.0f} | {r['ratio']:.1f}× | {dom} |")


def define_flags(flags, lengths_default: str | None = "review"):
  """The model's flags (shared with compile_check)."""
  d = Knobs()
  flags.DEFINE_string("lengths", lengths_default, "Response lengths: lognormal:MEDIAN,SIGMA, "
                      "uniform:A,B, fixed:N, early|mid|late|review, a metrics.jsonl; ';' joins")
  flags.DEFINE_string("prompt_lengths", "uniform:80,400", "Real prompt lengths (same forms).")
  flags.DEFINE_float("mfu_ceiling", d.mfu_ceiling, "The floor's train MFU.")
  flags.DEFINE_float("collective_latency_us", d.collective_latency_us,
                     "Seconds·1e-6 per collective of a decode step.")
  flags.DEFINE_float("attn_score_bytes", d.attn_score_bytes, "HBM bytes per (query, key, "
                     "head) of a blocked attention forward (0: a fused kernel).")
  flags.DEFINE_float("decode_collectives", None, "Collectives per decode step (decode_hlo); "
                     "default 9 L + 4.")
  flags.DEFINE_float("decode_collective_bytes", 0.0, "Their bytes per step and chip.")
  flags.DEFINE_enum("decode_weights", d.decode_weights, ["stationary", "gathered"],
                    "Decode reads weights in place, or all-gathers them every step.")
  flags.DEFINE_float("decode_weight_itemsize", d.decode_weight_itemsize, "Bytes per weight "
                     "a decode step reads (2: the bf16 casts XLA hoists out of the loop).")
  flags.DEFINE_enum("train", d.train, ["padded", "packed"], "Train-side rows (default: "
                    "the config's rl.packing).")
  flags.DEFINE_enum("rollout", d.rollout, ["static", "continuous"], "Rollout sampler: "
                    "sampler/static.py or the engine of sampler/continuous.py (default: the "
                    "config's sampling.engine).")
  flags.DEFINE_enum("train_attention", d.train_attention, ["splash", "jax"], "The train "
                    "passes' self-attention kernel (default: as model.attention_kernel picks "
                    "it on the TPU slice: splash where jax's kernel takes the heads).")
  flags.DEFINE_bool("compare_layouts", False, "Also print the packed train side on "
                    "FSDP × mesh.tensor and FSDP-only meshes (collectives, memory, time).")
  flags.DEFINE_float("host_chunk_ms", None, "The engine's host work per decode chunk, ms "
                     "(default: measured on this CPU, tools.host_gap).")
  flags.DEFINE_string("train_collectives", None, "The train programs' collectives from "
                      "compiled HLO: a tools.train_hlo --json file (default: not counted).")
  flags.DEFINE_float("collective_bw_share", d.collective_bw_share, "Share of a chip's ICI "
                     "bandwidth one collective gets.")
  flags.DEFINE_integer("engine_tp", d.engine_tp, "Chips per engine replica "
                       "(--engine_layout=replicas).")
  flags.DEFINE_enum("engine_layout", d.engine_layout, ["built", "replicas"], "The engine as "
                    "sampler/continuous.py builds it (one pool and S slots on every chip) or "
                    "per-replica pools of --engine_tp chips.")
  flags.DEFINE_float("workspace_gb", d.workspace_gb, "Per chip, not given to the KV cache.")


def knobs_from_flags(f) -> Knobs:
  return Knobs(mfu=f.mfu, bw_efficiency=f.bw_efficiency,
               collective_latency_us=f.collective_latency_us, mfu_ceiling=f.mfu_ceiling,
               attn_score_bytes=f.attn_score_bytes, decode_collectives=f.decode_collectives,
               decode_collective_bytes=f.decode_collective_bytes,
               decode_weights=f.decode_weights,
               decode_weight_itemsize=f.decode_weight_itemsize, train=f.train,
               rollout=f.rollout, train_attention=f.train_attention,
               compare_layouts=f.compare_layouts,
               host_chunk_ms=f.host_chunk_ms,
               train_collectives=f.train_collectives,
               collective_bw_share=f.collective_bw_share,
               engine_tp=f.engine_tp, workspace_gb=f.workspace_gb,
               engine_layout=f.engine_layout)


if __name__ == "__main__":
  from absl import flags as _flags  # pylint: disable=ungrouped-imports
  from ml_collections import config_flags
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel,ungrouped-imports
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  _flags.DEFINE_string("topology", "v5p-128", "TPU slice, e.g. v5p-128")
  _flags.DEFINE_string("arch", None, "Architecture (archs.KNOWN name or config.json).")
  _flags.DEFINE_float("mfu", Knobs().mfu, "Assumed train MFU.")
  _flags.DEFINE_float("bw_efficiency", Knobs().bw_efficiency, "Fraction of HBM bandwidth.")
  _flags.DEFINE_bool("markdown", False, "Also print one markdown table row per phase.")
  define_flags(_flags)
  cli.run(main)
