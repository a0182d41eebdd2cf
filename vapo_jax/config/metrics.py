"""config.metrics: where a run's records go (`run.metrics`, `run.wandb_log`,
`run.critic_diagnostics`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class MetricsSection:
  tensorboard: bool = True              # event files in workdir/tensorboard/<stage>
  plot: bool = True                     # workdir/curves.png at the end of the run
  wandb: bool = False                   # also log to Weights & Biases (pip install wandb)
  wandb_project: str = "vapo_jax"       # the W&B project
  wandb_name: str = ""                  # the W&B run's name ("": W&B picks one)
  # The critic's diagnostics in value pretraining and RL records (`run.critic_diagnostics`):
  # held-out EV pooled over fresh batches, Spearman ρ over prompts of V(s_0) against the
  # group's mean reward, token-level EV on each response's first and second half.
  critic_diagnostics: bool = False

  def check(self) -> None:
    need(not self.wandb or self.wandb_project.strip(), "metrics.wandb_project",
         self.wandb_project, "a project name when metrics.wandb is on")
