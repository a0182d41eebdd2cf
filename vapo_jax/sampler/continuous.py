"""The rollout engine: continuous batching over decode slots, a paged KV pool, bf16 weights.

For Bp prompts and n responses each (B = Bp n responses; response b answers prompt b // n):

  host loop (`_HostLoop`), until every response is done:
    1. `admit`: each free slot takes the next pending response whose first chunk of pages
       fits (`slots.Scheduler`); its prompt is prefilled once (`prefill`, dense,
       right-padded to its bucket) and kept until all n of its responses are inserted;
       `insert` writes the prompt's KV into the slot's pages and draws token 0 from the
       prefill logits;
    2. `reserve` pages for one chunk in every running slot (evicting the youngest if short);
    3. `dispatch` `decode_chunk`: up to K decode steps in one `lax.while_loop` on device
       (early exit when enough slots are idle and responses wait), over the rows of the
       smallest bucket (S, S/2, ..., `EngineConfig.decode_buckets` sizes) that holds every
       slot the host holds as occupied, padded with idle slots (`slots.chunk_rows`): their
       state and page-table rows are gathered, decoded and scattered back; the KV pool
       stays in place. Each step feeds a slot's last token, writes its KV into its pages,
       attends over the slot's live length (`models.paged_attention`; with jax's Pallas
       kernel in slot groups whose page table fits its scalar memory, the matmuls over all
       the bucket's rows at once) and draws the next token;
    4. `read`: one device_get of the chunk's tokens, log-probs and slot states; a slot
       whose response ended (a stop token, or max_new_tokens) is freed with its pages.
  With `EngineConfig.overlap` (default) step 4 reads the previous chunk after step 3 has
  dispatched this one: one chunk is always in flight while the host works, the host sees
  the slots one chunk late (a chunk's result goes only to the slots that still hold the
  response they held at its dispatch), and step 2 reserves pages two chunks ahead.

  Host work is O(S) per chunk, never per token; the programs compile once per prompt bucket
  (prefill, insert) and once per row bucket (decode chunk, all of them before the first
  chunk), whatever the response lengths.

Per-response PRNG: token i of response b is drawn with fold_in(fold_in(key, b), i), so a
response's tokens and log-probs depend on its key, prompt and weights only -- not on its slot,
the number of slots, the row bucket, the admission order or evictions (float rounding aside:
a batch of S rows may round a matmul differently from another S).

Weights: the engine decodes from `decode_weights.decode_copy` of the parameters it is given
(LoRA merged, cast to `EngineConfig.decode_dtype`, FSDP dropped from the weights), made once
per call; it never reads the training copy. The output is a `types.Rollout`, as the static
sampler's (`sampler.static`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from vapo_jax import sharding as shd
from vapo_jax.models import paged_attention as pa
from vapo_jax.models import platform
from vapo_jax.models import transformer
from vapo_jax.sampler import decode_weights
from vapo_jax.sampler import ops
from vapo_jax.sampler import paged
from vapo_jax.sampler import slots as slots_lib
from vapo_jax.sampler import types


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Sizes of the engine (hashable).

  Attributes:
    slots: S, decode slots (rows of every decode step).
    page_size: Ps, tokens per KV page.
    kv_tokens: the KV pool's size in tokens (rounded up to whole pages); must hold one whole
      response (max_prompt_len + max_new_tokens - 1 tokens).
    chunk_steps: K, decode steps per on-device chunk (host work happens between chunks).
    pages_per_block: pages per attention block (the live-length loop's granularity).
    decode_dtype: dtype of the decode copy of the weights: "auto" (the model's compute
      dtype: every matmul casts its weight to it, so the copy decodes exactly like the
      training copy, in half the bytes at bf16), "bfloat16", "float32", "float16".
    kernel: "jax" (pure-JAX paged attention, any backend) or "tpu" (jax's Pallas ragged
      paged attention kernel).
    replicas: R, decode replicas (the engine's mesh's batch shards, data x fsdp, each
      holding a whole tensor-parallel decode copy): slots and pages split R ways, replica
      r decoding slots r S/R .. (r+1) S/R - 1 from its own N/R pages. 1: every chip
      decodes every slot from a pool replicated over the batch axes.
    overlap: dispatch chunk i+1 before reading chunk i back (the device decodes while the
      host works; pages are reserved two chunks ahead). Off on a CPU mesh of several
      devices, which waits for every insert (`Engine._paced`).
    slot_group: slots per decode-attention call (`paged_attention.in_slot_groups`; the
      projections still run once over all slots). 0: as the kernel needs ("tpu": the most
      slots whose page table fits its scalar memory, `paged_attention.slot_group_of`;
      "jax": one call). The output is the same for every value (tests force small ones).
    decode_buckets: b, the decode chunk's row buckets: bucket i (i < b) runs S / 2^i rows,
      (S/R) / 2^i per replica, dropped where that is not a whole number (`bucket_rows`);
      each chunk runs the smallest that holds the occupied slots. 1: every chunk runs all
      S slots.
  """

  slots: int = 16
  page_size: int = 16
  kv_tokens: int = 16384
  chunk_steps: int = 16
  pages_per_block: int = 8
  decode_dtype: str = "auto"
  kernel: str = "jax"
  replicas: int = 1
  overlap: bool = True
  slot_group: int = 0
  decode_buckets: int = 1

  def __post_init__(self):
    def bad(field, value, allowed):
      raise ValueError(f"EngineConfig.{field}={value!r}: must be {allowed}.")
    for f in ("slots", "page_size", "kv_tokens", "chunk_steps", "pages_per_block",
              "replicas", "decode_buckets"):
      if getattr(self, f) < 1:
        bad(f, getattr(self, f), ">= 1")
    if self.slot_group < 0:
      bad("slot_group", self.slot_group, ">= 0 (0: as the kernel needs)")
    if self.decode_dtype not in ("auto", "bfloat16", "float32", "float16"):
      bad("decode_dtype", self.decode_dtype, "one of auto, bfloat16, float32, float16")
    if self.kernel not in ("jax", "tpu"):
      bad("kernel", self.kernel, '"jax" or "tpu"')
    if self.slots % self.replicas:
      bad("slots", self.slots, f"a multiple of replicas={self.replicas}")

  @property
  def num_pages(self) -> int:
    """Pages in the pool: kv_tokens in whole pages, rounded up to a multiple of replicas."""
    per = paged.pages_for(paged.pages_for(self.kv_tokens, self.page_size), self.replicas)
    return per * self.replicas

  @property
  def replica_pages(self) -> int:
    return self.num_pages // self.replicas

  @property
  def bucket_rows(self) -> tuple[int, ...]:
    return bucket_rows(self.slots, self.replicas, self.decode_buckets)


