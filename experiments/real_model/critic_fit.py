"""Can the real model's critic fit its targets at all? (issue 42: why value pretraining stalled)

  python -m experiments.real_model.critic_fit --config=configs/smollm2_135m.py \\
      --epochs=8 --out=experiments/real_model/results/critic_fit.json

The second SmolLM2 run's critic never explained variance (EV −0.20…+0.095 over 28 steps). Two
explanations predict different things on one fixed batch of the frozen policy's rollouts:
  - it cannot fit (an optimisation or wiring problem): the value loss on the batch it trains on
    stays near the best constant's, ½·Var_tok(R);
  - it fits but does not generalise (too little data): the loss on that batch falls well below
    the constant's while explained variance on a fresh batch stays ≤ 0.
The script draws one value-pretraining batch, runs `--epochs` critic updates on it (each the
config's ppo_epochs × num_minibatches), records the value loss the update reports (on that
batch, before each optimizer step), then draws a fresh batch and reads the critic's explained
variance there. R_t is the Monte-Carlo return (λ_critic = 1, γ = 1: the score at every token).
"""

import json
import os

from absl import app
from absl import flags
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from vapo_jax import config as config_lib
from vapo_jax.run import trainer as trainer_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.")
_EPOCHS = flags.DEFINE_integer("epochs", 8, "critic updates on the one fixed batch")
_OUT = flags.DEFINE_string("out", "", "JSON file for the figures (optional)")


def constant_loss(returns_BxR, mask_BxR) -> float:
  """½·Var_tok(R): the value loss of the best constant predictor over the real tokens."""
  m = np.asarray(mask_BxR, np.float64)
  r = np.asarray(returns_BxR, np.float64)
  mean = (r * m).sum() / m.sum()
  return float(0.5 * (((r - mean) ** 2) * m).sum() / m.sum())


def main(_):
  cfg = config_lib.from_command_line(_CONFIG.value)
  t = trainer_lib.Trainer(cfg, progress=False)
  t.setup("critic")
  batch, em = t.experience(next(t.state.prompts), for_value_pretraining=True)
  base = constant_loss(batch.returns_BxR, batch.response_mask_BxR)
  losses = []
  for k in range(_EPOCHS.value):
    um = t.update(batch, stage="value_pretrain", step=k, policy=False)
    losses.append(float(um["value_loss"]))
    print(f"epoch {k + 1}: value loss on the fixed batch {losses[-1]:.4f} "
          f"(best constant {base:.4f}, ratio {losses[-1] / base:.2f})", flush=True)
  _, fresh = t.experience(next(t.state.prompts), for_value_pretraining=True)
  out = {"config": "configs/smollm2_135m.py", "epochs": _EPOCHS.value,
         "batch_reward_mean": float(jnp.mean(batch.scores_B)),
         "constant_loss": base, "value_loss_by_epoch": losses,
         "ratio_last": losses[-1] / base,
         "fresh_batch_explained_variance": float(fresh["value/explained_variance"]),
         "fresh_batch_reward_mean": float(fresh["reward/mean"])}
  print(json.dumps(out), flush=True)
  if _OUT.value:
    os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  app.run(main)
