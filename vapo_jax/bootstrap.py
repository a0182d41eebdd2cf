"""Paired bootstrap intervals over problems (and seeds) for evaluation scores. numpy only.

An evaluation gives one number per problem, x_i (avg@k: the share of its k samples that are
right; pass@k: whether any is; greedy: whether the greedy answer is). A row of a table is S ≥ 1
runs (seeds) evaluated on the same N problems: x[s, i]. Its score is the grand mean

  m(x) = (1/S) Σ_s (1/N) Σ_i x[s, i].

Two rows a [S_a, N] and b [S_b, N] on the same problems (the same run before and after
training, S_a = S_b = 1; or two configs at the same step, one or more seeds each) differ by

  Δ = m(a) − m(b).

The bootstrap draws B replicates of Δ. Each draws N problem indices π with replacement, **one
draw shared by both rows** (the pairing: a problem that is hard for a is hard for b, and
that shared difficulty cancels in the difference), and, per row, S seed indices σ with
replacement (the seeds of two rows are independent runs, not pairs):

  Δ* = (1/S_a) Σ_{s∈σ_a} (1/N) Σ_{i∈π} a[s, i] − (1/S_b) Σ_{s∈σ_b} (1/N) Σ_{i∈π} b[s, i].

The interval at level 1 − α is the α/2 and 1 − α/2 quantiles of the B replicates (percentile
bootstrap); `se` is their standard deviation. With one seed per row, d_i = a_i − b_i and the
bootstrap variance of Δ is exactly (1/N²) Σ_i (d_i − d̄)² (the plug-in variance of d over N):
paired, it depends on the spread of the per-problem differences, not of the problems' scores.
An unpaired bootstrap (independent π for a and b) would add both rows' between-problem
variance, which on problems of very different difficulty is far larger.

Deterministic given `seed` (numpy's PCG64). Replicates are drawn as multinomial counts, so
memory is B × (N + S_a + S_b) float64.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Interval:
  """A bootstrap estimate: the point estimate, the interval [lo, hi] and the replicates' sd."""
  estimate: float
  lo: float
  hi: float
  se: float

  def as_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


def _rows(x, name: str) -> np.ndarray:
  x = np.asarray(x, np.float64)
  if x.ndim == 1:
    x = x[None]
  if x.ndim != 2 or 0 in x.shape:
    raise ValueError(f"{name} must be [seeds, problems] (or [problems]) with both >= 1, got "
                     f"shape {x.shape}")
  return x


def _weights(rng: np.random.Generator, n: int, num_samples: int) -> np.ndarray:
  """[B, n] resampling weights: multinomial counts of n draws with replacement, over n."""
  return rng.multinomial(n, np.full(n, 1.0 / n), size=num_samples) / n


def replicates(a, b=None, *, num_samples: int = 10_000, seed: int = 0) -> np.ndarray:
  """B replicates Δ* of m(a) − m(b) (of m(a) alone when b is None), see the module doc.

  Args:
    a, b: [S_a, N] and [S_b, N] per-problem scores (a 1-d [N] is one seed); the same N
      problems in the same order.
  Returns:
    [num_samples] float64.
  """
  a = _rows(a, "a")
  if b is not None:
    b = _rows(b, "b")
    if b.shape[1] != a.shape[1]:
      raise ValueError(f"a has {a.shape[1]} problems and b {b.shape[1]}: pairing needs the "
                       "same problems")
  if num_samples < 1:
    raise ValueError(f"num_samples must be >= 1, got {num_samples}")
  rng = np.random.default_rng(seed)
  w_BxN = _weights(rng, a.shape[1], num_samples)  # the problems: one draw for both rows

  def row(x):
    v_BxS = _weights(rng, x.shape[0], num_samples)
    return np.einsum("bs,sn,bn->b", v_BxS, x, w_BxN)

  out = row(a)
  return out - row(b) if b is not None else out


def interval(a, b=None, *, num_samples: int = 10_000, seed: int = 0,
             level: float = 0.95) -> Interval:
  """m(a) − m(b) (or m(a)) with its percentile bootstrap interval at `level`."""
  if not 0 < level < 1:
    raise ValueError(f"level must be in (0, 1), got {level}")
  reps = replicates(a, b, num_samples=num_samples, seed=seed)
  a = _rows(a, "a")
  estimate = float(a.mean() - (_rows(b, "b").mean() if b is not None else 0.0))
  alpha = 1.0 - level
  lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
  return Interval(estimate=estimate, lo=float(lo), hi=float(hi),
                  se=float(reps.std(ddof=1)) if num_samples > 1 else 0.0)