def bucket_rows(slots: int, replicas: int, buckets: int) -> tuple[int, ...]:
  """Rows of the decode chunk's buckets, largest (S) first: S / 2^i for i < buckets where
  (S/R) / 2^i is a whole number of rows per replica (the step model's too)."""
  per = slots // replicas
  return tuple(slots >> i for i in range(buckets) if per % (1 << i) == 0)


def check(cfg: ops.SamplingConfig, ecfg: EngineConfig) -> None:
  """ValueError if the pool (each replica's part) cannot hold one whole response."""
  need = cfg.max_prompt_len + cfg.max_new_tokens - 1
  if ecfg.replica_pages * ecfg.page_size < need:
    per = "" if ecfg.replicas == 1 else f" per replica of {ecfg.replicas}"
    raise ValueError(
        f"EngineConfig.kv_tokens={ecfg.kv_tokens} holds {ecfg.replica_pages} pages{per} of "
        f"{ecfg.page_size} tokens, fewer than one whole response needs "
        f"(max_prompt_len {cfg.max_prompt_len} + max_new_tokens {cfg.max_new_tokens} - 1 = "
        f"{need}); raise sampling.kv_tokens")


# --------------------------------------------------------------------------- programs


def _is_stop(tok, cfg):
  stop = jnp.asarray(cfg.stop_token_ids or (-1,), jnp.int32)
  return jnp.any(tok[..., None] == stop.reshape((1,) * tok.ndim + (-1,)), axis=-1)


def _sample_rows(keys_S, logits_SxV, cfg):
  """One draw per row with its own key: (tokens_S, logp_S)."""
  tok, lp = jax.vmap(lambda k, z: ops.sample_step(k, z[None], cfg))(keys_S, logits_SxV)
  return tok[:, 0], lp[:, 0]


def prefill(graphdef, params, tokens_1xP, plen):
  """Dense prefill of one right-padded prompt: (KV cache of P slots, logits_1xV at plen-1)."""
  model = nnx.merge(graphdef, params)
  p = tokens_1xP.shape[1]
  mask = (jnp.arange(p) < plen)[None].astype(jnp.int32)
  pos = jnp.arange(p, dtype=jnp.int32)[None]
  cache = transformer.init_cache(model, 1, p)
  hidden, cache = model(tokens_1xP, pos, mask, cache=cache, cache_index=0)
  last = jax.lax.dynamic_index_in_dim(hidden[0], plen - 1, axis=0, keepdims=True)
  return cache, ops.last_logits(model, last)


def insert(cfg: ops.SamplingConfig, pages, cache, logits_1xV, table_M, plen, slot,
           response, key, state):
  """The prompt's KV into a slot's pages and token 0 drawn: (pages, state, tok0, logp0).

  state: tok_S (last token), pos_S (KV tokens = next write position), t_S (tokens drawn),
  active_S, keys_S (per-response keys).
  """
  new_pages = []
  for pool, layer in zip(pages, cache):
    kv = jnp.stack([layer["k"][0], layer["v"][0]], axis=1)  # [K, 2, P, Dh]
    k, _, p, dh = kv.shape
    kv = jnp.transpose(kv, (2, 0, 1, 3)).reshape(p, 2 * k, dh)
    new_pages.append(pa.write_prompt(pool, kv, table_M))
  rkey = jax.random.fold_in(key, response)
  tok0, lp0 = _sample_rows(jax.random.fold_in(rkey, 0)[None], logits_1xV, cfg)
  live = ~_is_stop(tok0[0], cfg) & (cfg.max_new_tokens > 1)
  state = dict(
      tok_S=state["tok_S"].at[slot].set(tok0[0]),
      pos_S=state["pos_S"].at[slot].set(plen),
      t_S=state["t_S"].at[slot].set(1),
      active_S=state["active_S"].at[slot].set(live),
      keys_S=state["keys_S"].at[slot].set(jax.random.key_data(rkey)))
  return tuple(new_pages), state, tok0[0], lp0[0]


