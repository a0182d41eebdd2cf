"""config.sft: the supervised stage before RL (`run.trainer`, `run.inputs` SFT batches)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class SFTSection:
  enabled: bool = False
  steps: int = 0               # optimizer updates (one batch each)
  batch_size: int = 64

  def check(self) -> None:
    need(not self.enabled or self.steps >= 1, "sft.steps", self.steps, ">= 1 when sft.enabled")
    need(self.batch_size >= 1, "sft.batch_size", self.batch_size, ">= 1")
