"""The early value-pretraining confirmation, read against its registered criteria, mechanically.

  python -m experiments.ablation.confirm_early_vp W [> W/confirm.md]

W is the workdir of the registered `experiments.ablation.ablate` command (or a results folder
that keeps its `ablation.jsonl` and `metrics/`). The criteria are the ones in
`configs/chain_or_guess.py`'s docstring, section "Registered 2026-12-03, before any run". They
were committed before any run of this test. This module applies them and does nothing more:
it prints a per-seed table and one verdict per criterion ("met", "not met", or "not run" when
a row or a seed is missing), and it exits 0 whatever the verdicts.

What is read, per row and seed, from the run's metrics.jsonl (`W/seed<s>/<row>/metrics.jsonl`,
else ablate's copy `W/metrics/seed<s>/<row>.jsonl`), the last record of a step winning (a
resumed run may repeat steps):
  "eval" records at RL steps 5, 10, 15, 20: `avg@4`, and the guess rate `short_frac` (the share
  of held-out samples of ≤ eval.short_response_tokens = 15 tokens);
  the "rl" record of step 1: `value/s0_minus_return` (mean V(s₀) − score over the step's
  rollouts, before the critic's first update).
A run counts when its state is "finished": the state comes from `W/seed<s>/<row>/
ablate_status.json`, else from `W/ablation.jsonl`'s run record. With neither, a run whose
metrics hold the final evaluation (step 20) counts as finished.

Δ = row − vapo per seed. The paired one-sided t-test: t = mean(Δ) / (sd(Δ) / √n), sd with
n − 1, df = n − 1, p = P(T_df ≤ t) when the prediction is Δ < 0 and P(T_df ≥ t) when it is
Δ > 0. The p-value comes from scipy.stats.t when scipy is importable, else from `t_cdf` below
(the regularized incomplete beta, in plain math).
"""

import glob
import json
import math
import os
import sys
from typing import Sequence

PAIR = ("vapo", "no_value_pretrain")  # the primary contrast: the second minus the first
SECONDARY_ROW = "ppo"
SEEDS = tuple(range(6, 14))           # 8 fresh seeds
STEP = 10                             # the primary's RL step (the second evaluation)
AUC_STEPS = (5, 10, 15, 20)           # trapezoid over these evaluations
FINAL_STEP = AUC_STEPS[-1]
ALPHA = 0.05
MIN_NEGATIVE = 6                      # of the 8 seeds
AVG, GUESS, S0 = "avg@4", "short_frac", "value/s0_minus_return"
NO_VP_BELOW = -0.2                    # manipulation check: mean over seeds < this
VAPO_WITHIN = 0.1                     # and |mean| <= this for vapo
# The start selected on 2026-12-02, which the new selection is compared with.
COMMITTED_SELECTION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "ablation-chain_or_guess-2026-12-02", "selection",
                                   "sft_band.json")


# ------------------------------------------------------------------------------ Student's t


def regularized_beta(x: float, a: float, b: float) -> float:
  """I_x(a, b) = B(x; a, b) / B(a, b) for a, b > 0 and x in [0, 1].

  The continued fraction of B(x; a, b), evaluated by the modified Lentz method. It converges
  fast for x < (a + 1) / (a + b + 2); above that the symmetry I_x(a, b) = 1 − I_{1−x}(b, a)
  is used.
  """
  if not 0.0 <= x <= 1.0:
    raise ValueError(f"x = {x} outside [0, 1]")
  if x in (0.0, 1.0):
    return x
  if x > (a + 1) / (a + b + 2):
    return 1.0 - regularized_beta(1.0 - x, b, a)
  tiny, eps = 1e-300, 1e-15

  def guard(v):
    return tiny if abs(v) < tiny else v

  c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1))
  frac = d
  for m in range(1, 500):
    even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
    d = 1.0 / guard(1.0 + even * d)
    c = guard(1.0 + even / c)
    frac *= d * c
    odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
    d = 1.0 / guard(1.0 + odd * d)
    c = guard(1.0 + odd / c)
    frac *= d * c
    if abs(d * c - 1.0) < eps:
      break
  log_front = (a * math.log(x) + b * math.log1p(-x)
               - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)))
  return math.exp(log_front) * frac / a


