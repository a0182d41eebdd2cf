"""Scores the labelled reward suite with vapo_jax's checker (both modes) and math-verify.

  pip install math-verify   # for this benchmark only
  python benchmarks/verifier_bench.py [--timeout_s=10] [--repeats=1] [--rounds=3]
                                      [--limit=N] [--json=out.json]

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

The checkers run interleaved (benchmarks/quiet.py): the suite is split into --rounds slices
and each checker scores each slice in turn, so all see the same machine state, with the
per-round speed ratios printed. The load average is printed at start and end (max sampled
during the run); every figure of a run whose load went above 1 is marked LOADED — not a
result, and --json writes "quiet": false for it.
"""

import argparse
import contextlib
import importlib.util
import logging
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]

import reward_cases  # noqa: E402
import reward_corpus  # noqa: E402
from vapo_jax import rewards  # noqa: E402
import quiet  # noqa: E402  (benchmarks/quiet.py)

THEIRS = "verifier_bench:math_verify_score"
PLAIN = "\0"  # prefix of a report line that holds no measured figure
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


def _per_case(cases, rounds: int, timeout_s: float, load):
  """Scores every case with every checker, one worker each, the checkers interleaved.

  Round r holds cases r, r + rounds, ...; in each round each checker scores that slice (the
  order alternating between rounds), so all checkers see the same machine state. Returns
  ({checker: (correct, secs, reasons, code_ran)}, quiet.Rounds of summed per-check seconds).
  """
  out = {name: ([None] * len(cases), [0.0] * len(cases), [""] * len(cases), [False])
         for name, _, _ in CHECKERS}
  slices = [range(r, len(cases), rounds) for r in range(rounds)]
  current = [0]
  with contextlib.ExitStack() as stack:
    scorers = {}
    for name, fn, _ in CHECKERS:
      scorers[name] = stack.enter_context(
          rewards.RewardScorer(fn, num_workers=1, timeout_s=timeout_s))
      scorers[name].score_batch(["warm-up"], [r"\boxed{1}"], ["1"])

    def side(name):
      def score_slice():
        correct, secs, reasons, ran = out[name]
        for i in slices[current[0]]:
          s = scorers[name].score_batch([""], [cases[i].response], [cases[i].reference])
          correct[i], secs[i], reasons[i] = bool(s.correct[0]), s.max_seconds, s.reasons[0]
          if os.path.exists(reward_cases.SENTINEL):  # a hostile case ran code: whose?
            ran[0] = True
            os.remove(reward_cases.SENTINEL)
        return sum(secs[i] for i in slices[current[0]])
      return score_slice

    timed = quiet.interleave([(name, side(name)) for name, _, _ in CHECKERS], rounds,
                             load=load, each_round=lambda r: current.__setitem__(0, r))
  return {k: (c, s, r, ran[0]) for k, (c, s, r, ran) in out.items()}, timed


def _throughput(cases, rounds: int, timeout_s: float, repeats: int, load):
  """Batch throughput of a 2-worker pool per checker, interleaved by round over slices of
  `cases` (each repeated `repeats` times); returns (rounds, cases per checker per round)."""
  slices = [cases[r::rounds] * repeats for r in range(rounds)]
  current = [0]
  with contextlib.ExitStack() as stack:
    scorers = {}
    for name, fn, _ in CHECKERS:
      scorers[name] = stack.enter_context(
          rewards.RewardScorer(fn, num_workers=2, timeout_s=timeout_s))
      scorers[name].score_batch(["w", "w"], [r"\boxed{1}"] * 2, ["1"] * 2)

    def side(name):
      def score_slice():
        part = slices[current[0]]
        scorers[name].score_batch([""] * len(part), [c.response for c in part],
                                  [c.reference for c in part])
      return score_slice

    timed = quiet.interleave([(name, side(name)) for name, _, _ in CHECKERS], rounds,
                             load=load, each_round=lambda r: current.__setitem__(0, r))
  return timed, [len(x) for x in slices]


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
  lines = ["", PLAIN + title,
           PLAIN + f"{'checker':<14}{'accuracy':>9}{'FP':>5}{'FN':>5}{'hostFP':>7}"
           f"{'timeout':>8}{'errors':>7}{'checks/s':>10}{'mean ms':>9}{'worst s':>9}"]
  for r in rows:
    lines.append(f"{r['name']:<14}{r['accuracy']:>9.3f}{r['fp']:>5}{r['fn']:>5}"
                 f"{r['hostile_fp']:>7}{r['timeouts']:>8}{r['errors']:>7}"
                 f"{r['checks_per_s']:>10.1f}{r['mean_ms']:>9.2f}{r['worst_s']:>9.3f}")
  return lines


