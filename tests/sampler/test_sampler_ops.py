"""Sampling math: config, buckets, filtered distribution, statistical tests."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.sampler import ops
from vapo_jax.sampler.ops import SamplingConfig

# 8 logits rows, the last two are embedding padding (vocab_size=6).
LOGITS = np.array([2.0, 1.0, 0.4, -0.3, 1.6, -1.2, 9.0, 8.0])
REAL = 6


def reference_probs(logits, temperature, top_k, top_p, vocab_size):
  """float64 numpy: temperature, top-k, then top-p on the renormalised rest."""
  z = np.asarray(logits, np.float64)[:vocab_size] / temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(len(z), bool)
  kept = order[:top_k] if top_k else order
  p = np.exp(z[kept] - z[kept].max())
  p /= p.sum()
  before = np.cumsum(p) - p
  keep[kept[before < top_p]] = True
  keep[order[0]] = True
  out = np.where(keep, np.exp(z - z.max()), 0.0)
  out /= out.sum()
  return np.concatenate([out, np.zeros(len(logits) - vocab_size)])


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=1.7, top_k=3),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=1.3, top_k=4, top_p=0.75),
]


@pytest.mark.parametrize("opts", CASES)
def test_filtered_distribution_matches_reference(opts):
  cfg = SamplingConfig(max_new_tokens=1, vocab_size=REAL, **opts)
  z = ops.filtered_logits(jnp.asarray(LOGITS[None], jnp.float32), cfg)
  got = np.asarray(jax.nn.softmax(z, axis=-1))[0]
  want = reference_probs(LOGITS, opts["temperature"], opts.get("top_k", 0),
                         opts.get("top_p", 1.0), REAL)
  np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("opts", CASES)
def test_samples_follow_the_distribution(opts):
  """40k draws: each frequency within 5 sigma; filtered-out ids never drawn."""
  n = 40_000
  cfg = SamplingConfig(max_new_tokens=1, vocab_size=REAL, **opts)
  logits = jnp.broadcast_to(jnp.asarray(LOGITS, jnp.float32), (n, len(LOGITS)))
  tokens, logp = jax.jit(lambda k, z: ops.sample_step(k, z, cfg))(
      jax.random.key(3), logits)
  counts = np.bincount(np.asarray(tokens), minlength=len(LOGITS))
  want = reference_probs(LOGITS, opts["temperature"], opts.get("top_k", 0),
                         opts.get("top_p", 1.0), REAL)
  assert counts[want == 0].sum() == 0, (counts, want)
  sigma = np.sqrt(n * want * (1 - want))
  assert np.all(np.abs(counts - n * want) <= 5 * sigma + 1), (counts / n, want)
  # Chi-square over the kept tokens: below its 99.99% quantile at 5 dof, 25.7.
  kept = want > 0
  chi2 = np.sum((counts[kept] - n * want[kept])**2 / (n * want[kept]))
  assert chi2 < 25.7, chi2
  # Behaviour log-probs: the temperature-scaled FULL distribution.
  full = np.log(
      reference_probs(LOGITS, opts["temperature"], 0, 1.0, REAL)[:REAL])
  np.testing.assert_allclose(
      np.asarray(logp), full[np.asarray(tokens)], atol=1e-5)


def test_greedy_and_padded_vocab():
  cfg = SamplingConfig(max_new_tokens=1, greedy=True, vocab_size=REAL)
  tokens, logp = ops.sample_step(
      jax.random.key(0), jnp.asarray(LOGITS[None]), cfg)
  assert int(tokens[0]) == 0  # rows 6 and 7 are larger but are padding
  np.testing.assert_allclose(
      float(logp[0]), np.log(reference_probs(LOGITS, 1.0, 0, 1.0, REAL)[0]),
      atol=1e-6)
  # Without the vocab mask the padding row would win.
  tokens, _ = ops.sample_step(
      jax.random.key(0), jnp.asarray(LOGITS[None]),
      SamplingConfig(max_new_tokens=1, greedy=True))
  assert int(tokens[0]) == 6


def test_deterministic_for_a_key():
  cfg = SamplingConfig(max_new_tokens=1, top_k=5, top_p=0.9)
  z = jax.random.normal(jax.random.key(1), (64, 50))
  a, _ = ops.sample_step(jax.random.key(7), z, cfg)
  b, _ = ops.sample_step(jax.random.key(7), z, cfg)
  c, _ = ops.sample_step(jax.random.key(8), z, cfg)
  np.testing.assert_array_equal(a, b)
  assert np.any(np.asarray(a) != np.asarray(c))


def test_power_buckets():
  assert ops.power_buckets(1024, 128) == (128, 256, 512, 1024)
  assert ops.power_buckets(1000, 128) == (128, 256, 512, 1000)
  assert ops.power_buckets(1000, 100) == (128, 256, 512, 1000)   # rounded up to a power
  assert ops.power_buckets(64, 128) == (64,)
  assert ops.power_buckets(1024, 0) == (1024,)
  cfg = ops.SamplingConfig(max_new_tokens=4, max_prompt_len=1000,
                           prompt_buckets=ops.power_buckets(1000, 128))
  assert [ops.prompt_bucket(n, cfg) for n in (1, 128, 129, 513, 1000)] == [128, 128, 256,
                                                                           1000, 1000]


def test_prompt_buckets():
  cfg = SamplingConfig(max_new_tokens=4, max_prompt_len=100,
                       min_prompt_bucket=16)
  lengths = (1, 16, 17, 33, 64, 65, 100)
  buckets = [ops.prompt_bucket(n, cfg) for n in lengths]
  assert buckets == [16, 16, 32, 64, 64, 100, 100]
  cfg = SamplingConfig(max_new_tokens=4, max_prompt_len=48,
                       prompt_buckets=(8, 24, 48))
  assert [ops.prompt_bucket(n, cfg) for n in (3, 9, 30)] == [8, 24, 48]
  with pytest.raises(ValueError, match="49 tokens.*max_prompt_len=48"):
    ops.prompt_bucket(49, cfg)
  assert cfg.total_cache_len == 52


BAD_FIELDS = [("temperature", 0.0), ("top_p", 0.0), ("top_p", 1.5),
              ("top_k", -1), ("n_per_prompt", 0), ("max_new_tokens", 0),
              ("prompt_buckets", (8, 4))]


@pytest.mark.parametrize("field,value", BAD_FIELDS)
def test_config_validation_names_the_field(field, value):
  with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
    SamplingConfig(**{"max_new_tokens": 4, field: value})


@pytest.mark.parametrize("block", [8, 128])
def test_two_level_draw_across_blocks(block):
  """50 ids (7 blocks of 8 with padding, or one block); -inf ids never drawn."""
  n, v = 60_000, 50
  z = np.random.RandomState(0).normal(0, 1.5, v).astype(np.float32)
  z[[3, 17, 40, 41]] = -np.inf
  want = np.exp(z - z.max())
  want /= want.sum()
  logits = jnp.broadcast_to(jnp.asarray(z), (n, v))
  ids = jax.jit(lambda k, x: ops.draw(k, x, block=block))(
      jax.random.key(11), logits)
  counts = np.bincount(np.asarray(ids), minlength=v)
  assert counts.shape == (v,) and counts[want == 0].sum() == 0
  sigma = np.sqrt(n * want * (1 - want))
  assert np.all(np.abs(counts - n * want) <= 5 * sigma + 1), (counts / n, want)
  kept = want > 0
  chi2 = np.sum((counts[kept] - n * want[kept])**2 / (n * want[kept]))
  assert chi2 < 46 + 6 * np.sqrt(2 * 46), chi2  # 45 dof: ~6 sigma margin


def sorted_top_p_keep(z_BxV, top_p):
  """The reference: stable descending sort, `_top_p_keep`, scattered back."""
  order = jnp.argsort(-z_BxV, axis=-1, stable=True)
  keep_sorted = ops._top_p_keep(
      jnp.take_along_axis(z_BxV, order, axis=-1), top_p)
  rows = jnp.arange(z_BxV.shape[0])[:, None]
  return jnp.zeros(z_BxV.shape, bool).at[rows, order].set(keep_sorted)


def tie_heavy_logits():
  """Rows where the nucleus boundary falls inside a group of equal logits."""
  rng = np.random.RandomState(5)
  rows = [
      np.zeros(10),                                   # all tied
      np.log([4, 4, 2, 2, 2, 2, 1, 1, 1, 1.0]),       # tied steps
      np.array([3.0, 1, 1, 1, 1, 0, 0, -np.inf, 2, 2]),
      np.round(rng.normal(0, 1, 10), 1),              # ties by rounding
      np.array([-np.inf] * 9 + [0.5]),                # one real id
      np.array([50.0, -50, -50, -50, -50, -50, -50, -50, -50, -50]),
  ]
  return jnp.asarray(np.array(rows, np.float32))


@pytest.mark.parametrize("top_p", [1e-6, 0.1, 0.25, 0.3, 0.5, 0.6, 0.75,
                                   0.9, 0.999])
def test_top_p_keep_equals_the_sort_rule(top_p):
  """Bit-equal masks. (top_p = 1, which sample_step never filters with, puts
  the boundary where float32 sums of the tail round to 1: not compared.)"""
  rng = np.random.RandomState(int(top_p * 1000))
  z = rng.normal(0, 3, (64, 300)).astype(np.float32)
  z[:8, 250:] = -np.inf  # padded vocabulary
  z[8:16] = np.round(z[8:16])  # many ties
  for logits in (jnp.asarray(z), tie_heavy_logits()):
    got = jax.jit(ops.top_p_keep, static_argnums=1)(logits, top_p)
    want = sorted_top_p_keep(logits, top_p)
    # -inf ids carry no mass; the sort rule may keep them at top_p = 1.
    finite = np.isfinite(np.asarray(logits))
    np.testing.assert_array_equal(np.asarray(got) & finite,
                                  np.asarray(want) & finite)
    assert np.all(np.asarray(got).sum(-1) >= 1)


def test_top_p_keep_exact_boundaries():
  """Four equal ids: mass before them is 0, .25, .5, .75 (exact in float32)."""
  z = jnp.zeros((1, 4), jnp.float32)
  for top_p, kept in [(0.25, 1), (0.2500001, 2), (0.5, 2), (0.75, 3),
                      (0.76, 4), (1.0, 4)]:
    got = np.asarray(ops.top_p_keep(z, top_p))[0]
    assert got.tolist() == [True] * kept + [False] * (4 - kept), (top_p, got)
