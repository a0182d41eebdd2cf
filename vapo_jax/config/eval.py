"""config.eval: the held-out evaluation (`run.evaluation`, `run.trainer`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class EvalSection:
  every: int = 0                        # rollout steps between evaluations; 0: start, end only
  num_examples: int = 256
  samples_per_problem: int = 4          # k of avg@k and pass@k
  batch_prompts: int = 64
  reward_mode: str = "lenient"          # math checker mode when scoring evaluations
  correct_threshold: float = 1.0        # a sample counts as correct when its score >= this
                                        # (apart from rl.nll_threshold, a training knob)
  short_response_tokens: int = 0        # > 0: also report short_frac, the share of sampled
                                        # responses of at most this many tokens (guesses)

  def check(self) -> None:
    need(self.every >= 0, "eval.every", self.every, ">= 0")
    need(self.short_response_tokens >= 0, "eval.short_response_tokens",
         self.short_response_tokens, ">= 0 (0: off)")
    need(self.reward_mode in ("strict", "lenient"), "eval.reward_mode", self.reward_mode,
         '"strict" or "lenient"')
    need(self.num_examples >= 1 and self.samples_per_problem >= 1 and self.batch_prompts >= 1,
         "eval.num_examples", self.num_examples,
         ">= 1 (and eval.samples_per_problem, eval.batch_prompts >= 1)")
