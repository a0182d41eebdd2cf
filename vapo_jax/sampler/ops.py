"""Sampling options and per-step sampling math: temperature, top-k/p, greedy.

Pure jax; no flax. Both samplers (`sampler.static`, `sampler.continuous`) call
`last_logits` on the model's last hidden state and `sample_step` once per generated token.

Conventions, with logits `z_BxV` of the full (padded) embedding vocabulary:

  * Rows `v >= vocab_size` (the embedding's padding rows, no tokenizer token)
    get `-inf` before anything else, so they are never sampled and carry no
    probability mass.
  * Behaviour log-prob of token `y`:  `log softmax(z / T)[y]` over the real
    vocabulary -- the temperature-scaled FULL distribution, before top-k /
    top-p. This is the quantity PPO's importance ratio needs and what
    `policy.response_logprobs(..., temperature=T)` computes by teacher forcing.
    (The distribution actually sampled from is the filtered one below; the two
    differ only when top-k / top-p cut the tail.)
  * Sampling distribution (the order of transformers' logits warpers):
      1. `z' = z / T`;
      2. top-k: keep the k largest `z'` (k = 0: all);
      3. top-p: on the renormalised kept set sorted descending, keep token i
         iff the mass of the tokens before it is `< top_p` (the most likely
         token is always kept);
      4. draw from softmax of the kept logits (`draw`: two-level inverse CDF;
         the top-k path draws among its k candidates with Gumbel-max).
  * Greedy: `argmax z` over the real vocabulary (ties: lowest id, as
    `torch.argmax`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vapo_jax.models import platform

_NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Options of one sampler; hashable, as a static argument of the loop.

  Attributes:
    max_new_tokens: R, the static length of every response (the trainer's
      shapes).
    temperature: T > 0; logits are divided by T. Use `greedy=True` for argmax
      decoding.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    top_k: keep the k most likely tokens; 0 disables it.
    greedy: argmax decoding (log-probs are still those of softmax(z / T)).
    stop_token_ids: a response ends right after any of these (the stop token is
      kept and counted in the response mask and length).
    pad_id: fills prompts on the left and responses on the right.
    vocab_size: number of real tokens; logits rows at or above it are never
      sampled. None: all rows of the logits are real.
    n_per_prompt: n responses per prompt (group sampling); rows
      `p * n .. p * n + n - 1` answer prompt p and share one prefill.
    max_prompt_len: the prompt budget; longer prompts raise ValueError.
    prompt_buckets: sorted prompt lengths to pad to; empty: powers of two from
      `min_prompt_bucket`, capped at `max_prompt_len`.
    min_prompt_bucket: the smallest power-of-two bucket.
    cache_len: KV-cache slots per row; None: `max_prompt_len + max_new_tokens`.
      One cache of this length serves every prompt bucket (prompt in slots
      [0, P), response after).
    decode_windows: the decode loop runs in this many consecutive stretches of
      steps, each attending over a static window of the cache just long enough
      for its last step (`decode_windows` below), instead of all cache slots at
      every step. More windows: less attention work, one more compiled loop
      body each. 1: every step attends over the whole cache. Each window is a
      copy of the cache's first W slots, so peak cache memory grows by up to
      one window; set 1 where the KV cache is what limits the batch.
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  greedy: bool = False
  stop_token_ids: tuple[int, ...] = ()
  pad_id: int = 0
  vocab_size: int | None = None
  n_per_prompt: int = 1
  max_prompt_len: int = 512
  prompt_buckets: tuple[int, ...] = ()
  min_prompt_bucket: int = 16
  cache_len: int | None = None
  decode_windows: int = 4

  def __post_init__(self):

    def bad(field, value, allowed):
      raise ValueError(f"SamplingConfig.{field}={value!r}: must be {allowed}.")

    if self.max_new_tokens < 1:
      bad("max_new_tokens", self.max_new_tokens, ">= 1")
    if not self.temperature > 0:
      bad("temperature", self.temperature,
          "> 0 (for argmax decoding set greedy=True)")
    if not 0 < self.top_p <= 1:
      bad("top_p", self.top_p, "in (0, 1]")
    if self.top_k < 0:
      bad("top_k", self.top_k, ">= 0 (0 disables top-k)")
    if self.vocab_size is not None and self.vocab_size < 1:
      bad("vocab_size", self.vocab_size, ">= 1 or None")
    if self.n_per_prompt < 1:
      bad("n_per_prompt", self.n_per_prompt, ">= 1")
    if self.max_prompt_len < 1:
      bad("max_prompt_len", self.max_prompt_len, ">= 1")
    if self.min_prompt_bucket < 1:
      bad("min_prompt_bucket", self.min_prompt_bucket, ">= 1")
    if list(self.prompt_buckets) != sorted(set(self.prompt_buckets)) or any(
        b < 1 for b in self.prompt_buckets):
      bad("prompt_buckets", self.prompt_buckets,
          "strictly increasing positive lengths")
    if self.prompt_buckets and self.prompt_buckets[-1] < self.max_prompt_len:
      bad("prompt_buckets", self.prompt_buckets,
          f"ending at or above max_prompt_len={self.max_prompt_len}")
    if self.decode_windows < 1:
      bad("decode_windows", self.decode_windows, ">= 1")
    if self.cache_len is not None and self.cache_len < 2:
      bad("cache_len", self.cache_len, ">= 2 or None")
    # Tuples keep the config hashable even when a list was passed.
    object.__setattr__(self, "stop_token_ids",
                       tuple(int(t) for t in self.stop_token_ids))
    object.__setattr__(self, "prompt_buckets",
                       tuple(int(b) for b in self.prompt_buckets))

  @property
  def total_cache_len(self) -> int:
    """Cache slots per row: cache_len, or max_prompt_len + max_new_tokens."""
    if self.cache_len is not None:
      return self.cache_len
    return self.max_prompt_len + self.max_new_tokens


def power_buckets(max_prompt: int, smallest: int) -> tuple[int, ...]:
  """Powers of two from `smallest` below max_prompt, then max_prompt itself; smallest <= 0:
  (max_prompt,) alone. E.g. (1024, 128) -> (128, 256, 512, 1024); (1000, 128) -> (128,
  256, 512, 1000)."""
  if smallest <= 0:
    return (int(max_prompt),)
  out, b = [], 1 << max(0, int(smallest) - 1).bit_length()
  while b < max_prompt:
    out.append(b)
    b *= 2
  return tuple(out) + (int(max_prompt),)


def prompt_bucket(length: int, cfg: SamplingConfig) -> int:
  """The padded length P of a batch whose longest prompt has `length` tokens.

  The smallest entry of `cfg.prompt_buckets` that is >= length; without explicit
  buckets the smallest power of two >= max(length, min_prompt_bucket), capped at
  max_prompt_len. A long run therefore compiles at most ~log2(max_prompt_len)
  prompt shapes.

  Raises:
    ValueError: length > cfg.max_prompt_len, or no bucket fits it.
  """
  if length > cfg.max_prompt_len:
    raise ValueError(f"prompt of {length} tokens is longer than the budget "
                     f"SamplingConfig.max_prompt_len={cfg.max_prompt_len}")
  if cfg.prompt_buckets:
    for b in cfg.prompt_buckets:
      if b >= length:
        return b
    raise ValueError(
        f"no prompt bucket in {cfg.prompt_buckets} holds {length} tokens")
  b = max(1, cfg.min_prompt_bucket)
  while b < length:
    b *= 2
  return min(b, cfg.max_prompt_len)


def decode_windows(prompt_len: int, cfg: SamplingConfig
                   ) -> tuple[tuple[int, int, int], ...]:
  """Static (t_start, t_end, W) stretches of the decode loop; see the config.

  Step t (1 <= t < R) writes cache slot P + t - 1 and attends over slots
  [0, P + t), so the steps [t_start, t_end) need only the first
  W = P + t_end - 1 slots. The R - 1 steps are split into
  n = min(decode_windows, R - 1) stretches of near-equal length; the last
  window is P + R - 1 <= cache length.

  Attention work relative to one window of all S slots:
  sum_c (t_end_c - t_start_c) * W_c / ((R - 1) * S).
  """
  steps = cfg.max_new_tokens - 1
  n = max(1, min(cfg.decode_windows, steps))
  bounds = [1 + (steps * i) // n for i in range(n + 1)]
  return tuple((a, b, prompt_len + b - 1)
               for a, b in zip(bounds[:-1], bounds[1:]) if b > a)


def last_logits(model, hidden_BxD: jax.Array) -> jax.Array:
  """float32 logits [B, V] of one position per row: `model.logits(hidden)`.

  On CPU, for a model with a tied head (`head_weight()` is the [V, D]
  embedding, transposed), the product is computed vocab-major, logits_VxB =
  E h^T, then transposed: for a decode batch (B ~ 16) XLA CPU's kernel for
  that orientation runs the 32k x 512 head ~1.5x faster than the batch-major
  one (8.2 vs 13.0 ms, B=16, V=32768, D=512, 2 cores). The optimization
  barrier keeps XLA from folding the transpose back into the dot. Same
  operands and accumulation dtype as `Transformer.logits`, so only the
  summation order may differ. An untied `lm_head` is stored [D, V]; the
  vocab-major product over that layout runs 7x slower than the plain one (48
  vs 6.5 ms, same shapes), so it keeps `model.logits`.
  """
  head = getattr(model, "head_weight", None)
  cfg = getattr(model, "cfg", None)
  dt = getattr(cfg, "dtype", None)
  if (head is None or dt is None or platform.target() != "cpu"
      or not getattr(cfg, "tie_word_embeddings", False)):
    return model.logits(hidden_BxD)
  logits_VxB = jax.lax.dot_general(
      head().astype(dt), hidden_BxD.astype(dt), (((0,), (1,)), ((), ())),
      preferred_element_type=jnp.float32)
  return jax.lax.optimization_barrier(logits_VxB).T


def mask_padded_vocab(logits_BxV: jax.Array,
                      vocab_size: int | None) -> jax.Array:
  """float32 logits with rows `v >= vocab_size` set to -inf."""
  logits_BxV = logits_BxV.astype(jnp.float32)
  v = logits_BxV.shape[-1]
  if vocab_size is None or vocab_size >= v:
    return logits_BxV
  real_V = jnp.arange(v) < vocab_size
  return jnp.where(real_V, logits_BxV, _NEG_INF)


def behaviour_logprobs(logits_BxV: jax.Array, tokens_B: jax.Array,
                       cfg: SamplingConfig) -> jax.Array:
  """`log softmax(z / T)[token]` over the real vocabulary, float32 [B]."""
  scaled_BxV = mask_padded_vocab(logits_BxV, cfg.vocab_size) / cfg.temperature
  logp_BxV = jax.nn.log_softmax(scaled_BxV, axis=-1)
  return jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]


def _top_p_keep(sorted_logits_BxK: jax.Array, top_p: float) -> jax.Array:
  """Keep mask of descending-sorted logits: mass before token i < top_p."""
  probs_BxK = jax.nn.softmax(sorted_logits_BxK, axis=-1)
  mass_before_BxK = jnp.cumsum(probs_BxK, axis=-1) - probs_BxK
  keep_BxK = mass_before_BxK < top_p
  return keep_BxK.at[:, 0].set(True)


def _order_key(x: jax.Array) -> jax.Array:
  """int32 keys with key(a) < key(b) iff a < b, for non-NaN float32 x."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
  return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def _from_order_key(key: jax.Array) -> jax.Array:
  """Inverse of `_order_key` (the map is its own inverse on int32)."""
  bits = jnp.where(key < 0, key ^ jnp.int32(0x7FFFFFFF), key)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def top_p_keep(z_BxV: jax.Array, top_p: float) -> jax.Array:
  """Nucleus keep mask of logits, exactly the sort rule, without sorting.

  The rule (`_top_p_keep` on the stable descending sort, ties in id order):
  with q = softmax(z), keep id i iff the mass before it,

    m_i = sum_{z_j > z_i} q_j + sum_{z_j = z_i, j < i} q_j,

  is < top_p. With A(v) = sum_{z_j > v} q_j (non-increasing in v), the kept
  ids are those above the threshold z* = min{z_j : A(z_j) < top_p}, plus the
  first ceil((top_p - A(z*)) / q(z*)) ids (by id) of the group tied at z*.
  z* is found by bisection over the int32 order keys of float32 (32 rounds,
  each one masked sum over V), so the cost is O(32 V) per row instead of a
  sort. Float32 sums run in another order than the sorted cumsum, so an id
  whose m_i lies within rounding (~1e-7) of top_p may be decided differently.

  Args:
    z_BxV: float32 logits (-inf: never kept unless every id is -inf).
    top_p: nucleus mass in (0, 1].

  Returns:
    bool [B, V].
  """
  z_BxV = z_BxV.astype(jnp.float32)
  q_BxV = jax.nn.softmax(z_BxV, axis=-1)

  def mass_above(v_B):
    return jnp.sum(jnp.where(z_BxV > v_B[:, None], q_BxV, 0.0), axis=-1)

  def bisect(_, lo_hi):
    lo_B, hi_B = lo_hi
    mid_B = (lo_B >> 1) + (hi_B >> 1) + (lo_B & hi_B & 1)  # floor, no overflow
    ok_B = mass_above(_from_order_key(mid_B)) < top_p
    return jnp.where(ok_B, lo_B, mid_B + 1), jnp.where(ok_B, mid_B, hi_B)

  lo_B = _order_key(jnp.min(z_BxV, axis=-1))
  hi_B = _order_key(jnp.max(z_BxV, axis=-1))
  _, key_B = jax.lax.fori_loop(0, 32, bisect, (lo_B, hi_B))
  thresh_B1 = _from_order_key(key_B)[:, None]
  above_B1 = mass_above(thresh_B1[:, 0])[:, None]
  tied_BxV = z_BxV == thresh_B1
  rank_BxV = jnp.cumsum(tied_BxV.astype(jnp.int32), axis=-1) - 1
  q_tied_B1 = jnp.max(jnp.where(tied_BxV, q_BxV, 0.0), axis=-1, keepdims=True)
  tie_kept_BxV = above_B1 + rank_BxV.astype(jnp.float32) * q_tied_B1 < top_p
  return (z_BxV > thresh_B1) | (tied_BxV & tie_kept_BxV)


