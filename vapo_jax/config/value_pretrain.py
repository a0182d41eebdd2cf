"""config.value_pretrain: the critic's stage before RL (`run.critic_stage`, `run.stopping`).
Whether there is a critic to pretrain, and replay against value clipping, are checked across
sections (`config.validate`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class ValuePretrainSection:
  enabled: bool = True
  max_steps: int = 50          # rollout steps (each: rl.ppo_epochs × rl.num_minibatches updates)
  min_steps: int = 1
  stop_value_loss: float = 0.0          # stop once the value loss is below this (0: off)
  stop_explained_variance: float = 1.0  # stop once explained variance reaches this (1: off)
  # stop once the within-group EV of a fresh batch (critic/group_ev, scored before the critic
  # trained on it: the part of the reward a group mean cannot explain) reaches this (1: off;
  # needs metrics.critic_diagnostics)
  stop_group_ev: float = 1.0
  # Plateau rule (run/stopping.py): stop once the `plateau_smooth`-step moving average of the
  # value loss fell by less than `plateau_tol` (relative) over the last `plateau_window`
  # steps; 0: off. max_steps is the cap; the log says which ended the stage.
  plateau_window: int = 0
  plateau_smooth: int = 3
  plateau_tol: float = 0.02
  # The critic's targets: False = Monte Carlo returns (λ = 1, VAPO); True = GAE returns with
  # the RL stage's λ_policy (the second reading of "without decoupled GAE").
  coupled_gae: bool = False
  # Reuse of rollouts (the policy is frozen here, so old rollouts' Monte Carlo returns stay
  # exact targets): each step trains the critic for `epochs` passes (0: rl.ppo_epochs)
  # over the last `replay_batches` rollout batches (1: the step's own batch only), each
  # batch in rl.num_minibatches mini-batches.
  epochs: int = 0
  replay_batches: int = 1
  # Held-out explained variance, what stop_explained_variance reads: the step's fresh batch
  # is scored by the critic before it trains on it; pooled over the last `heldout_batches`
  # fresh batches (1 - Σ(R - V)² / Σ(R - R̄)² over their tokens; 1: the step's batch alone,
  # Var-based, `losses.explained_variance`).
  heldout_batches: int = 1

  def check(self) -> None:
    need(self.max_steps >= self.min_steps >= 0, "value_pretrain.min_steps", self.min_steps,
         f"in [0, value_pretrain.max_steps={self.max_steps}]")
    need(self.stop_group_ev <= 1, "value_pretrain.stop_group_ev", self.stop_group_ev,
         "<= 1 (1: off)")
    need(self.epochs >= 0, "value_pretrain.epochs", self.epochs, ">= 0 (0: rl.ppo_epochs)")
    need(self.replay_batches >= 1, "value_pretrain.replay_batches", self.replay_batches,
         ">= 1 (1: the step's own batch)")
    need(self.heldout_batches >= 1, "value_pretrain.heldout_batches", self.heldout_batches,
         ">= 1")
    need(self.plateau_window >= 0 and self.plateau_smooth >= 1 and self.plateau_tol >= 0,
         "value_pretrain.plateau_window", self.plateau_window,
         ">= 0 (0: off), with plateau_smooth >= 1 and plateau_tol >= 0")
