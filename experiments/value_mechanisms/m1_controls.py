"""M1's precondition beside its controls, from committed results (issue 45 §2).

  python -m experiments.value_mechanisms.m1_controls SUITE/value_bias.json [...] \\
      [--rm_logs=seed0/stage-reward_model-KEY.jsonl,...]

Per suite: the bias V − V̂* by fifth of the reward model, the zero head (V ≡ 0) and a
constant head at π₀'s mean return (from the suite's own rows, or, for a suite from before
issue 45, as mean return − V̂* by fifth), each put through the registered precondition
("negative early, rising late": fifth 1's bias < 0 and fifth 5's above it), the critics' own
mean value by fifth (the in-response profile: V̂* is shared by every critic, so the bias's
shape is V̂*'s unless this moves), and `cog_criteria`'s verdict on whether the precondition
separates the RM from the controls.

With --rm_logs (the reward-model stages' metrics.jsonl): the RM at the final token, where it
is trained: per stage, the last step's mean prediction after the whole response
(`rm_pred_mean`) against the batch's mean reward p, and its loss ½(r̂ − r)² (`rm_loss`) against
½p(1 − p), the loss of the best constant.
"""

import argparse
import json
import os
import sys

from experiments.value_mechanisms import cog_criteria


def suite_lines(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    vb = json.load(f)
  rows = {"reward_model": vb["m1"].get("reward_model")} if vb["m1"].get("reward_model") else {}
  rows.update(cog_criteria._control_fifths(vb))  # pylint: disable=protected-access
  lines = [f"**{path}** (π₀'s mean return {vb['mean_return']:.3f}; {vb['prompts']} responses)",
           "", "| critic | bias by fifth | passes the precondition | mean V by fifth |",
           "|---|---|---|---|"]
  for name, fifths in rows.items():
    got = cog_criteria._m1_profile({"m1": {name: fifths}}, name)  # pylint: disable=protected-access
    kept = [r for r in fifths if r.get("cuts")]
    lines.append(f"| {name} | " + ", ".join(f"{r['bias']:+.3f}" for r in kept) + " | "
                 + ("yes" if got["verdict"] == "reproduced" else "no") + " | "
                 + ", ".join(f"{r['value_mean']:.3f}" for r in kept) + " |")
  verdict = cog_criteria._m1_discriminates(vb)  # pylint: disable=protected-access
  return lines + ["", f"Verdict: {verdict['verdict']}.", ""]


def rm_lines(paths: list[str]) -> list[str]:
  lines = ["**The reward model at the final token** (each stage's last step, on its training "
           "batch)", "", "| stage log | step | mean reward p | mean prediction | ½ MSE | "
           "½ p(1 − p) |", "|---|---|---|---|---|---|"]
  for p in paths:
    with open(p, encoding="utf-8") as f:
      recs = [json.loads(line) for line in f if line.strip()]
    last = [r for r in recs if r.get("stage") == "reward_model"][-1]
    mean = last["reward/mean"]
    lines.append(f"| {os.path.basename(os.path.dirname(p))}/{os.path.basename(p)} | "
                 f"{last['step']} | {mean:.3f} | {last['rm_pred_mean']:.3f} | "
                 f"{last['rm_loss']:.4f} | {0.5 * mean * (1 - mean):.4f} |")
  return lines + [""]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("suites", nargs="+")
  ap.add_argument("--rm_logs", default="")
  a = ap.parse_args(argv)
  lines = []
  for s in a.suites:
    lines += suite_lines(s)
  if a.rm_logs:
    lines += rm_lines(a.rm_logs.split(","))
  print("\n".join(lines), end="")


if __name__ == "__main__":
  main(sys.argv[1:])
