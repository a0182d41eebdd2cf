"""bootstrap: intervals known exactly, the exact bootstrap distribution of a tiny case, seeds,
and pairing (a test that fails if the problems of two rows were resampled independently)."""

import itertools

import numpy as np
import pytest

from vapo_jax import bootstrap

RNG = np.random.default_rng(1234)


def test_a_constant_paired_difference_has_a_zero_width_interval():
  """Problems of every difficulty, each exactly 0.1 better after: every resample gives 0.1."""
  before = RNG.uniform(0, 0.9, size=64)
  out = bootstrap.interval(before + 0.1, before, num_samples=2000)
  assert out.estimate == pytest.approx(0.1, abs=1e-12)
  assert out.lo == pytest.approx(0.1, abs=1e-12) and out.hi == pytest.approx(0.1, abs=1e-12)
  assert out.se == pytest.approx(0.0, abs=1e-12)


def test_tiny_case_against_the_exact_bootstrap_distribution():
  """N = 3 problems: all 27 resamples enumerated in float64 give the exact distribution of
  Δ*; the sampled replicates match its mean, its variance (which is the closed form
  (1/N²) Σ (d_i − d̄)²) and its CDF at every atom."""
  after, before = np.array([0.5, 1.0, 0.75]), np.array([0.5, 0.0, 0.0])
  d = after - before  # 0, 1, 0.75
  exact = np.array([d[list(idx)].mean() for idx in itertools.product(range(3), repeat=3)])
  closed_var = ((d - d.mean()) ** 2).sum() / 3 ** 2
  assert exact.var() == pytest.approx(closed_var, rel=1e-12)
  reps = bootstrap.replicates(after, before, num_samples=40_000, seed=3)
  assert reps.mean() == pytest.approx(exact.mean(), abs=4 * np.sqrt(closed_var / 40_000))
  assert reps.var() == pytest.approx(closed_var, rel=0.03)
  for atom in np.unique(exact):
    assert np.mean(reps <= atom + 1e-12) == pytest.approx(np.mean(exact <= atom + 1e-12),
                                                          abs=0.01)
  # The exact distribution's 2.5% and 97.5% points (its inverse CDF): 0 and 1, each an atom of
  # mass 1/27 > 2.5%, so the sampled interval lands on them exactly.
  atoms = np.unique(exact)
  cdf = np.array([np.mean(exact <= v + 1e-12) for v in atoms])
  lo, hi = atoms[np.argmax(cdf >= 0.025)], atoms[np.argmax(cdf >= 0.975)]
  out = bootstrap.interval(after, before, num_samples=40_000, seed=3)
  assert (lo, hi) == (0.0, 1.0)
  assert (out.lo, out.hi) == pytest.approx((lo, hi), abs=1e-12)


def test_seeds_are_resampled_per_row():
  """Row a: two seeds scoring 0.2 and 0.4 on every problem; row b: one seed at 0.3. Only the
  seed draw varies: Δ* is -0.1, 0 or +0.1 with probabilities 1/4, 1/2, 1/4, so the 95%
  interval is exactly [-0.1, +0.1]."""
  a = np.stack([np.full(20, 0.2), np.full(20, 0.4)])
  b = np.full((1, 20), 0.3)
  reps = bootstrap.replicates(a, b, num_samples=20_000, seed=0)
  values, counts = np.unique(np.round(reps, 12), return_counts=True)
  assert values.tolist() == [-0.1, 0.0, 0.1]
  assert counts / counts.sum() == pytest.approx([0.25, 0.5, 0.25], abs=0.015)
  out = bootstrap.interval(a, b, num_samples=20_000, seed=0)
  assert out.estimate == pytest.approx(0.0, abs=1e-12)
  assert (out.lo, out.hi) == pytest.approx((-0.1, 0.1), abs=1e-12)


def test_problems_are_paired():
  """Per-problem difficulty spread over [0, 1], the same in both rows; after = before + 0.05
  + small noise. Paired, the interval's width is set by the noise (closed form 2 · 1.96 ·
  sd(d) / √N ≈ 0.003); resampling the two rows' problems independently would give ~0.11.
  A bootstrap that loses the pairing fails here."""
  n = 200
  before = RNG.uniform(0, 1, size=n)
  after = before + 0.05 + RNG.normal(0, 0.01, size=n)
  out = bootstrap.interval(after, before, num_samples=20_000, seed=0)
  d = after - before
  paired_width = 2 * 1.96 * d.std() / np.sqrt(n)
  assert out.hi - out.lo == pytest.approx(paired_width, rel=0.1)
  assert out.se == pytest.approx(d.std() / np.sqrt(n), rel=0.05)
  # The unpaired alternative, computed here, on the same data: 30x wider.
  ra = bootstrap.replicates(after, num_samples=20_000, seed=1)
  rb = bootstrap.replicates(before, num_samples=20_000, seed=2)
  unpaired = np.quantile(ra - rb, [0.025, 0.975])
  assert unpaired[1] - unpaired[0] > 20 * (out.hi - out.lo)
  assert out.lo < 0.05 < out.hi


def test_one_row_and_determinism():
  x = RNG.integers(0, 2, size=(3, 50)).astype(float)
  one = bootstrap.interval(x, num_samples=500, seed=7)
  assert one.estimate == pytest.approx(x.mean()) and one.lo <= one.estimate <= one.hi
  np.testing.assert_array_equal(bootstrap.replicates(x, num_samples=500, seed=7),
                                bootstrap.replicates(x, num_samples=500, seed=7))
  assert not np.array_equal(bootstrap.replicates(x, num_samples=500, seed=7),
                            bootstrap.replicates(x, num_samples=500, seed=8))
  assert bootstrap.interval(x, level=0.5, seed=7).hi < one.hi


@pytest.mark.parametrize("a,b,match", [
    (np.ones(4), np.ones(5), "same problems"), (np.ones((2, 2, 2)), None, "seeds, problems"),
    (np.ones((0, 3)), None, "seeds, problems")])
def test_bad_inputs(a, b, match):
  with pytest.raises(ValueError, match=match):
    bootstrap.interval(a, b)
