"""The chain_or_guess table read against its pre-registered criteria, mechanically.

  python -m experiments.value_mechanisms.cog_criteria /tmp/cog/ablation.jsonl [> criteria.md]
  python -m experiments.value_mechanisms.cog_criteria /tmp/vb_cog/value_bias.json
      # (the json: preconditions, M2, M3)

The criteria are the ones in `configs/chain_or_guess.py`'s docstring, fixed before any row
ran; this only applies them to `experiments.ablation.ablate`'s `ablation.jsonl` (kind "run"
records: per row and seed the final held-out avg@k, the curve from the shared start, the
response length and the guess rate `short_frac`), so the verdicts leave no room for a reading
after the fact. Δ = row − vapo per seed (the same shared start, prompts and keys). Accuracies
in [0, 1]. The mechanism halves (the M3 lag, M2's λ) and the pilot's preconditions (the RM's
M1 profile, value pretraining's branch calibration) are read from `value_bias`'s
value_bias.json by `mechanism_verdicts`, with the docstring's words made mechanical in the
constants below.
"""

import json
import math
import sys
from typing import Sequence


def _by_seed(records: Sequence[dict], row: str) -> dict[int, dict]:
  return {r["seed"]: r for r in records
          if r.get("kind") == "run" and r["row"] == row and r.get("state") == "finished"
          and "avg" in r}


def _deltas(records, row, key: str = "avg") -> dict[int, float]:
  """Per seed, row − vapo in `key` ("avg"; "avg/long": the long-chain half) where both have it."""
  vapo, mine = _by_seed(records, "vapo"), _by_seed(records, row)
  return {s: mine[s][key] - vapo[s][key] for s in sorted(mine)
          if s in vapo and key in mine[s] and key in vapo[s]}


def _fmt_deltas(d: dict[int, float]) -> str:
  return ", ".join(f"seed {s}: {100 * v:+.1f}" for s, v in d.items()) or "—"


def verdicts(records: Sequence[dict]) -> list[dict]:
  """[{row, criterion, evidence, verdict}] with verdict "reproduced", "not reproduced" or
  "not run" (a row or VAPO missing)."""
  out = []
  vapo = _by_seed(records, "vapo")

  # PPO collapse.
  ppo, d = _by_seed(records, "ppo"), _deltas(records, "ppo")
  if not d:
    out.append({"row": "ppo", "criterion": "PPO collapse", "evidence": "—",
                "verdict": "not run"})
  else:
    collapsed = {s: ((ppo[s].get("guess_rate", math.nan) >= 0.5
                      or ppo[s]["response_length"] < 0.5 * vapo[s]["response_length"])
                     and ppo[s]["avg"] < ppo[s]["curve"][0][1]) for s in d}
    need = math.ceil(2 * len(d) / 3)
    vapo_guess = [vapo[s].get("guess_rate", math.nan) for s in d]
    ok = (sum(collapsed.values()) >= need and all(v < 0 for v in d.values())
          and sum(d.values()) / len(d) <= -0.10 and all(g < 0.15 for g in vapo_guess))
    out.append({"row": "ppo",
                "criterion": "PPO collapse: guess rate >= 50% or length < 0.5x VAPO's, and "
                             f"below the start, in >= {need}/{len(d)} seeds; every Δ < 0, mean "
                             "Δ <= -10 points; VAPO's guess rate < 15%",
                "evidence": f"collapsed in {sum(collapsed.values())}/{len(d)}; Δ "
                            f"{_fmt_deltas(d)}; VAPO guess rate "
                            + ", ".join(f"{100 * g:.1f}%" for g in vapo_guess),
                "verdict": "reproduced" if ok else "not reproduced"})

  for row, label, mean_max in (
      ("no_value_pretrain", "Without value pretraining worse: every Δ < 0, mean Δ <= -5 "
       "points", -0.05),
      ("no_decoupled_gae_vp", "Without decoupled GAE (value pretraining coupled too) worse: "
       "every Δ < 0 (and the M3 lag, from value_bias.py)", 0.0),
      ("no_decoupled_gae", "Without decoupled GAE (RL only): every Δ < 0 (expected: mechanism "
       "shown, effect not shown)", 0.0),
      ("no_length_adaptive", "Without length-adaptive GAE: every Δ < 0 on the long-chain "
       "half (the M2 half from value_bias.py)", 0.0)):
    d = _deltas(records, row)
    key = "avg/long" if row == "no_length_adaptive" else "avg"
    judged = _deltas(records, row, key) if key != "avg" else d
    if not d:
      out.append({"row": row, "criterion": label, "evidence": "—", "verdict": "not run"})
      continue
    if not judged:  # a table from before the per-kind held-out scores were logged
      out.append({"row": row, "criterion": label, "evidence": f"Δ {_fmt_deltas(d)} (overall; "
                  f"{key} not logged)", "verdict": "not run"})
      continue
    mean = sum(judged.values()) / len(judged)
    ok = all(v < 0 for v in judged.values()) and (mean <= mean_max if mean_max < 0 else True)
    evidence = f"Δ {_fmt_deltas(judged)}; mean {100 * mean:+.1f}"
    if key != "avg":
      evidence = (f"long-chain half Δ {_fmt_deltas(judged)}; mean {100 * mean:+.1f} (overall "
                  f"Δ {_fmt_deltas(d)})")
    out.append({"row": row, "criterion": label, "evidence": evidence,
                "verdict": "reproduced" if ok else "not reproduced"})
  return out


