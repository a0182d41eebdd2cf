"""Scores the held-out labelled set (`tests/reward_heldout.py`) per family.

  pip install math-verify   # for the math-verify column only
  python benchmarks/verifier_heldout.py [--timeout_s=10] [--no_math_verify]

The held-out cases were written before reading the checker's code, so unlike
the suites in `verifier_bench.py` they measure it rather than describe it.
Every checker runs through `RewardScorer` (killable worker, hard per-check
limit). vapo strict is judged by the strict labels, vapo lenient and
math-verify by the lenient labels (what a grader decides). Prints, per family:
cases, then accuracy / FP / FN for each checker; then the totals and the
cases each checker gets wrong.
"""

import argparse
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"),
                os.path.join(_ROOT, "benchmarks")]

import reward_heldout  # noqa: E402
import verifier_bench  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--timeout_s", type=float, default=10.0)
  parser.add_argument("--no_math_verify", action="store_true")
  args = parser.parse_args()
  cases = reward_heldout.HELDOUT
  checkers = [c for c in verifier_bench.CHECKERS
              if not (args.no_math_verify and c[0] == "math-verify")]
  results = {}
  for name, fn, mode in checkers:
    correct, secs, reasons = verifier_bench._per_case(  # pylint: disable=protected-access
        fn, cases, args.timeout_s)
    results[name] = (mode, correct, secs, reasons)

  def stats(name, family=None):
    mode, correct, _, _ = results[name]
    fp = fn = n = 0
    for c, p in zip(cases, correct):
      if family is not None and c.category != family:
        continue
      n += 1
      y = verifier_bench._label(c, mode)  # pylint: disable=protected-access
      fp += p and not y
      fn += y and not p
    return n, 1 - (fp + fn) / max(n, 1), fp, fn

  names = [c[0] for c in checkers]
  print(f"held-out set: {len(cases)} cases, {len(reward_heldout.FAMILIES)} "
        f"families, {sum(c.hostile for c in cases)} hostile; "
        f"{args.timeout_s:g} s limit per check")
  head = f"{'family':<20}{'n':>4}" + "".join(
      f"  {n + ' acc/FP/FN':>24}" for n in names)
  print(head)
  for family in reward_heldout.FAMILIES + [None]:
    row = f"{family or 'TOTAL':<20}{stats(names[0], family)[0]:>4}"
    for name in names:
      _, acc, fp, fn = stats(name, family)
      row += f"  {f'{acc:.3f} / {fp} / {fn}':>24}"
    print(row)
  for name in names:
    mode, correct, secs, reasons = results[name]
    print(f"\n{name}: {len(cases) / sum(secs):.1f} checks/s, worst "
          f"{max(secs):.3f} s, timeouts "
          f"{sum(r == 'timeout' for r in reasons)}; wrong on:")
    for c, p, r in zip(cases, correct, reasons):
      y = verifier_bench._label(c, mode)  # pylint: disable=protected-access
      if p != y:
        print(f"  {'FP' if p else 'FN'} [{c.category}] "
              f"{verifier_bench._short(c.response, 70)!r} vs "  # pylint: disable=protected-access
              f"{c.reference!r} ({r})")


if __name__ == "__main__":
  main()
