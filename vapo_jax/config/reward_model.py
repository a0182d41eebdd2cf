"""config.reward_model: the stage that trains a critic's start (`run.trainer`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class RewardModelSection:
  """The reward-model stage (runs when model.critic_start = "reward_model")."""
  steps: int = 20              # rollout steps: sample, score, rl.num_minibatches updates each

  def check(self) -> None:
    need(self.steps >= 1, "reward_model.steps", self.steps, ">= 1")
