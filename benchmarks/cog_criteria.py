"""The chain_or_guess table read against its pre-registered criteria, mechanically.

  python benchmarks/cog_criteria.py /tmp/cog/ablation.jsonl [> criteria.md]

The criteria are the ones in `configs/chain_or_guess.py`'s docstring, fixed before any row
ran; this only applies them to `tools.ablate`'s `ablation.jsonl` (kind "run" records: per row
and seed the final held-out avg@k, the curve from the shared start, the response length and
the guess rate `short_frac`), so the verdicts leave no room for a reading after the fact.
Δ = row − vapo per seed (the same shared start, prompts and keys). Accuracies in [0, 1].
The M3 half of the decoupled-GAE criterion comes from `benchmarks/value_bias.py`, not here.
"""

import json
import math
import sys
from typing import Sequence


def _by_seed(records: Sequence[dict], row: str) -> dict[int, dict]:
  return {r["seed"]: r for r in records
          if r.get("kind") == "run" and r["row"] == row and r.get("state") == "finished"
          and "avg" in r}


def _deltas(records, row) -> dict[int, float]:
  vapo, mine = _by_seed(records, "vapo"), _by_seed(records, row)
  return {s: mine[s]["avg"] - vapo[s]["avg"] for s in sorted(mine) if s in vapo}


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
      ("no_length_adaptive", "Without length-adaptive GAE: every Δ < 0 (the M2 half from "
       "value_bias.py)", 0.0)):
    d = _deltas(records, row)
    if not d:
      out.append({"row": row, "criterion": label, "evidence": "—", "verdict": "not run"})
      continue
    mean = sum(d.values()) / len(d)
    ok = all(v < 0 for v in d.values()) and (mean <= mean_max if mean_max < 0 else True)
    out.append({"row": row, "criterion": label,
                "evidence": f"Δ {_fmt_deltas(d)}; mean {100 * mean:+.1f}",
                "verdict": "reproduced" if ok else "not reproduced"})
  return out


def markdown(rows: list[dict]) -> str:
  lines = ["| pre-registered criterion | evidence (points) | verdict |", "|---|---|---|"]
  lines += [f"| {r['criterion']} | {r['evidence']} | {r['verdict']} |" for r in rows]
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) != 2:
    raise SystemExit("usage: python benchmarks/cog_criteria.py W/ablation.jsonl")
  with open(argv[1], encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  print(markdown(verdicts(records)), end="")


if __name__ == "__main__":
  main(sys.argv)
