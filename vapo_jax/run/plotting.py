"""The curves a researcher looks at first, from one or several runs' `metrics.jsonl`.

    plot_runs(["/tmp/vapo", "/tmp/grpo"], "compare.png")

draws one panel per quantity (RL reward and accuracy, held-out avg@k, response length and
truncation, entropy, clip fractions, KL, value loss and explained variance, gradient norms,
advantage and λ_policy statistics, throughput, skipped updates) with every run as its own
line, so runs compare side by side on the same axes. RL panels use the RL step as x; the
held-out accuracy panel uses the RL step of each evaluation (0 = before RL). Panels that no
run has data for are left out.

Needs matplotlib (`pip install matplotlib`, or `pip install vapo_jax[plot]`), imported only
when a plot is drawn.
"""

import math
import os
from typing import Sequence

from vapo_jax.run import metrics as metrics_lib

# (title, stage, [metric keys]); a key ending in "@" matches avg@k / pass@k for any k.
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward (RL batch)", "rl", ("reward/mean", "reward/accuracy")),
    ("held-out accuracy", "eval", ("avg@", "pass@", "greedy_accuracy")),
    ("response length", "rl", ("response/length_mean", "response/length_max")),
    ("truncated fraction", "rl", ("response/truncated_frac",)),
    ("entropy", "rl", ("entropy",)),
    ("clip fraction", "rl", ("clip_frac_low", "clip_frac_high")),
    ("approx KL", "rl", ("approx_kl",)),
    ("value loss", "rl", ("value_loss",)),
    ("explained variance", "rl", ("value/explained_variance",)),
    ("policy loss", "rl", ("pg_loss", "nll_loss")),
    ("gradient norm", "rl", ("policy_grad_norm", "critic_grad_norm")),
    ("advantages", "rl", ("adv/mean", "adv/std")),
    ("λ_policy", "rl", ("lam_policy/mean", "lam_policy/min")),
    ("tokens / s", "rl", ("rollout_tokens_per_s", "train_tokens_per_s")),
    ("seconds per phase", "rl", ("time/rollout_s", "time/reward_and_forward_s",
                                 "time/update_s")),
    ("checker timeouts, skipped updates", "rl", ("reward/timeouts",
                                                 "nonfinite/skipped_updates")),
    ("value pretraining: value loss", "value_pretrain", ("value_loss",)),
    ("value pretraining: explained variance", "value_pretrain",
     ("value/explained_variance",)),
    ("SFT loss", "sft", ("sft_loss",)),
)


def _float(v) -> float:
  try:
    return float(v)
  except (TypeError, ValueError):
    return math.nan


def series(records: list[dict], stage: str, key: str) -> dict[str, tuple[list, list]]:
  """{metric name: (steps, values)} of one stage; `key` "avg@" matches "avg@4" etc."""
  out: dict[str, tuple[list, list]] = {}
  for r in records:
    if r.get("stage") != stage:
      continue
    names = [k for k in r if k == key or (key.endswith("@") and k.startswith(key))]
    for name in names:
      xs, ys = out.setdefault(name, ([], []))
      xs.append(r["step"])
      ys.append(_float(r[name]))
  return out


def plot_runs(workdirs: Sequence[str], out_png: str, *, labels: Sequence[str] | None = None,
              columns: int = 4) -> str:
  """Draws the panels for each run (a workdir or a metrics.jsonl path) into one PNG."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("plots need matplotlib: `pip install matplotlib`") from e
  runs = []
  for i, w in enumerate(workdirs):
    path = w if w.endswith(".jsonl") else os.path.join(w, metrics_lib.JSONL)
    name = labels[i] if labels else os.path.basename(os.path.normpath(
        os.path.dirname(path) if w.endswith(".jsonl") else w))
    runs.append((name, metrics_lib.read_jsonl(path)))
  panels = [(t, st, keys) for t, st, keys in PANELS
            if any(series(recs, st, k) for _, recs in runs for k in keys)]
  if not panels:
    raise ValueError(f"no metrics to plot in {list(workdirs)}")
  rows = -(-len(panels) // columns)
  fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
  styles = ("-", "--", ":", "-.")
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (title, stage, keys) in zip(axes.flat, panels):
    for r, (run, recs) in enumerate(runs):
      for j, key in enumerate(keys):
        for name, (xs, ys) in sorted(series(recs, stage, key).items()):
          label = name if len(runs) == 1 else f"{run}: {name}"
          # One run: a colour per quantity. Several: a colour per run, a dash per quantity.
          color = colors[(j if len(runs) == 1 else r) % len(colors)]
          ax.plot(xs, ys, "-" if len(runs) == 1 else styles[j % len(styles)], color=color,
                  marker="o" if len(xs) < 12 else None, markersize=3, label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel({"eval": "RL step", "sft": "SFT step",
                   "value_pretrain": "value-pretraining step"}.get(stage, "RL step"), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.suptitle(" vs ".join(name for name, _ in runs), fontsize=12)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
  fig.savefig(out_png, dpi=90)
  plt.close(fig)
  return out_png
