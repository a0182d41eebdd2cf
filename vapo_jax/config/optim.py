"""config.optim: each trained network's AdamW (`run.learners.optimizer`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class OptimSection:
  policy_lr: float = 1e-6
  critic_lr: float = 2e-6
  # The value head's own rate (score, score_bias; for the critic and the reward model), a
  # second AdamW beside the backbone's/adapters' at critic_lr (optax.multi_transform, the
  # same warm-up and clipping over both). -1: none, the head takes critic_lr in one AdamW.
  critic_head_lr: float = -1.0
  sft_lr: float = 1e-3
  warmup_steps: int = 0        # optimizer updates of linear warm-up (each model its own count)
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0

  def check(self) -> None:
    for name in ("policy_lr", "critic_lr", "sft_lr", "weight_decay", "grad_clip"):
      need(getattr(self, name) >= 0, f"optim.{name}", getattr(self, name), ">= 0")
    need(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, ">= 0")
    need(0 <= self.b1 < 1 and 0 <= self.b2 < 1, "optim.b1", self.b1,
         "in [0, 1) (and optim.b2 too)")
    need(self.critic_head_lr >= 0 or self.critic_head_lr == -1, "optim.critic_head_lr",
         self.critic_head_lr, ">= 0, or -1 (optim.critic_lr, one AdamW)")