# The mechanism halves, read from `value_bias`'s value_bias.json. The
# docstring's words made mechanical (fixed 2026-12-02 before the suite's first full run):
GUESS, CHAIN = "\\", "A"  # a response's first token: a guess `\boxed{d}`, a chain `A:...`
CALIBRATION = 0.05          # |V(after the first token) − the branch's success| < this
LAG = 0.05                  # M3: "lagging" = mean V(s₀) − mean return < −LAG


def _m1_profile(vb: dict, critic: str) -> dict:
  """The RM's M1 profile: negative early (fifth 1's bias < 0) and rising late (fifth 5's bias
  above fifth 1's); "flat" otherwise, which calls for the pre-declared RM variant."""
  fifths = [r for r in vb["m1"].get(critic, []) if r.get("cuts")]
  if len(fifths) < 2:
    return {"criterion": f"{critic}: M1 bias negative early, rising late", "evidence": "—",
            "verdict": "not run"}
  first, last = fifths[0]["bias"], fifths[-1]["bias"]
  ok = first < 0 and last > first
  return {"criterion": f"{critic}: M1 bias negative early, rising late (else the "
                       "pre-declared RM variant)",
          "evidence": "bias by fifth " + ", ".join(f"{r['bias']:+.3f}" for r in fifths),
          "verdict": "reproduced" if ok else "not reproduced (flat)"}


def _control_fifths(vb: dict) -> dict[str, list[dict]]:
  """The M1 rows of the two controls (issue 45 §2): the zero head (V ≡ 0) and a constant head
  at π₀'s mean return. A suite from before issue 45 has no constant head; its rows follow from
  the zero head's (bias = −V̂* by fifth): bias = mean return − V̂*."""
  out = {}
  if vb["m1"].get("zero_head"):
    out["zero_head"] = vb["m1"]["zero_head"]
  if vb["m1"].get("constant_head"):
    out["constant_head"] = vb["m1"]["constant_head"]
  elif "zero_head" in out and "mean_return" in vb:
    out["constant_head"] = [
        {**r, "bias": vb["mean_return"] - r["vstar_mean"], "value_mean": vb["mean_return"]}
        if r.get("cuts") else r for r in out["zero_head"]]
  return out


def _m1_discriminates(vb: dict, critic: str = "reward_model") -> dict:
  """Issue 45 §2 (a check added 2026-12-03, after the runs): the M1 precondition above is
  kept only if it separates the reward model from the controls, i.e. the RM passes it and
  neither the zero head nor the constant head at the mean return does."""
  label = (f"control: does the {critic} M1 precondition separate it from a zero head and a "
           "constant head at the mean return (kept only if it does)")
  controls = _control_fifths(vb)
  rm = _m1_profile(vb, critic)
  if rm["verdict"] == "not run" or not controls:
    return {"criterion": label, "evidence": "—", "verdict": "not run"}
  passes = {critic: rm["verdict"] == "reproduced"}
  evidence = [f"{critic}: {rm['evidence']} ({'passes' if passes[critic] else 'fails'})"]
  for name, rows in controls.items():
    got = _m1_profile({"m1": {name: rows}}, name)
    passes[name] = got["verdict"] == "reproduced"
    evidence.append(f"{name}: {got['evidence']} ({'passes' if passes[name] else 'fails'})")
  ok = passes[critic] and not any(v for k, v in passes.items() if k != critic)
  return {"criterion": label, "evidence": "; ".join(evidence),
          "verdict": "discriminates" if ok else "does not discriminate: precondition dropped"}


def _calibration(vb: dict, critic: str) -> dict:
  branches = vb["m1"].get(critic + "/branches", {})
  mine = {k: branches[k] for k in (GUESS, CHAIN) if k in branches}
  label = (f"{critic}: branch calibration |V(s₁) − success| < {CALIBRATION} for guesses "
           "and chains")
  if len(mine) < 2:
    return {"criterion": label, "evidence": f"branches {sorted(branches)}",
            "verdict": "not run"}
  ok = all(abs(b["gap"]) < CALIBRATION for b in mine.values())
  return {"criterion": label,
          "evidence": "; ".join(f"`{k}` {b['samples']} samples: success {b['success']:.3f}, V "
                                f"{b['value']:.3f}, gap {b['gap']:+.3f}"
                                for k, b in mine.items()),
          "verdict": "reproduced" if ok else "not reproduced"}