def filtered_logits(logits_BxV: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """Logits of the sampling distribution over all V ids (-inf: filtered).

  Reference form of steps 1-3 in the module docstring (a full sort);
  `sample_step` draws from the same distribution with a cheaper path when top-k
  is set.
  """
  z_BxV = mask_padded_vocab(logits_BxV, cfg.vocab_size) / cfg.temperature
  v = z_BxV.shape[-1]
  if cfg.top_k and cfg.top_k < v:
    kth_B = jax.lax.top_k(z_BxV, cfg.top_k)[0][:, -1]
    z_BxV = jnp.where(z_BxV >= kth_B[:, None], z_BxV, _NEG_INF)
  if cfg.top_p < 1.0:
    order_BxV = jnp.argsort(-z_BxV, axis=-1, stable=True)
    sorted_BxV = jnp.take_along_axis(z_BxV, order_BxV, axis=-1)
    keep_sorted_BxV = _top_p_keep(sorted_BxV, cfg.top_p)
    rows_B1 = jnp.arange(z_BxV.shape[0])[:, None]
    keep_BxV = jnp.zeros(z_BxV.shape, bool)
    keep_BxV = keep_BxV.at[rows_B1, order_BxV].set(keep_sorted_BxV)
    z_BxV = jnp.where(keep_BxV, z_BxV, _NEG_INF)
  return z_BxV


def draw(key: jax.Array, z_BxV: jax.Array, block: int = 128) -> jax.Array:
  """One draw per row from softmax(z_BxV) by two-level inverse CDF; int32 [B].

  Picks a block of `block` consecutive ids with probability its mass, then an
  id inside it: two uniforms per row instead of Gumbel noise over all V ids
  (threefry over B x V dominated the sampling time on CPU). Prefix sums run
  over at most max(V / block, block) terms, so float32 rounding moves a
  probability by ~1e-6 at most. Ids with zero mass (-inf logits) are never
  drawn.
  """
  b, v = z_BxV.shape
  nb = -(-v // block)
  z_BxV = jnp.pad(
      z_BxV.astype(jnp.float32), ((0, 0), (0, nb * block - v)),
      constant_values=_NEG_INF)
  p_BxV = jnp.exp(z_BxV - jnp.max(z_BxV, axis=-1, keepdims=True))
  p_BxNxK = p_BxV.reshape(b, nb, block)
  k_block, k_inner = jax.random.split(key)

  def invert(k, p_BxM):
    cdf_BxM = jnp.cumsum(p_BxM, axis=-1)
    u_B = (1.0 - jax.random.uniform(k, (b,))) * cdf_BxM[:, -1]  # in (0, total]
    i_B = jnp.sum((cdf_BxM < u_B[:, None]).astype(jnp.int32), axis=-1)
    return jnp.minimum(i_B, p_BxM.shape[-1] - 1)

  blk_B = invert(k_block, jnp.sum(p_BxNxK, axis=-1))
  p_BxK = jnp.take_along_axis(p_BxNxK, blk_B[:, None, None], axis=1)[:, 0]
  return (blk_B * block + invert(k_inner, p_BxK)).astype(jnp.int32)


def sample_step(key: jax.Array, logits_BxV: jax.Array,
                cfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row: (tokens_B int32, behaviour logp_B float32).

  The same key and logits give the same tokens, on any number of devices (the
  draws use the partitionable threefry PRNG, independent of sharding).
  """
  z_BxV = mask_padded_vocab(logits_BxV, cfg.vocab_size)
  v = z_BxV.shape[-1]
  if cfg.greedy:
    tokens_B = jnp.argmax(z_BxV, axis=-1)
  elif cfg.top_k and cfg.top_k < v:
    # Only the k candidates are sorted and drawn from: O(V) selection + O(k)
    # sampling.
    vals_BxK, idx_BxK = jax.lax.top_k(z_BxV / cfg.temperature, cfg.top_k)
    if cfg.top_p < 1.0:
      vals_BxK = jnp.where(_top_p_keep(vals_BxK, cfg.top_p), vals_BxK, _NEG_INF)
    j_B = jax.random.categorical(key, vals_BxK, axis=-1)
    tokens_B = jnp.take_along_axis(idx_BxK, j_B[:, None], axis=-1)[:, 0]
  elif cfg.top_p < 1.0:
    # The nucleus by bisection (no sort of V), then one draw over all ids.
    scaled_BxV = z_BxV / cfg.temperature
    keep_BxV = top_p_keep(scaled_BxV, cfg.top_p)
    tokens_B = draw(key, jnp.where(keep_BxV, scaled_BxV, _NEG_INF))
  else:
    tokens_B = draw(key, z_BxV / cfg.temperature)
  tokens_B = tokens_B.astype(jnp.int32)
  return tokens_B, behaviour_logprobs(logits_BxV, tokens_B, cfg)
