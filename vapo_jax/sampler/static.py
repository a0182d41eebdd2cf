"""The static sampler: one prefill per prompt, a compiled decode loop per call, groups.

The package's rollout sampler is the engine (`sampler.continuous`); this one runs with
sampling.engine="static" and is the engine's oracle in the tests and its comparison in the
benchmarks.

Model contract (`vapo_jax.models.transformer.Transformer`, or any nnx.Module
like it):

  model(tokens_BxT, positions_BxT, kv_mask_BxS, *, cache, cache_index)
      -> (hidden_BxTxD, cache)
  model.logits(hidden_...xD) -> logits_...xV
  init_cache(batch, max_len) -> pytree of arrays, each with one batch axis and
      one sequence axis

The model travels as `nnx.split` graphdef (static) + state (arrays), through
plain `jax.jit`.

Algorithm for Bp prompts, n responses each (B = Bp * n rows, row = p * n + j):

  1. Prefill the Bp left-padded prompts [Bp, P] into a small [Bp, P] cache
     (once per prompt, not n times); positions = max(cumsum(mask) - 1, 0).
  2. Repeat that cache n times along batch and write it into slots [0, P) of
     the persistent [B, S] cache (S = cfg.total_cache_len). The persistent
     cache is donated and handed back, so one buffer per row count is
     allocated for the whole run.
  3. Token 0 is drawn from the prefill logits at the last prompt position;
     step t >= 1 feeds token t-1 at slot P + t - 1 and draws token t, inside
     `jax.lax.while_loop`, which exits as soon as every row has produced a
     stop token, or at t = R.
  4. The loop runs in `cfg.decode_windows` stretches of steps, one while_loop
     each, over a copy of the cache cut to the static window W its steps need
     (`ops.decode_windows`); the window is written back after the stretch.
     Attention then reads ~(P + t) slots at step t instead of S.

Slots not written in this call (stale values from an earlier call, or padding)
are masked out by kv_mask, so reusing the buffer changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from vapo_jax.sampler import types
from vapo_jax.sampler import ops
from vapo_jax import sharding as shd
from vapo_jax.models import transformer

InitCacheFn = Callable[[int, int], Any]


def cache_axes(init_cache: InitCacheFn) -> list[tuple[int, int]]:
  """[(batch_axis, seq_axis)] per cache leaf, by shape inference (no memory).

  Raises:
    ValueError: a leaf without exactly one batch axis and one sequence axis.
  """
  a = jax.tree.leaves(jax.eval_shape(lambda: init_cache(2, 3)))
  b = jax.tree.leaves(jax.eval_shape(lambda: init_cache(5, 7)))
  axes = []
  for i, (la, lb) in enumerate(zip(a, b)):
    pairs = list(zip(la.shape, lb.shape))
    batch = [d for d, xy in enumerate(pairs) if xy == (2, 5)]
    seq = [d for d, xy in enumerate(pairs) if xy == (3, 7)]
    if len(batch) != 1 or len(seq) != 1 or len(la.shape) != len(lb.shape):
      raise ValueError(
          f"init_cache(batch, max_len) leaf {i} has shapes {la.shape} (2, 3) "
          f"and {lb.shape} (5, 7): every cache leaf needs one batch and one "
          "sequence axis")
    axes.append((batch[0], seq[0]))
  if not axes:
    raise ValueError("init_cache(batch, max_len) returned no arrays")
  return axes


def write_prefill(cache: Any, small: Any, n: int, axes) -> Any:
  """Writes each prefill leaf, repeated n times, into slots [0, P) of cache."""
  leaves, treedef = jax.tree.flatten(cache)
  out = []
  for big, sm, (b_ax, _) in zip(leaves, jax.tree.leaves(small), axes):
    sm = jnp.repeat(sm, n, axis=b_ax) if n > 1 else sm
    out.append(
        jax.lax.dynamic_update_slice(big, sm.astype(big.dtype),
                                     (0,) * big.ndim))
  return jax.tree.unflatten(treedef, out)


def _window(cache: Any, w: int, axes) -> Any:
  """Each cache leaf cut to its first w sequence slots (a copy)."""
  leaves, treedef = jax.tree.flatten(cache)
  return jax.tree.unflatten(treedef, [
      jax.lax.slice_in_dim(x, 0, w, axis=s_ax)
      for x, (_, s_ax) in zip(leaves, axes)])


def _write_window(cache: Any, window: Any) -> Any:
  """Writes each window leaf back over the first slots of its cache leaf."""
  return jax.tree.map(
      lambda big, sm: jax.lax.dynamic_update_slice(big, sm, (0,) * big.ndim),
      cache, window)


def _apply(graphdef, state, tokens_BxT, positions_BxT, kv_mask_BxS, cache, cache_index):
  """One model call: (float32 logits [B, V] of each row's last position, cache)."""
  model = nnx.merge(graphdef, state)
  hidden, cache = model(tokens_BxT, positions_BxT, kv_mask_BxS, cache=cache,
                        cache_index=cache_index)
  return ops.last_logits(model, hidden[:, -1]), cache


def _prefill(graphdef, init_cache: InitCacheFn, cfg: ops.SamplingConfig, axes,
             constrain: Callable[[Any, int | None], Any], state, prompt_BxP, prompt_mask_BxP,
             cache):
  """Steps 1-2 (see module): prefill Bp prompts once, repeat each n times into `cache`.

  Returns (logits_BxV at each row's last prompt slot, prompt_len_B, kv_mask_BxS int32: 1 on
  the real prompt slots, cache), B = Bp n rows.
  """
  bp, p = prompt_BxP.shape
  n = cfg.n_per_prompt
  b, s = bp * n, jax.tree.leaves(cache)[0].shape[axes[0][1]]
  # 1. Prefill, once per prompt.
  mask_BpxP = prompt_mask_BxP.astype(jnp.int32)
  positions_BpxP = jnp.maximum(jnp.cumsum(mask_BpxP, axis=1) - 1, 0)
  logits_BpxV, small = _apply(graphdef, state, prompt_BxP, positions_BpxP, mask_BpxP,
                              init_cache(bp, p), 0)
  # 2. Group repeat into the persistent cache.
  cache = constrain(write_prefill(cache, small, n, axes), None)
  logits_BxV = constrain(jnp.repeat(logits_BpxV, n, axis=0), 0)
  prompt_len_B = constrain(jnp.repeat(jnp.sum(mask_BpxP, axis=1), n), 0)
  kv_mask_BxS = jnp.zeros((b, s), jnp.int32)
  kv_mask_BxS = jax.lax.dynamic_update_slice(kv_mask_BxS,
                                             jnp.repeat(mask_BpxP, n, axis=0),
                                             (0, 0))
  kv_mask_BxS = constrain(kv_mask_BxS, 0)
  return logits_BxV, prompt_len_B, kv_mask_BxS, cache


def _decode_step(graphdef, cfg: ops.SamplingConfig, constrain: Callable[[Any, int | None], Any],
                 state, tok_B, positions_B, kv_mask_BxS, cache, slot, key_t):
  """One token of every row: feed tok_B at cache `slot`, draw the next with key_t.

  Returns (new_B int32, logp_B float32, cache), rows batch-sharded; the loop body masks
  finished rows.
  """
  logits_BxV, cache = _apply(graphdef, state, tok_B[:, None], positions_B[:, None],
                             kv_mask_BxS, cache, slot)
  new_B, lp_B = ops.sample_step(key_t, logits_BxV, cfg)
  return constrain(new_B, 0), constrain(lp_B, 0), cache


def _generate(graphdef, init_cache: InitCacheFn, cfg: ops.SamplingConfig,
              axes, constrain: Callable[[Any, int | None], Any], state,
              prompt_BxP, prompt_mask_BxP, cache, key) -> tuple[types.Rollout, Any]:
  """The compiled body: prefill, group repeat, decode loop (see module)."""
  bp, p = prompt_BxP.shape
  n, r = cfg.n_per_prompt, cfg.max_new_tokens
  b = bp * n
  stop_S = jnp.asarray(cfg.stop_token_ids or (-1,), jnp.int32)

  def is_stop(tokens_B):
    return jnp.any(tokens_B[:, None] == stop_S[None, :], axis=-1)

  logits_BxV, prompt_len_B, kv_mask_BxS, cache = _prefill(
      graphdef, init_cache, cfg, axes, constrain, state, prompt_BxP, prompt_mask_BxP, cache)

  # 3. Token 0 from the prefill logits, then the loop.
  tok_B, logp_B = ops.sample_step(
      jax.random.fold_in(key, 0), logits_BxV, cfg)
  response_BxR = jnp.full((b, r), cfg.pad_id, jnp.int32).at[:, 0].set(tok_B)
  logp_BxR = jnp.zeros((b, r), jnp.float32).at[:, 0].set(logp_B)
  done_B = is_stop(tok_B)
  lengths_B = jnp.ones((b,), jnp.int32)

  def body(carry):
    (t, cache, tok_B, done_B, lengths_B, response_BxR, logp_BxR,
     kv_mask_BxS) = carry
    slot = p + t - 1
    kv_mask_BxS = jax.lax.dynamic_update_slice(kv_mask_BxS,
                                               jnp.ones((b, 1), jnp.int32),
                                               (0, slot))
    new_B, lp_B, cache = _decode_step(graphdef, cfg, constrain, state, tok_B,
                                      prompt_len_B + t - 1, kv_mask_BxS, cache, slot,
                                      jax.random.fold_in(key, t))
    new_B = jnp.where(done_B, cfg.pad_id, new_B)
    lp_B = jnp.where(done_B, 0.0, lp_B)
    response_BxR = jax.lax.dynamic_update_slice(response_BxR, new_B[:, None],
                                                (0, t))
    logp_BxR = jax.lax.dynamic_update_slice(logp_BxR, lp_B[:, None], (0, t))
    lengths_B = lengths_B + (~done_B).astype(jnp.int32)
    done_B = done_B | is_stop(new_B)
    return (t + 1, cache, new_B, done_B, lengths_B, response_BxR, logp_BxR,
            kv_mask_BxS)

  t = jnp.int32(1)
  for _, t_end, w in ops.decode_windows(p, cfg):

    def cond(carry, t_end=t_end):
      t, done_B = carry[0], carry[3]
      return (t < t_end) & ~jnp.all(done_B)

    carry = (t, constrain(_window(cache, w, axes), None), tok_B, done_B, lengths_B,
             response_BxR, logp_BxR, kv_mask_BxS[:, :w])
    carry = jax.lax.while_loop(cond, body, carry)
    (t, window, tok_B, done_B, lengths_B, response_BxR, logp_BxR,
     window_mask_BxW) = carry
    cache = constrain(_write_window(cache, window), None)
    kv_mask_BxS = jax.lax.dynamic_update_slice(kv_mask_BxS, window_mask_BxW,
                                               (0, 0))

  real_BxR = jnp.arange(r)[None, :] < lengths_B[:, None]
  response_mask_BxR = real_BxR.astype(jnp.float32)
  out = types.Rollout(
      prompt_BxP=jnp.repeat(prompt_BxP, n, axis=0),
      prompt_mask_BxP=jnp.repeat(
          prompt_mask_BxP.astype(jnp.float32), n, axis=0),
      response_BxR=response_BxR,
      response_mask_BxR=response_mask_BxR,
      lengths_B=lengths_B,
      truncated_B=~done_B,
      logp_BxR=logp_BxR,
      group_ids_B=jnp.arange(b, dtype=jnp.int32) // n,
  )
  return jax.tree.map(lambda x: constrain(x, 0), out), cache


class Sampler:
  """Compiled group sampler for one model graph and one SamplingConfig.

  Usage:
    graphdef, state = nnx.split(model)
    sampler = Sampler.for_transformer(graphdef, model_cfg, cfg, mesh=mesh)
    # (any model: Sampler(graphdef, init_cache_fn, cfg, mesh=mesh))
    rollout = sampler(state, [[1, 2, 3], [4, 5]], jax.random.key(0))

  Sharding: prompts and every row-major array (the cache's batch axis too) are
  split over the mesh axes that the rules give the logical axis "batch" (data
  and fsdp by default); parameters keep the sharding they arrive with
  (`hf_io.from_pretrained(mesh=...)`), unless they arrive on another mesh (the
  learners' own, config mesh.train_tensor): then each call first reshards them
  onto this one under its rules (`on_mesh`).

  Holds one donated KV cache per row count and reuses it across calls. Shapes
  compiled: one per (number of prompts, prompt bucket).

  A `types.RolloutSampler` (sampling.engine="static"); the package's rollout sampler is the
  engine (`continuous.Engine`), and this one is the tests' oracle and the benchmarks'
  comparison.
  """

  continuous = False  # calls of sampling.prompts_per_call prompts (`types.RolloutSampler`)

  def __init__(self, graphdef, init_cache: InitCacheFn,
               cfg: ops.SamplingConfig, *,
               mesh: jax.sharding.Mesh | None = None,
               rules: shd.Rules = shd.DEFAULT_RULES):
    self.cfg = cfg
    self.mesh, self.rules = mesh, rules
    self.graphdef = graphdef
    self.init_cache = init_cache
    self.cache_leaf_axes = cache_axes(init_cache)
    self.batch_axes = shd.batch_axes(mesh, rules) if mesh is not None else ()
    self.batch_shards = int(np.prod([mesh.shape[a] for a in self.batch_axes
                                    ])) if mesh else 1
    self._caches: dict[int, Any] = {}
    self._allocs: dict[Any, Callable] = {}  # (rows, out sharding) -> jitted allocator
    self._movers: dict[Any, Callable] = {}  # params' mesh -> jitted reshard (`on_mesh`)
    fn = functools.partial(_generate, graphdef, init_cache, cfg, self.cache_leaf_axes,
                           self.constrain)
    self._generate = jax.jit(fn, donate_argnums=(3,))

  @classmethod
  def for_transformer(cls, graphdef, model_cfg, cfg: ops.SamplingConfig, *,
                      mesh: jax.sharding.Mesh | None = None,
                      rules: shd.Rules = shd.DEFAULT_RULES,
                      cache_dtype: Any = None) -> "Sampler":
    """A sampler for `vapo_jax.models.Transformer` (graphdef from `nnx.split`).

    If `cfg.vocab_size` is None it takes the model's `real_vocab_size`, so the
    embedding's padding rows are never sampled. The cache dtype defaults to the
    compute dtype.
    """
    if cfg.vocab_size is None and model_cfg.real_vocab_size is not None:
      cfg = dataclasses.replace(cfg, vocab_size=model_cfg.real_vocab_size)
    init = functools.partial(transformer.init_cache, model_cfg,
                             dtype=cache_dtype)
    return cls(graphdef, lambda batch, max_len: init(batch, max_len), cfg,
               mesh=mesh, rules=rules)

  def constrain(self, x, batch_axis: int | None):
    """Batch-shards an array (batch_axis=0) or each cache leaf (None)."""
    if self.mesh is None or not self.batch_axes:
      return x
    if batch_axis is not None:
      return jax.lax.with_sharding_constraint(
          x, NamedSharding(self.mesh, P(self.batch_axes)))
    leaves, treedef = jax.tree.flatten(x)
    out = []
    for leaf, (b_ax, _) in zip(leaves, self.cache_leaf_axes):
      spec = [P.UNCONSTRAINED] * leaf.ndim
      spec[b_ax] = self.batch_axes
      out.append(
          jax.lax.with_sharding_constraint(leaf,
                                           NamedSharding(self.mesh, P(*spec))))
    return jax.tree.unflatten(treedef, out)

  def on_mesh(self, state):
    """The parameters on this sampler's mesh: as they are, or (arriving on another mesh over
    the same devices) resharded onto it under its rules, a copy that lives for the call.
    Abstract parameters (ShapeDtypeStructs) come back with those shardings."""
    leaf = next(iter(jax.tree.leaves(state)), None)
    home = getattr(getattr(leaf, "sharding", None), "mesh", None)
    if self.mesh is None or home is None or home == self.mesh:
      return state
    if isinstance(leaf, jax.ShapeDtypeStruct):
      return jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                          state, shd.state_shardings(state, self.mesh, self.rules))
    if home not in self._movers:
      self._movers[home] = jax.jit(
          lambda t: t, out_shardings=shd.state_shardings(state, self.mesh, self.rules))
    return self._movers[home](state)

  def abstract_cache(self, rows: int):
    """The persistent [rows, S] KV cache as ShapeDtypeStructs, sharded as the sampler puts it.

    The layout is read from compiling the sampler's own allocation for one row per batch
    shard (the full cache may be too large to compile), then applied to `rows` rows.
    """
    s = self.cfg.total_cache_len
    alloc = lambda r: self.constrain(self.init_cache(r, s), None)  # noqa: E731
    shapes = jax.eval_shape(lambda: alloc(rows))
    if self.mesh is None:
      return shapes
    shardings = jax.jit(lambda: alloc(self.batch_shards)).lower().compile().output_shardings
    # On a one-chip mesh nothing constrains the cache: the compile above placed it on the
    # host's default (CPU) device; it belongs on the mesh, replicated.
    devices = set(self.mesh.devices.flat)
    shardings = jax.tree.map(lambda sh: sh if set(sh.device_set) <= devices
                             else NamedSharding(self.mesh, P()), shardings)
    return jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                        shapes, shardings)

  def lowerable(self, state, prompts: int) -> dict[str, Any]:
    """The sampler's own jitted programs and example args, for an AOT compile check.

    state: the model's parameters (concrete or ShapeDtypeStructs with shardings); prompts:
    Bp, the prompts of one call (at the largest prompt bucket P; B = Bp n rows, S cache
    slots). Returns {"generate", "prefill", "decode_step"} -> jitted function, and
    "<name>_args" -> a tuple of ShapeDtypeStructs such that
    `out[name].lower(*out[name + "_args"]).compile()` builds
      generate     a whole call, as `__call__` runs it (`_generate`);
      prefill      its steps 1-2 (`_prefill`): Bp prompts prefilled into the [B, S] cache;
      decode_step  one step of its decode loop (`_decode_step`) over the whole cache.
    The cache argument is donated, as in a call.
    """
    cfg = self.cfg
    bp, p = prompts, ops.prompt_bucket(cfg.max_prompt_len, cfg)
    b, s = bp * cfg.n_per_prompt, cfg.total_cache_len
    rows = NamedSharding(self.mesh, P(self.batch_axes or None)) if self.mesh else None
    rep = NamedSharding(self.mesh, P()) if self.mesh else None

    def sds(shape, dtype, sharding):
      return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)

    state = self.on_mesh(jax.tree.map(
        lambda x: sds(x.shape, x.dtype, getattr(x, "sharding", None)), state))
    cache = self.abstract_cache(b)
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = sds(key.shape, key.dtype, rep)
    prompt = (sds((bp, p), jnp.int32, rows), sds((bp, p), jnp.float32, rows))
    pre = jax.jit(functools.partial(_prefill, self.graphdef, self.init_cache, cfg,
                                    self.cache_leaf_axes, self.constrain), donate_argnums=(3,))
    step = jax.jit(functools.partial(_decode_step, self.graphdef, cfg, self.constrain),
                   donate_argnums=(4,))
    step_args = (state, sds((b,), jnp.int32, rows), sds((b,), jnp.int32, rows),
                 sds((b, s), jnp.int32, rows), cache, sds((), jnp.int32, rep), key)
    return {"generate": self._generate, "generate_args": (state, *prompt, cache, key),
            "prefill": pre, "prefill_args": (state, *prompt, cache),
            "decode_step": step, "decode_step_args": step_args}

  def _cache_for(self, rows: int, state):
    """The persistent [rows, S] cache, allocated batch-sharded on first use.

    Without a mesh, the cache goes where the parameters are: replicated over
    their mesh when they carry a NamedSharding (as `hf_io.from_pretrained`
    gives them). Otherwise the cache the first call hands back (placed on that
    mesh by sharding propagation) would differ in type from the one it got,
    and the second call would compile the whole sampler again.
    """
    if rows not in self._caches:
      s = self.cfg.total_cache_len
      out_shardings = None
      if self.mesh is None:
        leaf = next(iter(jax.tree.leaves(state)), None)
        if isinstance(getattr(leaf, "sharding", None), NamedSharding):
          out_shardings = NamedSharding(leaf.sharding.mesh, P())
      # One allocator per (rows, sharding), kept across clear_cache: a new lambda each time
      # was a new jit, traced and compiled again at every RL step (docs/speed.md).
      k = (rows, out_shardings)
      if k not in self._allocs:
        self._allocs[k] = jax.jit(lambda: self.constrain(self.init_cache(rows, s), None),
                                  out_shardings=out_shardings)
      self._caches[rows] = self._allocs[k]()
    return self._caches.pop(rows)

  def pad_prompts(
      self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads prompts to their bucket; ValueError names a too-long one."""
    cfg = self.cfg
    for i, prompt in enumerate(prompts):
      if len(prompt) > cfg.max_prompt_len:
        raise ValueError(
            f"prompt {i} has {len(prompt)} tokens, more than the budget "
            f"SamplingConfig.max_prompt_len={cfg.max_prompt_len}")
    p = ops.prompt_bucket(max(len(x) for x in prompts), cfg)
    return types.left_pad(prompts, p, cfg.pad_id)

  def __call__(self, state, prompts: Sequence[Sequence[int]],
               key: jax.Array) -> types.Rollout:
    """Samples n responses for each prompt (lists of token ids, any lengths)."""
    if not prompts:
      raise ValueError("no prompts given")
    prompt_BxP, mask_BxP = self.pad_prompts(prompts)
    return self.generate_padded(state, prompt_BxP, mask_BxP, key)

  def generate_padded(self, state, prompt_BxP, prompt_mask_BxP,
                      key: jax.Array) -> types.Rollout:
    """Like __call__ for prompts already left-padded to a static length P.

    The prompts are host arrays (the same on every host), or global jax.Arrays
    already split over the batch axes (multi-host: each host filled its rows).

    Raises:
      ValueError: a row that is empty or not left-padded (its last slot must be
        real), P + max_new_tokens beyond the cache, or prompts not divisible
        over the batch shards.
    """
    cfg = self.cfg
    is_global = (isinstance(prompt_mask_BxP, jax.Array)
                 and not prompt_mask_BxP.is_fully_addressable)
    if is_global:  # Check the rows this host holds; the others check theirs.
      last = [(shard.index[0].start or 0) + np.flatnonzero(
          np.asarray(shard.data)[:, -1] == 0)
              for shard in prompt_mask_BxP.addressable_shards]
      bad = np.concatenate(last)
    else:
      prompt_mask_BxP = np.asarray(prompt_mask_BxP, np.float32)
      bad = np.flatnonzero(prompt_mask_BxP[:, -1] == 0)
    bp, p = prompt_BxP.shape
    if bad.size:
      raise ValueError(
          f"prompt {bad[0]} is empty or not left-padded: its mask must end "
          "with a real token (mask[:, -1] == 1)")
    if p + cfg.max_new_tokens > cfg.total_cache_len:
      raise ValueError(
          f"prompt length {p} + max_new_tokens {cfg.max_new_tokens} = "
          f"{p + cfg.max_new_tokens} overflows the KV cache of "
          f"{cfg.total_cache_len} slots "
          f"(SamplingConfig.cache_len / max_prompt_len)")
    if bp % self.batch_shards:
      raise ValueError(
          f"{bp} prompts cannot be split over the {self.batch_shards} batch "
          f"shards of mesh axes {self.batch_axes}; pass a multiple of "
          f"{self.batch_shards}")
    if not is_global:
      prompt_BxP = self._place(np.asarray(prompt_BxP, np.int32))
      prompt_mask_BxP = self._place(prompt_mask_BxP)
    rows = bp * cfg.n_per_prompt
    state = self.on_mesh(state)
    cache = self._cache_for(rows, state)
    out, self._caches[rows] = self._generate(state, prompt_BxP, prompt_mask_BxP,
                                             cache, key)
    return out

  def _place(self, x_BxP: np.ndarray) -> jax.Array:
    """Host array -> batch-sharded global array (same array on every host)."""
    if self.mesh is None or not self.batch_axes:
      return jnp.asarray(x_BxP)
    sharding = NamedSharding(self.mesh, P(self.batch_axes))
    return jax.make_array_from_callback(x_BxP.shape, sharding,
                                        lambda idx: x_BxP[idx])

  def clear_cache(self):
    """Frees the persistent KV caches (e.g. before big train steps)."""
    self._caches.clear()