def _m3_lag(vb: dict) -> dict:
  """Over the second half of the M3 steps: lag = mean(V(s₀) − mean return); the coupled
  critic lags (< −LAG) where the Monte Carlo one does not (≥ −LAG)."""
  recs = [r for r in vb.get("m3", []) if "coupled/v_s0" in r]
  label = (f"M3: the coupled critic's V(s₀) lags the mean return (< −{LAG}, second half of "
           "the steps) where the Monte Carlo critic's does not")
  if len(recs) < 2:
    return {"criterion": label, "evidence": "—", "verdict": "not run"}
  late = recs[len(recs) // 2:]
  lag = {k: sum(r[f"{k}/v_s0"] - r[f"{k}/mean_return"] for r in late) / len(late)
         for k in ("mc", "coupled")}
  same = all(r.get("same_rollouts", False) for r in recs)
  ok = lag["coupled"] < -LAG <= lag["mc"] and same
  return {"criterion": label,
          "evidence": f"steps {late[0]['step'] + 1}–{late[-1]['step'] + 1}: lag MC "
                      f"{lag['mc']:+.3f}, coupled {lag['coupled']:+.3f}; same rollouts {same}",
          "verdict": "reproduced" if ok else "not reproduced"}


def _m2_adaptive(vb: dict, critic: str) -> dict:
  """M2: the MSE-optimal λ rises from the shortest bucket to the longest (never falling), and
  α = 0.05's worst excess MSE over the buckets' optimum is below every fixed λ's."""
  table = {b: r for b, r in vb["m2"].get(critic, {}).items() if r.get("responses")}
  label = (f"{critic}: M2 optimal λ rises with length, and α = 0.05 is nearer the optimum "
           "in every bucket than any single fixed λ")
  if len(table) < 2:
    return {"criterion": label, "evidence": "—", "verdict": "not run"}
  rows = sorted(table.values(), key=lambda r: r["mean_length"])
  lams = [r["optimal_lambda"] for r in rows]
  rising = lams[-1] > lams[0] and all(b >= a for a, b in zip(lams, lams[1:]))
  excess = {s: max(r["settings"][s]["mse"] - r["optimal_mse"] for r in rows)
            for s in rows[0]["settings"]}
  fixed = {s: e for s, e in excess.items() if s.startswith("λ=")}
  adaptive = excess.get("α=0.05")
  ok = rising and adaptive is not None and fixed and adaptive < min(fixed.values())
  return {"criterion": label,
          "evidence": "optimal λ by length " + ", ".join(
              f"{r['mean_length']:.0f} tok: {r['optimal_lambda']:.2f}" for r in rows)
                      + "; worst excess MSE " + ", ".join(f"{s} {e:.4f}"
                                                          for s, e in excess.items()),
          "verdict": "reproduced" if ok else "not reproduced"}


def mechanism_verdicts(vb: dict) -> list[dict]:
  """[{row, criterion, evidence, verdict}]: the preconditions (the RM's M1 profile, value
  pretraining's branch calibration) and the mechanism halves (M3 lag, M2) of a
  value_bias.json."""
  critics = vb.get("critics", [])
  out = [{"row": "precondition", **_m1_profile(vb, "reward_model")},
         {"row": "precondition", **_m1_discriminates(vb)}]
  out += [{"row": "precondition", **_calibration(vb, c)} for c in critics
          if c.startswith("vp@")]
  out.append({"row": "no_decoupled_gae_vp", **_m3_lag(vb)})
  out += [{"row": "no_length_adaptive", **_m2_adaptive(vb, c)} for c in critics
          if c.startswith("vp@") or c == "reward_model"]
  return out


def markdown(rows: list[dict]) -> str:
  lines = ["| pre-registered criterion | evidence (points) | verdict |", "|---|---|---|"]
  lines += [f"| {r['criterion']} | {r['evidence']} | {r['verdict']} |" for r in rows]
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) != 2:
    raise SystemExit("usage: python -m experiments.value_mechanisms.cog_criteria "
                     "W/ablation.jsonl | OUT/value_bias.json")
  with open(argv[1], encoding="utf-8") as f:
    if argv[1].endswith(".json"):
      print(markdown(mechanism_verdicts(json.load(f))), end="")
      return
    records = [json.loads(line) for line in f if line.strip()]
  print(markdown(verdicts(records)), end="")


if __name__ == "__main__":
  main(sys.argv)
