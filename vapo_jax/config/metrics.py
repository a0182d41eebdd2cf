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
  # The critic's diagnostics in value pretraining and RL records (`run.critic_diagnostics`,
  # over each whole batch, scored before the critic trained on it): within-group EV, EV by
  # position, last-token AUROC and Brier score, V along t/l for correct and wrong responses,
  # the bias, Spearman ρ of V(s_0) against the group's pass rate.
  critic_diagnostics: bool = False
  # At each evaluation (the one at RL step 0 reads the value-pretrained critic): the same on
  # this many fresh rollout batches of held-out prompts (critic_heldout/* in the eval
  # records, with a bootstrap interval over groups for the within-group EV); 0: off.
  critic_heldout_batches: int = 0

  def check(self) -> None:
    need(self.critic_heldout_batches >= 0, "metrics.critic_heldout_batches",
         self.critic_heldout_batches, ">= 0 (0: off)")
    need(not self.wandb or self.wandb_project.strip(), "metrics.wandb_project",
         self.wandb_project, "a project name when metrics.wandb is on")
