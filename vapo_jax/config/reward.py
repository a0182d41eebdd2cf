"""config.reward: the checker that scores training responses (`rewards/`, `run.parts.build`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class RewardSection:
  fn: str = "vapo_jax.rewards.math:score"
  # The math checker's extraction mode for training rewards: "strict" (only a marked final
  # answer, the last one wins) or "lenient" (also unmarked / multi-box answers). Other
  # plug-ins have no modes. Evaluation has its own: eval.reward_mode.
  mode: str = "strict"
  num_workers: int = 0         # 0: score in-process (each check still time-bounded)
  timeout_s: float = 5.0

  def check(self) -> None:
    need(":" in self.fn, "reward.fn", self.fn, '"module:function"')
    need(self.num_workers >= 0, "reward.num_workers", self.num_workers, ">= 0")
    need(self.timeout_s > 0, "reward.timeout_s", self.timeout_s, "> 0")
    need(self.mode in ("strict", "lenient"), "reward.mode", self.mode, '"strict" or "lenient"')