def t_cdf(t: float, df: float) -> float:
  """P(T ≤ t) for Student's t with df degrees of freedom:
  for t ≤ 0, ½·I_{df/(df + t²)}(df/2, ½); for t > 0, 1 minus that at −t."""
  if df <= 0:
    raise ValueError(f"df = {df}: must be > 0")
  if math.isnan(t):
    return math.nan
  if math.isinf(t):
    return 1.0 if t > 0 else 0.0
  tail = 0.5 * regularized_beta(df / (df + t * t), df / 2.0, 0.5)
  return 1.0 - tail if t > 0 else tail


def _scipy_cdf():
  try:
    from scipy import stats  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return stats.t.cdf


def one_sided_p(t: float, df: float, predicted: str, cdf=None) -> float:
  """p of the one-sided test: P(T ≤ t) when the prediction is "negative", P(T ≥ t) when it is
  "positive". cdf: a t CDF (cdf(t, df)); None: scipy's if importable, else `t_cdf`."""
  cdf = cdf or _scipy_cdf() or t_cdf
  if predicted not in ("negative", "positive"):
    raise ValueError(f"predicted = {predicted!r}: 'negative' or 'positive'")
  return float(cdf(t if predicted == "negative" else -t, df))


def paired_t(deltas: Sequence[float], predicted: str = "negative", cdf=None) -> dict:
  """{n, mean, sd, t, df, p} of the one-sided paired t-test on the per-seed differences."""
  n = len(deltas)
  if n < 2:
    raise ValueError(f"{n} differences: a t-test needs >= 2")
  mean = sum(deltas) / n
  sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (n - 1))
  if sd > 0:
    t = mean / (sd / math.sqrt(n))
  else:  # every Δ equal: the sign alone decides
    t = math.copysign(math.inf, mean) if mean else 0.0
  return {"n": n, "mean": mean, "sd": sd, "t": t, "df": n - 1,
          "p": one_sided_p(t, n - 1, predicted, cdf)}


# ------------------------------------------------------------------------------ the runs


def read_jsonl(path: str) -> list[dict]:
  """The records of a metrics file; a torn line (a run killed mid-write) is skipped."""
  out = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def run_values(records: Sequence[dict]) -> dict:
  """{"avg": {step: avg@4}, "guess": {step: short_frac}, "s0": value/s0_minus_return at RL
  step 1 or None} from one run's metrics records."""
  evals = {r["step"]: r for r in records if r.get("stage") == "eval" and "step" in r}
  rl1 = [r for r in records if r.get("stage") == "rl" and r.get("step") == 1]
  return {"avg": {s: float(r[AVG]) for s, r in evals.items() if AVG in r},
          "guess": {s: float(r[GUESS]) for s, r in evals.items() if GUESS in r},
          "s0": float(rl1[-1][S0]) if rl1 and S0 in rl1[-1] else None}


def _states_from_table(workdir: str) -> dict[tuple[str, int], str]:
  path = os.path.join(workdir, "ablation.jsonl")
  if not os.path.exists(path):
    return {}
  return {(r["row"], r["seed"]): r.get("state") for r in read_jsonl(path)
          if r.get("kind") == "run"}