def _agreement(corpus, verdicts):
  """Agreement of each vapo mode with math-verify on the corpus, with the
  disagreements sorted into the documented classes."""
  theirs = verdicts["math-verify"]
  lines = ["", PLAIN + "agreement with math-verify on the differential corpus "
           f"({len(corpus)} cases):"]
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
    agree = 1 - len(differ) / max(len(corpus), 1)
    lines.append(f"  {name:<13} {agree:.3f} agree; differ on {len(differ)}: " + ", ".join(
        f"{k} {v}" for k, v in sorted(classes.items(), key=lambda kv: -kv[1])))
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--timeout_s", type=float, default=10.0)
  parser.add_argument("--repeats", type=int, default=1,
                      help="passes over the benign cases in the batch-throughput part")
  parser.add_argument("--rounds", type=int, default=3,
                      help="interleaved rounds: the suite is split into this many slices, "
                      "and each checker scores each slice in turn")
  parser.add_argument("--limit", type=int, default=0,
                      help="only the first N cases of each suite (a smoke run; 0 = all)")
  quiet.add_flags(parser)
  args = parser.parse_args()
  if importlib.util.find_spec("math_verify") is None:
    sys.exit("math-verify is not installed: pip install math-verify")
  facts = quiet.machine_facts(peers=("sympy", "math-verify"), ours=())
  load = quiet.Load()
  with load:
    quiet.print_header(facts, load)
    lines, results = _measure(args, load)
  for line in lines:  # figures are marked; titles and case listings (PLAIN) are not
    print(line[len(PLAIN):] if line.startswith(PLAIN) or not line.strip()
          else load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, results)


def _measure(args, load):
  """Scores and times everything; returns (report lines, JSON results)."""
  limit = args.limit or None
  hand = tuple(reward_cases.HAND_CASES[:limit])
  corpus = tuple(reward_cases.CORPUS_CASES[:limit])
  suites = (("hand-written cases", hand), ("differential corpus", corpus))
  everything = hand + corpus
  benign = [c for c in everything if not c.hostile]
  print(f"labelled suite: {len(everything)} cases = "
        f"{len(hand)} hand-written + {len(corpus)} corpus ("
        f"{sum(c.equal for c in everything)} equal in strict mode, "
        f"{sum(c.lenient_equal for c in everything)} in lenient, "
        f"{sum(c.hostile for c in everything)} hostile); hard limit "
        f"{args.timeout_s:g} s per check; {args.rounds} interleaved round(s)")
  if os.path.exists(reward_cases.SENTINEL):
    os.remove(reward_cases.SENTINEL)
  scored, per_case = _per_case(everything, args.rounds, args.timeout_s, load)
  batch, batch_n = _throughput(benign, args.rounds, args.timeout_s, args.repeats, load)
  tables = {title: [] for title, _ in suites}
  verdicts, speed, wrong = {}, {}, {}
  for name, _, mode in CHECKERS:
    correct, secs, reasons, ran = scored[name]
    verdicts[name] = correct[len(hand):]
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
                   sum(batch_n) / sum(batch.times[name]), ran)
  lines = []
  for title, rows in tables.items():
    lines += _table(title, rows)
  lines.append("")
  lines.append(PLAIN + f"{'checker':<14}{'checks/s':>10}{'worst s':>9}{'batch/s':>9}"
               f"{'code ran':>9}")
  for name, (cps, worst, batch_rate, ran) in speed.items():
    lines.append(f"{name:<14}{cps:>10.1f}{worst:>9.3f}{batch_rate:>9.1f}{str(ran):>9}")
  theirs = speed["math-verify"]
  for name in ("vapo strict", "vapo lenient"):
    ours = speed[name]
    lines.append(f"ratio {name} / math-verify: checks/s x{ours[0] / theirs[0]:.1f}; "
                 f"batch/s x{ours[2] / theirs[2]:.1f}; worst-case time "
                 f"x{ours[1] / theirs[1]:.3f}")
    lines.append("  " + per_case.describe_ratio(name, "math-verify", "per check, by round"))
    lines.append("  " + batch.describe_ratio(name, "math-verify", "batch, by round"))
  lines += _agreement(corpus, verdicts)
  for name, cases in wrong.items():
    lines.append("")
    lines.append(PLAIN + f"{name} is wrong on {len(cases)} cases:")
    for c, mode in cases:
      kind = "FP" if not _label(c, mode) else "FN"
      lines.append(PLAIN + f"  {kind} [{c.category}] {_short(c.response)!r} vs {c.reference!r}")
  pairs = [(n, "math-verify") for n in ("vapo strict", "vapo lenient")]
  results = {
      "cases": {"hand": len(hand), "corpus": len(corpus), "benign": len(benign)},
      "rounds": args.rounds, "repeats": args.repeats, "timeout_s": args.timeout_s,
      "tables": {t: [{k: v for k, v in r.items() if k != "wrong"} for r in rows]
                 for t, rows in tables.items()},
      "speed": {n: {"checks_per_s": v[0], "worst_s": v[1], "batch_per_s": v[2],
                    "code_ran": v[3]} for n, v in speed.items()},
      "per_check_rounds": per_case.to_json(pairs), "batch_rounds": batch.to_json(pairs)}
  return lines, results


if __name__ == "__main__":
  main()