def decode_chunk(graphdef, cfg: ops.SamplingConfig, ecfg: EngineConfig, impl,
                 mesh, head_axis, batch_axes, params, pages, table_SxM, state, exit_below,
                 rows_Sb):
  """Up to K decode steps of the slots `rows_Sb`; stops early once active slots <= exit_below.

  rows_Sb: int32 [Sb], the slots decoded (a bucket, `EngineConfig.bucket_rows`): every slot
  that may be active, padded with idle ones, distinct; with replicas, R blocks of Sb/R in
  replica order, block r holding slots of replica r (r S/R .. (r+1) S/R - 1), so that the
  rows' split over the replicas meets each replica's own pages. Their state and page-table
  rows are gathered (the KV pool is addressed through the table and stays in place), the
  while loop runs on Sb rows, and their state is scattered back into the S slots' state.
  An inactive row (idle, or its response over) draws nothing and writes no KV.

  Returns (pages, state, tokens_SbxK, logp_SbxK, steps, seen_2xS): row j of the outputs holds
  the tokens drawn for slot rows_Sb[j] in this chunk, first (t_S_after - t_S_before) entries
  real (the host maps them back to slots); seen_2xS = [t_S, active_S] of all S slots after
  the chunk, a buffer of its own (the state is donated to the next chunk, which the
  overlapped host loop dispatches before reading this one).
  With `batch_axes` (ecfg.replicas > 1) the rows and the pool are split over those mesh axes
  and table_SxM holds each replica's local page ids.
  """
  model = nnx.merge(graphdef, params)
  sb, k = rows_Sb.shape[0], ecfg.chunk_steps
  r = cfg.max_new_tokens
  table_SbxM = table_SxM[rows_Sb]
  no_page = jnp.full_like(table_SbxM, ecfg.replica_pages)

  def cond(c):
    i, _, st, _, _ = c
    return (i < k) & (jnp.sum(st["active_S"]) > exit_below)

  def body(c):
    i, pages, st, toks_SbxK, lps_SbxK = c
    act = st["active_S"]
    table = jnp.where(act[:, None], table_SbxM, no_page)
    lens = jnp.where(act, st["pos_S"] + 1, 0)
    hidden, pages = model.decode_paged(
        st["tok_S"], st["pos_S"], pages, table_SxM=table, lens_S=lens,
        pages_per_block=ecfg.pages_per_block, kernel=ecfg.kernel, mesh=mesh,
        head_axis=head_axis, batch_axes=batch_axes, slot_group=ecfg.slot_group)
    logits = ops.last_logits(model, hidden)
    keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(st["keys_S"], impl=impl),
                                        st["t_S"])
    new, lp = _sample_rows(keys, logits, cfg)
    new = jnp.where(act, new, cfg.pad_id)
    lp = jnp.where(act, lp, 0.0)
    toks_SbxK = jax.lax.dynamic_update_slice(toks_SbxK, new[:, None], (0, i))
    lps_SbxK = jax.lax.dynamic_update_slice(lps_SbxK, lp[:, None], (0, i))
    step = act.astype(jnp.int32)
    t = st["t_S"] + step
    st = dict(tok_S=jnp.where(act, new, st["tok_S"]), pos_S=st["pos_S"] + step, t_S=t,
              active_S=act & ~_is_stop(new, cfg) & (t < r), keys_S=st["keys_S"])
    return i + 1, pages, st, toks_SbxK, lps_SbxK

  rows_state = {name: x[rows_Sb] for name, x in state.items()}
  init = (jnp.int32(0), pages, rows_state, jnp.full((sb, k), cfg.pad_id, jnp.int32),
          jnp.zeros((sb, k), jnp.float32))
  steps, pages, rows_state, toks, lps = jax.lax.while_loop(cond, body, init)
  # Back into the S slots from the loop's output only: its rows replicated first (an
  # all-gather after the loop) and scattered with the replicated rows_Sb, keys (unchanged)
  # not at all. Otherwise the partitioner gathers rows_Sb and the keys over the replicas
  # apart from the loop, and XLA's CPU runtime may run such a collective before the
  # loop's own on one device and after them on another: across processes that deadlocked
  # (`tests/sampler/test_decode_buckets.py` checks the order in the compiled program).
  if mesh is not None:
    rows_state = jax.lax.with_sharding_constraint(rows_state, NamedSharding(mesh, P()))
  state = {name: x if name == "keys_S" else x.at[rows_Sb].set(rows_state[name])
           for name, x in state.items()}
  seen = jnp.stack([state["t_S"], state["active_S"].astype(jnp.int32)])
  return pages, state, toks, lps, steps, seen


@jax.jit
def _set_entries(table_SxM, slot_E, column_E, page_E):
  """table_SxM with [slot_E[e], column_E[e]] set to page_E[e]; a slot >= S is dropped."""
  return table_SxM.at[slot_E, column_E].set(page_E, mode="drop")


def kv_head_shards(model_cfg, mesh, rules: shd.Rules = shd.DEFAULT_RULES) -> int:
  """How many ways the pool's combined kv-heads axis (2K) is split over the mesh."""
  head = shd.logical_to_spec(("kv_heads",), rules, mesh, (2 * model_cfg.num_kv_heads,))[0]
  axes = (head,) if isinstance(head, str) else tuple(head or ())
  return int(np.prod([mesh.shape[a] for a in axes]))


