"""Scores the labelled reward suite with vapo_jax's checker and math-verify.

  pip install math-verify   # for this benchmark only
  python benchmarks/verifier_bench.py [--timeout_s=10] [--repeats=3]

Both checkers run through the same `RewardScorer` (spawned worker processes
with a hard per-check time limit), so a checker that hangs costs its time
limit and scores 0 with reason `timeout` instead of stalling the benchmark.
math-verify is called the way its README suggests: `verify(parse(gold),
parse(response))`, with the gold answer wrapped in `$...$`.

Printed per checker: accuracy, false positives (wrong answers given credit),
false negatives, hostile cases given credit, timeouts, errors, checks/s
(cases / summed per-check wall time, one worker), worst-case time; then the
batch throughput of a 2-worker pool on the non-hostile cases, the ratio of
the two, and the cases each checker gets wrong.
"""

import argparse
import logging
import os
import platform
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]

import reward_cases  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from vapo_jax import rewards  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

OURS = "vapo_jax.rewards.math:score"
THEIRS = "verifier_bench:math_verify_score"


def _gold_for_math_verify(reference: str) -> str:
  if r"\boxed" in reference:
    return reference
  if "####" in reference:
    reference = reference.rsplit("####", 1)[1]
  return f"${reference.strip()}$"


def math_verify_score(prompt: str, response: str, reference: str) -> float:
  """math-verify as a reward plug-in (runs in a benchmark worker)."""
  del prompt
  logging.disable(logging.CRITICAL)
  from math_verify import parse, verify  # pylint: disable=g-import-not-at-top
  gold = parse(_gold_for_math_verify(reference))
  pred = parse(response)
  return float(verify(gold, pred))


def _per_case(fn: str, cases, timeout_s: float):
  """Scores cases one at a time in one worker; returns (correct, secs, reasons)."""
  correct, secs, reasons = [], [], []
  with rewards.RewardScorer(fn, num_workers=1, timeout_s=timeout_s) as scorer:
    scorer.score_batch(["warm-up"], [r"\boxed{1}"], ["1"])
    for c in cases:
      s = scorer.score_batch([""], [c.response], [c.reference])
      correct.append(bool(s.correct[0]))
      secs.append(s.max_seconds)
      reasons.append(s.reasons[0])
  return correct, secs, reasons


def _throughput(fn: str, cases, timeout_s: float, repeats: int) -> float:
  n = len(cases) * repeats
  with rewards.RewardScorer(fn, num_workers=2, timeout_s=timeout_s) as scorer:
    scorer.score_batch(["w", "w"], [r"\boxed{1}"] * 2, ["1"] * 2)
    start = time.perf_counter()
    scorer.score_batch([""] * n, [c.response for c in cases] * repeats,
                       [c.reference for c in cases] * repeats)
    return n / (time.perf_counter() - start)


def _summary(name, cases, correct, secs, reasons):
  labels = [c.equal for c in cases]
  fp = [c for c, y, p in zip(cases, labels, correct) if p and not y]
  fn = [c for c, y, p in zip(cases, labels, correct) if y and not p]
  return {
      "name": name,
      "accuracy": 1 - (len(fp) + len(fn)) / len(cases),
      "fp": len(fp), "fn": len(fn),
      "hostile_fp": sum(c.hostile for c in fp),
      "timeouts": sum(r == "timeout" for r in reasons),
      "errors": sum(r.startswith("error:") for r in reasons),
      "checks_per_s": len(cases) / sum(secs),
      "worst_s": max(secs), "mean_ms": 1e3 * sum(secs) / len(secs),
      "wrong": fp + fn,
  }


def _short(text: str, n: int = 60) -> str:
  text = text.replace("\n", " ")
  return text if len(text) <= n else text[:25] + " ... " + text[-(n - 30):]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--timeout_s", type=float, default=10.0)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  try:
    import math_verify  # pylint: disable=g-import-not-at-top
    mv_version = getattr(math_verify, "__version__", None)
    if mv_version is None:
      from importlib import metadata  # pylint: disable=g-import-not-at-top
      mv_version = metadata.version("math-verify")
  except ImportError:
    sys.exit("math-verify is not installed: pip install math-verify")
  import sympy  # pylint: disable=g-import-not-at-top

  cases = reward_cases.ALL_CASES
  benign = [c for c in cases if not c.hostile]
  print(f"machine: {platform.platform()}, {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, sympy {sympy.__version__}, "
        f"math-verify {mv_version}")
  print(f"suite: {len(cases)} cases ({sum(c.equal for c in cases)} equal, "
        f"{sum(c.hostile for c in cases)} hostile); hard limit "
        f"{args.timeout_s:g} s per check\n")
  if os.path.exists(reward_cases.SENTINEL):
    os.remove(reward_cases.SENTINEL)
  rows = []
  for name, fn in (("vapo_jax", OURS), ("math-verify", THEIRS)):
    row = _summary(name, cases, *_per_case(fn, cases, args.timeout_s))
    row["sentinel"] = os.path.exists(reward_cases.SENTINEL)
    row["batch_per_s"] = _throughput(fn, benign, args.timeout_s, args.repeats)
    rows.append(row)
  header = (f"{'checker':<12}{'accuracy':>9}{'FP':>5}{'FN':>5}{'hostFP':>7}"
            f"{'timeout':>8}{'errors':>7}{'checks/s':>10}{'mean ms':>9}"
            f"{'worst s':>9}{'batch/s':>9}{'code ran':>9}")
  print(header)
  for r in rows:
    print(f"{r['name']:<12}{r['accuracy']:>9.3f}{r['fp']:>5}{r['fn']:>5}"
          f"{r['hostile_fp']:>7}{r['timeouts']:>8}{r['errors']:>7}"
          f"{r['checks_per_s']:>10.1f}{r['mean_ms']:>9.2f}{r['worst_s']:>9.3f}"
          f"{r['batch_per_s']:>9.1f}{str(r['sentinel']):>9}")
  ours, theirs = rows
  print(f"\nratio vapo_jax / math-verify: errors {len(ours['wrong'])} vs "
        f"{len(theirs['wrong'])}; checks/s x{ours['checks_per_s'] / theirs['checks_per_s']:.1f}; "
        f"batch/s x{ours['batch_per_s'] / theirs['batch_per_s']:.1f}; worst-case "
        f"time x{ours['worst_s'] / theirs['worst_s']:.3f}")
  for r in rows:
    print(f"\n{r['name']} is wrong on {len(r['wrong'])} cases:")
    for c in r["wrong"]:
      kind = "FP" if not c.equal else "FN"
      print(f"  {kind} [{c.category}] {_short(c.response)!r} vs {c.reference!r}")


if __name__ == "__main__":
  main()
