"""Scores the labelled reward suite with vapo_jax's checker (both modes) and math-verify.

  pip install math-verify   # for this benchmark only
  python benchmarks/verifier_bench.py [--timeout_s=10] [--repeats=1]

All checkers run through the same `RewardScorer` (spawned worker processes
with a hard per-check time limit), so a checker that hangs costs its time
limit and scores 0 with reason `timeout` instead of stalling the benchmark.
math-verify is called the way its README suggests: `verify(parse(gold),
parse(response))`, with the gold answer wrapped in `$...$`.

Two suites: the hand-written cases of `tests/reward_cases.py` and the
differential corpus of `tests/reward_corpus.py`. vapo_jax strict is scored
against the strict labels, vapo_jax lenient and math-verify against the
lenient labels. Printed per checker and suite: accuracy, false positives
(wrong answers given credit), false negatives, hostile cases given credit,
timeouts, errors, checks/s (cases / summed per-check wall time, one
worker), worst-case time; then the batch throughput of a 2-worker pool, the
speed ratios, agreement with math-verify on the corpus per mode with each
class of deliberate difference, and the cases each checker gets wrong.
"""

import argparse
import logging
import os
import platform
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]

import reward_cases  # pylint: disable=g-import-not-at-top,wrong-import-position
import reward_corpus  # pylint: disable=g-import-not-at-top,wrong-import-position
from vapo_jax import rewards  # pylint: disable=g-import-not-at-top,wrong-import-position

THEIRS = "verifier_bench:math_verify_score"
# (name, plug-in, which label it is judged by)
CHECKERS = (
    ("vapo strict", rewards.DEFAULT_REWARD_FN, "strict"),
    ("vapo lenient", rewards.LENIENT_REWARD_FN, "lenient"),
    ("math-verify", THEIRS, "lenient"),
)


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


def _label(case, mode: str) -> bool:
  return case.equal if mode == "strict" else case.lenient_equal


def _summary(name, cases, mode, correct, secs, reasons):
  labels = [_label(c, mode) for c in cases]
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
      "wrong": [(c, mode) for c in fp + fn],
  }


def _short(text: str, n: int = 60) -> str:
  text = text.replace("\n", " ")
  return text if len(text) <= n else text[:25] + " ... " + text[-(n - 30):]


def _table(title, rows):
  print(f"\n{title}")
  print(f"{'checker':<14}{'accuracy':>9}{'FP':>5}{'FN':>5}{'hostFP':>7}"
        f"{'timeout':>8}{'errors':>7}{'checks/s':>10}{'mean ms':>9}{'worst s':>9}")
  for r in rows:
    print(f"{r['name']:<14}{r['accuracy']:>9.3f}{r['fp']:>5}{r['fn']:>5}"
          f"{r['hostile_fp']:>7}{r['timeouts']:>8}{r['errors']:>7}"
          f"{r['checks_per_s']:>10.1f}{r['mean_ms']:>9.2f}{r['worst_s']:>9.3f}")


def _agreement(corpus, verdicts):
  """Agreement of each vapo mode with math-verify on the corpus, with the
  disagreements sorted into the documented classes."""
  theirs = verdicts["math-verify"]
  print("\nagreement with math-verify on the differential corpus "
        f"({len(corpus)} cases):")
  for name, _, mode in CHECKERS[:2]:
    ours = verdicts[name]
    differ = [c for c, a, b in zip(corpus, ours, theirs) if a != b]
    classes = {}
    for c in differ:
      if mode == "strict" and c.equal != c.lenient_equal:
        key = "strict_needs_a_marker"
      else:
        key = reward_corpus.policy_of(c) or "UNDOCUMENTED"
      classes[key] = classes.get(key, 0) + 1
    agree = 1 - len(differ) / len(corpus)
    print(f"  {name:<13} {agree:.3f} agree; differ on {len(differ)}: " + ", ".join(
        f"{k} {v}" for k, v in sorted(classes.items(), key=lambda kv: -kv[1])))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--timeout_s", type=float, default=10.0)
  parser.add_argument("--repeats", type=int, default=1)
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

  suites = (("hand-written cases", reward_cases.HAND_CASES),
            ("differential corpus", reward_cases.CORPUS_CASES))
  everything = reward_cases.ALL_CASES
  benign = [c for c in everything if not c.hostile]
  print(f"machine: {platform.platform()}, {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, sympy {sympy.__version__}, "
        f"math-verify {mv_version}")
  print(f"labelled suite: {len(everything)} cases = "
        f"{len(reward_cases.HAND_CASES)} hand-written + "
        f"{len(reward_cases.CORPUS_CASES)} corpus ("
        f"{sum(c.equal for c in everything)} equal in strict mode, "
        f"{sum(c.lenient_equal for c in everything)} in lenient, "
        f"{sum(c.hostile for c in everything)} hostile); hard limit "
        f"{args.timeout_s:g} s per check")
  if os.path.exists(reward_cases.SENTINEL):
    os.remove(reward_cases.SENTINEL)
  tables = {title: [] for title, _ in suites}
  verdicts, speed, wrong = {}, {}, {}
  for name, fn, mode in CHECKERS:
    correct, secs, reasons = _per_case(fn, everything, args.timeout_s)
    verdicts[name] = correct[len(reward_cases.HAND_CASES):]
    start = 0
    wrong[name] = []
    for title, cases in suites:
      part = slice(start, start + len(cases))
      row = _summary(name, cases, mode, correct[part], secs[part], reasons[part])
      tables[title].append(row)
      wrong[name] += row["wrong"]
      start += len(cases)
    whole = _summary(name, everything, mode, correct, secs, reasons)
    speed[name] = (whole["checks_per_s"], whole["worst_s"],
                   _throughput(fn, benign, args.timeout_s, args.repeats),
                   os.path.exists(reward_cases.SENTINEL))
  for title, rows in tables.items():
    _table(title, rows)
  print(f"\n{'checker':<14}{'checks/s':>10}{'worst s':>9}{'batch/s':>9}{'code ran':>9}")
  for name, (cps, worst, batch, ran) in speed.items():
    print(f"{name:<14}{cps:>10.1f}{worst:>9.3f}{batch:>9.1f}{str(ran):>9}")
  theirs = speed["math-verify"]
  for name in ("vapo strict", "vapo lenient"):
    ours = speed[name]
    print(f"ratio {name} / math-verify: checks/s x{ours[0] / theirs[0]:.1f}; "
          f"batch/s x{ours[2] / theirs[2]:.1f}; worst-case time "
          f"x{ours[1] / theirs[1]:.3f}")
  _agreement(reward_cases.CORPUS_CASES, verdicts)
  for name, cases in wrong.items():
    print(f"\n{name} is wrong on {len(cases)} cases:")
    for c, mode in cases:
      kind = "FP" if not _label(c, mode) else "FN"
      print(f"  {kind} [{c.category}] {_short(c.response)!r} vs {c.reference!r}")


if __name__ == "__main__":
  main()