def platform_of(mesh) -> str:
  """The platform the engine's programs run on: its mesh's devices' (a TPU topology's
  devices on a CPU host, for an AOT compile), else the default backend."""
  return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def kernel_refusal(model_cfg, mesh=None, rules: shd.Rules = shd.DEFAULT_RULES,
                   page_size: int = 16, table: tuple[int, int] | None = None) -> str | None:
  """Why the engine cannot decode with jax's Pallas kernel here, or None if it can.
  table: (slots, pages per slot) of one decode replica's page table, if known."""
  if platform_of(mesh) != "tpu":
    return f"{platform.OFF_TPU}, and this engine's devices are {platform_of(mesh)}"
  if table is not None and (why := pa.table_refusal(*table)):
    return why
  tp = kv_head_shards(model_cfg, mesh, rules) if mesh is not None else 1
  k2, h = 2 * model_cfg.num_kv_heads, model_cfg.num_heads
  if k2 % tp or (k2 // tp) % 2 or h % tp:
    return (f"{model_cfg.num_kv_heads} kv heads and {h} q heads do not split whole over "
            f"{tp} tensor shards (a key would sit apart from its value)")
  return pa.tpu_kernel_refusal(h // tp, k2 // tp // 2, model_cfg.head_dim,
                               model_cfg.dtype, page_size)


def attention_kernel(want: str, model_cfg, mesh=None, rules: shd.Rules = shd.DEFAULT_RULES,
                     page_size: int = 16, log=print, table: tuple[int, int] | None = None
                     ) -> str:
  """`EngineConfig.kernel` for a setting: "jax" (pure-JAX paged attention) or "tpu".

  want: "auto" -> "tpu" where `kernel_refusal` finds no reason against it (on TPU, a
  line says why not when it does), else "jax"; "jax"; "tpu" -> ValueError with the reason
  where the kernel cannot run.
  """
  return platform.choose_kernel(
      want, lambda: kernel_refusal(model_cfg, mesh, rules, page_size, table),
      "sampling.attention_kernel",
      "[sampler] pure-JAX paged attention, not jax's Pallas kernel", log)


def _replicate_outputs(fn, mesh, which: tuple[int, ...]):
  """fn with its outputs at positions `which` constrained to be replicated over `mesh`."""
  if mesh is None:
    return fn
  rep = NamedSharding(mesh, P())

  @functools.wraps(fn)
  def pinned(*args):
    out = list(fn(*args))
    for i in which:
      out[i] = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, rep), out[i])
    return tuple(out)
  return pinned


# ----------------------------------------------------------------------------- engine