def load_runs(workdir: str, rows: Sequence[str], seeds: Sequence[int] = SEEDS) -> dict:
  """{(row, seed): {"state", "path", and run_values' keys when it counts}} for every pair;
  a run counts only when finished (module docstring)."""
  table_states = _states_from_table(workdir)
  out = {}
  for row in rows:
    for seed in seeds:
      run_dir = os.path.join(workdir, f"seed{seed}", row)
      paths = [os.path.join(run_dir, "metrics.jsonl"),
               os.path.join(workdir, "metrics", f"seed{seed}", f"{row}.jsonl")]
      path = next((p for p in paths if os.path.exists(p)), None)
      state = None
      status = os.path.join(run_dir, "ablate_status.json")
      if os.path.exists(status):
        with open(status, encoding="utf-8") as f:
          state = json.load(f).get("state")
      state = state or table_states.get((row, seed))
      values = run_values(read_jsonl(path)) if path else None
      if state is None:
        state = ("finished" if values and FINAL_STEP in values["avg"]
                 else "no metrics" if values is None else "unfinished")
      rec = {"state": state, "path": path}
      if state == "finished" and values is not None:
        rec.update(values)
      out[(row, seed)] = rec
  return out


def auc(curve: dict[int, float], steps: Sequence[int] = AUC_STEPS) -> float | None:
  """The trapezoid area under the curve over `steps` (None if one is missing)."""
  if any(s not in curve for s in steps):
    return None
  return sum((b - a) * (curve[a] + curve[b]) / 2 for a, b in zip(steps, steps[1:]))


def _value(runs, row, seed, what: str):
  """One number of one run: "avg@<step>", "guess@<step>", "auc" or "s0" (None if absent)."""
  rec = runs.get((row, seed), {})
  if "avg" not in rec:
    return None
  if what == "auc":
    return auc(rec["avg"])
  if what == "s0":
    return rec["s0"]
  key, step = what.split("@")
  return rec["avg" if key == "avg" else "guess"].get(int(step))


def deltas(runs, row: str, what: str, seeds: Sequence[int] = SEEDS) -> dict[int, float]:
  """{seed: row − vapo in `what`} for the seeds where both runs have it."""
  out = {}
  for s in seeds:
    mine, base = _value(runs, row, s, what), _value(runs, PAIR[0], s, what)
    if mine is not None and base is not None:
      out[s] = mine - base
  return out


# ------------------------------------------------------------------------------ the verdicts


def _missing(d: dict, seeds: Sequence[int]) -> str:
  gone = [s for s in seeds if s not in d]
  return f"{len(d)}/{len(seeds)} seeds (missing {', '.join(map(str, gone))})"


def _test(d: dict, predicted: str, scale: float, unit: str) -> tuple[dict, str]:
  st = paired_t(list(d.values()), predicted)
  return st, (f"mean Δ {scale * st['mean']:+.2f} {unit} (sd {scale * st['sd']:.2f}), "
              f"t{st['df']} = {st['t']:+.2f}, one-sided p = {st['p']:.4f}")


def sign_criterion(runs, row: str, what: str, name: str, seeds=SEEDS, with_count=True,
                   predicted: str = "negative", scale: float = 100.0,
                   unit: str = "points") -> dict:
  """Δ in the predicted direction, one-sided paired p < ALPHA, and (with_count) Δ < 0 in
  ≥ MIN_NEGATIVE seeds; "not run" unless every seed has both runs."""
  d = deltas(runs, row, what, seeds)
  if len(d) < len(seeds):
    return {"criterion": name, "evidence": _missing(d, seeds), "verdict": "not run"}
  st, evidence = _test(d, predicted, scale, unit)
  # (implied by p < ALPHA; kept because the registration states it)
  right_side = st["mean"] < 0 if predicted == "negative" else st["mean"] > 0
  ok = right_side and st["p"] < ALPHA
  if with_count:
    negative = sum(v < 0 for v in d.values())
    ok = ok and negative >= MIN_NEGATIVE
    evidence += f"; Δ < 0 in {negative}/{len(d)} seeds"
  return {"criterion": name, "evidence": evidence, "verdict": "met" if ok else "not met",
          **st}


