"""config.checkpoint: what a run saves and restores (`run.checkpoint`,
`run.checkpoint_store`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
  """Orbax checkpoints under `workdir/checkpoints` (a run without a workdir saves nothing)."""
  every: int = 50                       # steps (of any stage) between saves; 0: stage ends only
  keep: int = 3                         # newest checkpoints kept
  keep_best: bool = True                # also keep the one with the best eval avg@k
  async_save: bool = True               # write in the background while training goes on
  resume: bool = True                   # continue from the newest good checkpoint in workdir
  # What a resume restores: "all" (everything; a checkpoint that does not fit this run's
  # config stops the run with what differs, and every checkpoint stays where it is) or
  # "weights" (the same, except that when only the optimizer state does not fit — e.g.
  # after optim.grad_clip changed — the model weights alone are restored into freshly
  # built states: the optimizer, its step count and its schedule start over, while the
  # position, prompt iterators, PRNG key and summary are the checkpoint's).
  restore: str = "all"
  save_critic: bool = True              # HF-format critic in workdir/critic after value pretraining

  def check(self) -> None:
    need(self.every >= 0, "checkpoint.every", self.every, ">= 0 (0: at stage ends only)")
    need(self.keep >= 1, "checkpoint.keep", self.keep, ">= 1")
    need(self.restore in ("all", "weights"), "checkpoint.restore", self.restore,
         '"all" or "weights"')