class Engine:
  """Continuous-batching rollout engine: the package's rollout sampler (`types.RolloutSampler`).

  Usage:
    eng = Engine(graphdef, model_cfg, SamplingConfig(...), EngineConfig(...), mesh=mesh)
    rollout = eng(params, [[1, 2, 3], [4, 5]], jax.random.key(0))
    eng.last_stats  # tokens/s, slot and KV-pool occupancy, decode steps, evictions
  """

  continuous = True
  pool = None  # the `kv_pool.Pool` it was sized with, when built by `run.sampling`

  def __init__(self, graphdef, model_cfg, cfg: ops.SamplingConfig,
               ecfg: EngineConfig = EngineConfig(), *,
               mesh: jax.sharding.Mesh | None = None,
               rules: shd.Rules = shd.DEFAULT_RULES):
    if cfg.vocab_size is None and model_cfg.real_vocab_size is not None:
      cfg = dataclasses.replace(cfg, vocab_size=model_cfg.real_vocab_size)
    check(cfg, ecfg)
    self.cfg, self.ecfg = cfg, ecfg
    self.graphdef, self.model_cfg = graphdef, model_cfg
    self.mesh, self.rules = mesh, rules
    self.batch_axes = shd.batch_axes(mesh, rules) if mesh is not None else ()
    shards = int(np.prod([mesh.shape[a] for a in self.batch_axes])) if self.batch_axes else 1
    if ecfg.replicas not in (1, shards):
      raise ValueError(f"EngineConfig.replicas={ecfg.replicas}: must be 1 or the mesh's "
                       f"batch shards ({shards}, over {self.batch_axes or 'no axes'})")
    self.replica_axes = self.batch_axes if ecfg.replicas > 1 else ()
    if self.replica_axes:
      tp = kv_head_shards(model_cfg, mesh, rules)
      if model_cfg.num_kv_heads % tp:
        raise ValueError(f"EngineConfig.replicas={ecfg.replicas} needs the kv heads "
                         f"({model_cfg.num_kv_heads}) whole on each of {tp} tensor shards")
    self.max_pages = paged.pages_for(cfg.max_prompt_len + cfg.max_new_tokens - 1,
                                     ecfg.page_size)
    if ecfg.kernel == "tpu":
      why = kernel_refusal(model_cfg, mesh, rules, ecfg.page_size,
                           (ecfg.slots // ecfg.replicas, self.max_pages))
      if why:
        raise ValueError(f"EngineConfig.kernel='tpu': {why}")
    self._paced = (mesh is not None and mesh.size > 1 and platform_of(mesh) == "cpu")
    # A paced mesh waits for each insert, which waits for the chunk in flight: no overlap.
    self.overlap = ecfg.overlap and not self._paced
    self.last_trace: list[tuple[str, int]] = []  # ("dispatch" | "read", chunk), in order
    self.decode_dtype = jnp.dtype(model_cfg.dtype if ecfg.decode_dtype == "auto"
                                  else ecfg.decode_dtype)
    self.last_stats: dict[str, float] = {}
    self._copy_of: tuple | None = None
    self._programs: dict[Any, Any] = {}
    self._warmed: set = set()  # program sets whose row buckets are compiled (`_warm`)
    self._pages = None
    # Jitted once per layout and reused across clear_cache (rl.experience frees the pool
    # and the copy after every rollout; a new jax.jit would trace and compile again).
    self._copy_fns: dict[Any, Any] = {}
    self._pool_allocs: dict[Any, Any] = {}

  # -- programs
  def decode_copy(self, params):
    """(graphdef, params) of the decode copy, rebuilt only when `params` changed."""
    leaves = jax.tree.leaves(params)
    ident = tuple(id(x) for x in leaves)
    if self._copy_of is None or self._copy_of[0] != ident:
      self._copy_of = None  # free the old copy first
      layout = (jax.tree.structure(params),
                tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves))
      if layout not in self._copy_fns:
        g, build, shardings, _ = decode_weights.decode_layout(
            self.graphdef, params, self.decode_dtype, self.mesh, self.rules)
        self._copy_fns = {layout: (g, jax.jit(build, out_shardings=shardings))}
      g, build = self._copy_fns[layout]
      p = build(params)
      self._copy_of = (ident, leaves, g, p)
    return self._copy_of[2], self._copy_of[3]

  def programs(self, graphdef, impl):
    """The jitted (prefill, insert, decode_chunk) for a decode graphdef and key impl.

    What the host loop reads (insert's slot state and token 0, the chunk's tokens,
    log-probs, slot state and step count) comes out replicated over the mesh, so every
    process of a multi-process mesh reads it from its own devices."""
    home = getattr(self, "_home", self.mesh)
    k = (graphdef, str(impl), home)
    if k not in self._programs:
      pre = jax.jit(functools.partial(prefill, graphdef))
      ins = jax.jit(_replicate_outputs(functools.partial(insert, self.cfg), home, (1, 2, 3)),
                    donate_argnums=(0, 8))
      head_axis = None
      if self.mesh is not None:
        spec = shd.logical_to_spec(("kv_heads",), self.rules, self.mesh,
                                   (2 * self.model_cfg.num_kv_heads,))
        head_axis = spec[0]
      fn = functools.partial(decode_chunk, graphdef, self.cfg, self.ecfg, impl, self.mesh,
                             head_axis, self.replica_axes)
      if self.replica_axes:  # rows split over the replicas (the blocks' constraints)
        fn = shd.traced_under(fn, self.mesh, self.rules)
      dec = jax.jit(_replicate_outputs(fn, home, (1, 2, 3, 4, 5)), donate_argnums=(1, 3))
      self._programs[k] = (pre, ins, dec)
    return self._programs[k]

  def lowerable(self, params) -> dict[str, Any]:
    """The engine's own jitted programs and example args, for an AOT compile check.

    params: the training parameters (concrete or ShapeDtypeStructs with shardings).
    Returns {"decode_copy", "prefill", "insert", "decode_chunk"} -> jitted function, and
    "<name>_args" -> a tuple of ShapeDtypeStructs (prompt at the largest bucket, decode chunk
    at the largest row bucket: all S slots, the memory peak) such that
    `out[name].lower(*out[name + "_args"]).compile()` builds exactly what a rollout runs.
    """
    cfg, ecfg = self.cfg, self.ecfg
    g, build, shardings, abs_copy = decode_weights.decode_layout(
        self.graphdef, params, self.decode_dtype, self.mesh, self.rules)
    impl = jax.random.key_impl(jax.random.key(0))
    pre, ins, dec = self.programs(g, impl)

    def sds(x, sh=None):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)

    if shardings is not None:
      abs_copy = jax.tree.map(lambda a, sh: sds(a, sh), abs_copy, shardings)
    abs_params = jax.tree.map(lambda x: sds(x, getattr(x, "sharding", None)), params)
    rep = NamedSharding(self.mesh, P()) if self.mesh is not None else None
    pages = jax.eval_shape(lambda: transformer.init_pages(
        self.model_cfg, ecfg.num_pages, ecfg.page_size))
    pool_sh = self._pool_sharding(pages)
    pages = tuple(sds(x, pool_sh) for x in pages)
    s = ecfg.slots
    kd = jax.random.key_data(jax.random.key(0))
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rep)  # noqa: E731
    state = {"tok_S": i32(s), "pos_S": i32(s), "t_S": i32(s),
             "active_S": jax.ShapeDtypeStruct((s,), jnp.bool_, sharding=rep),
             "keys_S": jax.ShapeDtypeStruct((s,) + kd.shape, kd.dtype, sharding=rep)}
    bucket = ops.prompt_bucket(cfg.max_prompt_len, cfg)
    pre_args = (abs_copy, i32(1, bucket), i32())
    cache, logits = jax.eval_shape(pre, *pre_args)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
    ins_args = (pages, cache, logits, i32(self.max_pages), i32(), i32(), i32(), key, state)
    dec_args = (abs_copy, pages, i32(s, self.max_pages), state, i32(), i32(s))
    return {"decode_copy": jax.jit(build, out_shardings=shardings),
            "decode_copy_args": (abs_params,), "prefill": pre, "prefill_args": pre_args,
            "insert": ins, "insert_args": ins_args, "decode_chunk": dec,
            "decode_chunk_args": dec_args}

  def _warm(self, dec, args, key) -> None:
    """Before the first chunk of a program set: every row bucket's decode chunk compiled
    (announced as `[compile] decode_chunk: ...`), with the arguments of that chunk (types
    and shardings as every later chunk's), so that no later chunk compiles whatever bucket
    it runs."""
    key = key + (getattr(self, "_home", self.mesh),)
    if key in self._warmed:
      return
    self._warmed.add(key)
    sizes, r = self.ecfg.bucket_rows, self.ecfg.replicas
    print(f"[compile] decode_chunk: {len(sizes)} program{'s' * (len(sizes) > 1)} "
          f"({', '.join(f'rows={n}' for n in sizes)}) for {self.ecfg.slots} slots ...",
          flush=True)
    for n in sizes:
      rows = slots_lib.chunk_rows([i % (self.ecfg.slots // r) < n // r
                                   for i in range(self.ecfg.slots)], r, sizes)
      dec.lower(*args, self._replicated(np.asarray(rows, np.int32))).compile()

  def _place_like(self, params) -> None:
    """Without a mesh, the engine's arrays go where the parameters are: replicated over
    their mesh when they carry a NamedSharding (as `hf_io.from_pretrained` gives them), so
    the second call's inputs (outputs of the first) have the first call's types and
    nothing compiles again."""
    self._home = self.mesh
    if self._home is None:
      leaf = next(iter(jax.tree.leaves(params)), None)
      if isinstance(getattr(leaf, "sharding", None), NamedSharding):
        self._home = leaf.sharding.mesh

  def _pool(self, dtype):
    """The KV pool, allocated in place on its sharding (never whole on one device: at
    pod scale the pool is most of a chip's HBM times the tensor shards)."""
    if self._pages is None:
      make = functools.partial(transformer.init_pages, self.model_cfg, self.ecfg.num_pages,
                               self.ecfg.page_size, dtype)
      abstract = jax.eval_shape(make)
      sh = self._pool_sharding(abstract)
      k = (str(jnp.dtype(dtype)), sh)
      if k not in self._pool_allocs:
        out = None if sh is None else tuple(sh for _ in abstract)
        self._pool_allocs[k] = jax.jit(make, out_shardings=out)
      self._pages = self._pool_allocs[k]()
    out, self._pages = self._pages, None
    return out

  def _pool_sharding(self, pages):
    """Heads over the tensor axis; pages over the batch axes with decode replicas."""
    home = getattr(self, "_home", self.mesh)
    if home is None:
      return None
    spec = shd.logical_to_spec((None, None, "kv_heads", "head_dim"), self.rules, home,
                               pages[0].shape)
    if self.replica_axes:
      b = self.replica_axes
      spec = P(b[0] if len(b) == 1 else b, *spec[1:])
    return NamedSharding(home, spec)

  def _replicated(self, x):
    """A host value (every process holds the same one) as an array replicated over the
    engine's mesh. `make_array_from_callback`, not `device_put`: on a multi-process mesh
    each process places only its own devices' copies."""
    home = getattr(self, "_home", self.mesh)
    if home is None:
      return jnp.asarray(x)
    sharding = NamedSharding(home, P())
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.wrap_key_data(self._replicated(jax.random.key_data(x)),
                                      impl=jax.random.key_impl(x))
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  def _update_table(self, table_SxM, slot_E, column_E, page_E):
    """The device page table with the entries `PagePool.changes()` gives set (padded by
    `paged.padded_changes`)."""
    if len(slot_E) == 0:
      return table_SxM
    padded = paged.padded_changes(slot_E, column_E, page_E, table_SxM.shape[0])
    # No wait on a CPU mesh (`_paced`): one small scatter per chunk, no collectives in it,
    # and the chunk's device_get follows.
    return _set_entries(table_SxM, *(self._replicated(x) for x in padded))

  def clear_cache(self):
    """Frees the KV pool and the decode copy (e.g. before big train steps)."""
    self._pages = None
    self._copy_of = None

  # -- host loop
  def __call__(self, params, prompts: Sequence[Sequence[int]], key: jax.Array, *,
               prompt_len: int | None = None, order: Sequence[int] | None = None
               ) -> types.Rollout:
    """n responses per prompt; the Rollout's prompts are left-padded to `prompt_len`
    (default: the bucket of the longest prompt). `order` permutes the admission order of
    the B responses (tests; the output does not depend on it). A round of the loop: admit,
    reserve, dispatch a chunk, read the one dispatched before it (`_HostLoop`)."""
    cfg = self.cfg
    if not prompts:
      raise ValueError("no prompts given")
    for i, pr in enumerate(prompts):
      if not 0 < len(pr) <= cfg.max_prompt_len:
        raise ValueError(f"prompt {i} has {len(pr)} tokens; need 1..SamplingConfig."
                         f"max_prompt_len={cfg.max_prompt_len}")
    b_total = len(prompts) * cfg.n_per_prompt
    order = list(range(b_total)) if order is None else list(order)
    if sorted(order) != list(range(b_total)):
      raise ValueError(f"order must be a permutation of range({b_total})")
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(key)
    t0 = time.perf_counter()
    self._place_like(params)
    loop = _HostLoop(self, *self.decode_copy(params), prompts, key, order)
    self.last_trace = loop.trace
    inflight = None  # the chunk dispatched and not yet read
    while not loop.sched.done() or inflight is not None:
      launched = None
      if not loop.sched.done():
        inserted = loop.admit()
        loop.reserve()
        launched = loop.dispatch(inserted)
        if not self.overlap:
          loop.read(launched)
          launched = None
      if inflight is not None:
        loop.read(inflight)
      inflight = launched
    self._pages = loop.pages
    rollout = self._assemble(prompts, loop.out_tok, loop.out_lp, prompt_len)
    self.last_stats = loop.stats(time.perf_counter() - t0)
    return rollout

  def _assemble(self, prompts, out_tok, out_lp, prompt_len) -> types.Rollout:
    cfg = self.cfg
    n, r = cfg.n_per_prompt, cfg.max_new_tokens
    p = prompt_len or ops.prompt_bucket(max(len(x) for x in prompts), cfg)
    prompt_BxP, mask_BxP = types.left_pad(prompts, p, cfg.pad_id)
    b = len(out_tok)
    resp = np.full((b, r), cfg.pad_id, np.int32)
    logp = np.zeros((b, r), np.float32)
    lengths = np.zeros(b, np.int32)
    trunc = np.zeros(b, bool)
    stops = set(cfg.stop_token_ids)
    for i, (tk, lp) in enumerate(zip(out_tok, out_lp)):
      resp[i, :len(tk)] = tk
      logp[i, :len(lp)] = lp
      lengths[i] = len(tk)
      trunc[i] = tk[-1] not in stops
    out = types.Rollout(
        prompt_BxP=np.repeat(prompt_BxP, n, axis=0),
        prompt_mask_BxP=np.repeat(mask_BxP, n, axis=0),
        response_BxR=resp,
        response_mask_BxR=(np.arange(r)[None] < lengths[:, None]).astype(np.float32),
        lengths_B=lengths, truncated_B=trunc, logp_BxR=logp,
        group_ids_B=np.arange(b, dtype=np.int32) // n)
    sharding = (NamedSharding(self.mesh, P(self.batch_axes or None))
                if self.mesh is not None else None)
    if sharding is None:
      return jax.tree.map(jnp.asarray, out)
    return jax.tree.map(lambda x: jax.make_array_from_callback(
        x.shape, sharding, lambda idx: x[idx]), out)

class _HostLoop:
  """One `Engine.__call__`'s host side (the module docstring's steps 1-4): scheduler and
  page pool, the device's slot state, pool and page table, the tokens read so far, counts."""

  def __init__(self, eng: Engine, graphdef, dparams, prompts, key, order: list[int]):
    ecfg, s = eng.ecfg, eng.ecfg.slots
    self.eng, self.graphdef, self.dparams, self.prompts = eng, graphdef, dparams, prompts
    self.impl = jax.random.key_impl(key)
    self.pre, self.ins, self.dec = eng.programs(graphdef, self.impl)
    self.pages = eng._pool(jnp.dtype(eng.model_cfg.dtype))
    self.key = eng._replicated(key)
    kd = jax.random.key_data(key)
    self.state = jax.tree.map(eng._replicated, {
        "tok_S": np.zeros(s, np.int32), "pos_S": np.zeros(s, np.int32),
        "t_S": np.zeros(s, np.int32), "active_S": np.zeros(s, bool),
        "keys_S": np.zeros((s,) + kd.shape, kd.dtype)})
    self.pool = paged.PagePool(ecfg.num_pages, ecfg.page_size, s, eng.max_pages,
                               groups=ecfg.replicas)
    self.sched = slots_lib.Scheduler(self.pool, order)
    self.table = eng._replicated(self.pool.table())  # every entry NO_PAGE; then the changes
    self.pool.changes()
    self.ahead = (2 if eng.overlap else 1) * ecfg.chunk_steps  # tokens reserved per slot
    self.out_tok, self.out_lp = [None] * len(order), [None] * len(order)  # finished
    self.cur_tok: dict[int, list] = {}  # the running responses' tokens read so far
    self.cur_lp: dict[int, list] = {}
    self.prefills: dict[int, Any] = {}  # prompt -> (cache, logits) while responses wait
    self.left = dict.fromkeys(range(len(prompts)), eng.cfg.n_per_prompt)  # not yet inserted
    self.trace: list[tuple[str, int]] = []  # `Engine.last_trace`
    self.number = 0  # chunks dispatched
    self.n_prefill = self.chunks = self.steps_total = self.busy_steps = self.row_steps = 0
    self.per_bucket = dict.fromkeys(ecfg.bucket_rows, 0)  # chunks read at each row bucket
    self.kv_used = 0.0  # the pool's used share, summed over the chunks dispatched

  def admit(self) -> list[tuple[int, int, Any, Any]]:
    """Step 1: free slots take pending responses, prefilled and inserted. Returns [(slot,
    response, token 0, its log-prob)], the last two on device (read with the next chunk)."""
    eng, cfg, n = self.eng, self.eng.cfg, self.eng.cfg.n_per_prompt
    inserted = []
    for slot, b in self.sched.admit(lambda b: len(self.prompts[b // n]), cfg.max_new_tokens,
                                    eng.ecfg.chunk_steps):
      p = b // n
      plen = len(self.prompts[p])
      if p not in self.prefills:
        toks = np.full((1, ops.prompt_bucket(plen, cfg)), cfg.pad_id, np.int32)
        toks[0, :plen] = self.prompts[p]
        self.prefills[p] = self.pre(self.dparams, eng._replicated(toks),
                                    eng._replicated(np.int32(plen)))
        self.n_prefill += 1
      cache, logits = self.prefills[p]
      row = self.pool.global_row(slot, self.pool.row(slot))
      self.pages, self.state, tok0, lp0 = self.ins(
          self.pages, cache, logits, eng._replicated(row), np.int32(plen), np.int32(slot),
          np.int32(b), self.key, self.state)
      # On a CPU mesh of several devices, one insert in flight at a time. A burst of
      # admissions otherwise puts dozens of collective programs ahead of their execution,
      # and XLA's CPU client deadlocks (`distributed.pace`). Resumed tiny runs hung here on
      # 1 process x 4 devices and on 2 x 2. TPU and GPU queue per device: no wait.
      if eng._paced:
        jax.block_until_ready(tok0)
      inserted.append((slot, b, tok0, lp0))
      self.left[p] -= 1
      if self.left[p] == 0:
        del self.prefills[p]
    return inserted

  def reserve(self) -> None:
    """Step 2: pages ahead in every running slot; an evicted response drops what was read
    of it and waits to be inserted again, its slot idle on the device."""
    for slot, b in self.sched.reserve(self.ahead):
      self.cur_tok.pop(b, None)
      self.cur_lp.pop(b, None)
      self.left[b // self.eng.cfg.n_per_prompt] += 1
      self.state = dict(self.state, active_S=self.state["active_S"].at[slot].set(False))

  def dispatch(self, inserted) -> tuple:
    """Step 3, not waited on: the table's changes sent, a decode chunk over its rows. Returns
    what `read` needs: (outputs and the inserts' tokens 0, each slot's response, rows, the
    chunk's number)."""
    eng, sched, pool = self.eng, self.sched, self.pool
    owners = [None if run is None else run.response for run in sched.running]
    placed = {b: (slot, t0, l0) for slot, b, t0, l0 in inserted if owners[slot] == b}
    # Once enough slots have freed up for waiting responses the chunk ends early.
    exit_below = max(0, sched.busy() - max(1, eng.ecfg.slots // 8)) if sched.pending else 0
    self.kv_used += pool.used / pool.num_pages
    self.table = eng._update_table(self.table, *pool.changes())
    # The rows: the smallest bucket holding every slot the host holds as occupied (a
    # superset of the live ones, which it sees one chunk late), padded with idle slots.
    rows = slots_lib.chunk_rows([o is not None for o in owners], eng.ecfg.replicas,
                                eng.ecfg.bucket_rows)
    args = (self.dparams, self.pages, self.table, self.state, np.int32(exit_below))
    eng._warm(self.dec, args, (self.graphdef, str(self.impl)))
    self.pages, self.state, toks, lps, steps, seen = self.dec(
        *args, eng._replicated(np.asarray(rows, np.int32)))
    self.trace.append(("dispatch", self.number))
    self.number += 1
    return (toks, lps, steps, seen, placed), owners, rows, self.number - 1

  def read(self, chunk) -> None:
    """Step 4: a dispatched chunk's tokens to the slots that still hold their response (one
    device_get); a finished response moves to the output and frees its slot and pages."""
    outs, owners, rows, number = chunk
    toks, lps, steps, (t_S, active_S), placed = jax.device_get(outs)
    self.trace.append(("read", number))
    running = self.sched.running
    for b, (slot, t0, l0) in placed.items():  # placed holds owners only (dispatch)
      if running[slot] is not None and running[slot].response == b:
        self.cur_tok[b], self.cur_lp[b] = [int(t0)], [float(l0)]
    self.chunks += 1
    self.steps_total += int(steps)
    self.row_steps += int(steps) * len(rows)
    self.per_bucket[len(rows)] += 1
    for j, slot in enumerate(rows):  # every slot owned at dispatch is in the rows
      run = running[slot]
      if run is None or run.response != owners[slot]:
        continue  # freed or evicted since this chunk was dispatched
      b = run.response
      got = int(t_S[slot]) - len(self.cur_tok[b])
      self.cur_tok[b] += toks[j, :got].tolist()
      self.cur_lp[b] += lps[j, :got].tolist()
      self.busy_steps += got
      finished = not bool(active_S[slot])
      self.sched.advance(slot, got, finished)
      if finished:
        self.out_tok[b], self.out_lp[b] = self.cur_tok.pop(b), self.cur_lp.pop(b)

  def stats(self, seconds: float) -> dict[str, float]:
    """The call's metrics (`Engine.last_stats`), `seconds` its wall time."""
    tokens, chunks, steps = sum(len(x) for x in self.out_tok), self.chunks, self.steps_total
    return {
        "rollout_tokens": float(tokens), "rollout_seconds": seconds,
        "rollout_tokens_per_s": tokens / max(seconds, 1e-9),
        "decode_steps": float(steps), "decode_chunks": float(chunks),
        "slot_occupancy": self.busy_steps / max(1, steps * self.eng.ecfg.slots),
        "row_occupancy": self.busy_steps / max(1, self.row_steps),
        "kv_pool_occupancy": self.kv_used / max(1, chunks),
        "prefills": float(self.n_prefill), "evictions": float(self.sched.evictions),
        **{f"decode_chunks_rows_{n}": float(c) for n, c in self.per_bucket.items()}}