def manipulation_check(runs, seeds=SEEDS) -> dict:
  """The mean over seeds of the RL step-1 V(s₀) − score: < NO_VP_BELOW for no_value_pretrain,
  within ±VAPO_WITHIN for vapo."""
  name = (f"Manipulation: mean `{S0}` at RL step 1 < {NO_VP_BELOW} (no_value_pretrain) and "
          f"within ±{VAPO_WITHIN} (vapo)")
  means, parts = {}, []
  for row in PAIR:
    got = [_value(runs, row, s, "s0") for s in seeds]
    if any(v is None for v in got):
      have = {s: v for s, v in zip(seeds, got) if v is not None}
      return {"criterion": name, "evidence": f"{row}: {_missing(have, seeds)}",
              "verdict": "not run"}
    means[row] = sum(got) / len(got)
    parts.append(f"{row} {means[row]:+.3f} (seeds {min(got):+.3f} … {max(got):+.3f})")
  ok = means[PAIR[1]] < NO_VP_BELOW and abs(means[PAIR[0]]) <= VAPO_WITHIN
  return {"criterion": name, "evidence": "; ".join(parts), "verdict": "met" if ok else "not met"}


def verdicts(runs, seeds=SEEDS) -> list[dict]:
  """[{criterion, evidence, verdict, ...}]: primary, S1, S2, S3, the manipulation check."""
  row = PAIR[1]
  return [
      {"role": "primary", **sign_criterion(
          runs, row, f"avg@{STEP}", f"Primary: Δ avg@4 ({row} − vapo) at RL step {STEP} < 0, "
          f"one-sided paired p < {ALPHA}, Δ < 0 in ≥ {MIN_NEGATIVE}/{len(seeds)} seeds", seeds)},
      {"role": "secondary", **sign_criterion(
          runs, row, f"guess@{STEP}", f"S1: Δ guess rate (`{GUESS}`) at step {STEP} > 0, "
          f"one-sided paired p < {ALPHA}", seeds, with_count=False, predicted="positive")},
      {"role": "secondary", **sign_criterion(
          runs, row, "auc", f"S2: Δ area under avg@4 over steps {AUC_STEPS[0]}–{FINAL_STEP} "
          f"(trapezoid) < 0, one-sided paired p < {ALPHA}", seeds, with_count=False,
          unit="points × steps")},
      {"role": "secondary", **sign_criterion(
          runs, SECONDARY_ROW, f"avg@{STEP}", f"S3: Δ avg@4 ({SECONDARY_ROW} − vapo) at step "
          f"{STEP} < 0, one-sided paired p < {ALPHA}, Δ < 0 in ≥ {MIN_NEGATIVE}/{len(seeds)} "
          "seeds", seeds)},
      {"role": "manipulation check", **manipulation_check(runs, seeds)},
  ]


def start_check(workdir: str, committed: str = COMMITTED_SELECTION) -> str:
  """Whether the selection's measured candidates equal the committed 2026-12-02 ones."""
  found = sorted(glob.glob(os.path.join(workdir, "shared", "stage-sft-*", "band",
                                        "sft_band.json"))
                 + glob.glob(os.path.join(workdir, "metrics", "shared", "stage-sft-*",
                                          "band.json")))
  if not found:
    return "not found (no shared SFT band verdict under W)"
  with open(found[0], encoding="utf-8") as f:
    new = json.load(f)
  if not os.path.exists(committed):
    return f"selected step {new.get('selected_step')}; the committed selection is missing"
  with open(committed, encoding="utf-8") as f:
    old = json.load(f)
  same = [(c["step"], c["accepted"], c["metrics"]) for c in new.get("candidates", [])] == [
      (c["step"], c["accepted"], c["metrics"]) for c in old["candidates"]]
  return (f"selected step {new.get('selected_step')} (2026-12-02: {old['selected_step']}); "
          + ("every candidate's dev metrics equal the committed selection's: the same start"
             if same else "the candidates differ from the committed selection's: "
             "another start"))


# ------------------------------------------------------------------------------ the report


def _cell(v, scale=100.0, digits=1, sign=False) -> str:
  return "—" if v is None else f"{scale * v:{'+' if sign else ''}.{digits}f}"


def seed_table(runs, seeds=SEEDS) -> str:
  """Per seed: avg@4 and Δ at step 10, guess rates, AUCs, V(s₀) − return, ppo, and Δ at the
  other evaluations (descriptive). Accuracies and rates in %, Δ in points."""
  v, p = PAIR
  head = (f"| seed | {v} avg@4 s{STEP} | {p} avg@4 s{STEP} | Δ s{STEP} | guess {v} | "
          f"guess {p} | AUC {v} | AUC {p} | Δ AUC | V(s₀)−R {v} | V(s₀)−R {p} | "
          f"{SECONDARY_ROW} avg@4 s{STEP} | Δ {SECONDARY_ROW} s{STEP} | Δ s5 / s15 / s20 |")
  lines = [head, "|" + "---|" * head.count(" | ")]
  for s in seeds:
    later = " / ".join(_cell(deltas(runs, p, f"avg@{k}", [s]).get(s), sign=True)
                       for k in (5, 15, 20))
    lines.append("| " + " | ".join([
        str(s), _cell(_value(runs, v, s, f"avg@{STEP}")), _cell(_value(runs, p, s, f"avg@{STEP}")),
        _cell(deltas(runs, p, f"avg@{STEP}", [s]).get(s), sign=True),
        _cell(_value(runs, v, s, f"guess@{STEP}")), _cell(_value(runs, p, s, f"guess@{STEP}")),
        _cell(_value(runs, v, s, "auc")), _cell(_value(runs, p, s, "auc")),
        _cell(deltas(runs, p, "auc", [s]).get(s), sign=True),
        _cell(_value(runs, v, s, "s0"), 1, 3, True), _cell(_value(runs, p, s, "s0"), 1, 3, True),
        _cell(_value(runs, SECONDARY_ROW, s, f"avg@{STEP}")),
        _cell(deltas(runs, SECONDARY_ROW, f"avg@{STEP}", [s]).get(s), sign=True), later]) + " |")
  return "\n".join(lines) + "\n"


def report(workdir: str) -> str:
  runs = load_runs(workdir, (*PAIR, SECONDARY_ROW))
  states = ", ".join(f"{row}: {sum(runs[(row, s)]['state'] == 'finished' for s in SEEDS)}"
                     f"/{len(SEEDS)} finished" for row in (*PAIR, SECONDARY_ROW))
  method = "scipy.stats.t" if _scipy_cdf() else "t_cdf (regularized incomplete beta)"
  lines = [f"# The early value-pretraining confirmation: {workdir}", "",
           "Criteria: `configs/chain_or_guess.py`, \"Registered 2026-12-03, before any run\". "
           f"Seeds {SEEDS[0]}–{SEEDS[-1]}; {states}. Start: {start_check(workdir)}.", "",
           f"Per seed (avg@4 and guess rate `{GUESS}` in %, Δ = row − vapo in points, AUC = "
           f"trapezoid of avg@4 over steps {', '.join(map(str, AUC_STEPS))} in % × steps, "
           f"V(s₀)−R = `{S0}` at RL step 1; Δ at steps 5 / 15 / 20 descriptive only):", "",
           seed_table(runs), f"p-values: {method}.", "",
           "| role | registered criterion | evidence | verdict |", "|---|---|---|---|"]
  lines += [f"| {r['role']} | {r['criterion']} | {r['evidence']} | {r['verdict']} |"
            for r in verdicts(runs)]
  return "\n".join(lines) + "\n"


def main(argv) -> int:
  if len(argv) != 2:
    print("usage: python -m experiments.ablation.confirm_early_vp W  (ablate's workdir, or a "
          "results folder with its ablation.jsonl and metrics/)", file=sys.stderr)
    return 2
  print(report(argv[1]), end="")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
