"""What a training checkpoint holds, and how it goes back into a `Trainer`.

At a position (stage, step) a checkpoint holds the arrays that exist there —

    sft stage        "sft": the SFT TrainState (params, AdamW state, step)
    value_pretrain   "policy_params": the frozen policy, "critic": the critic's TrainState
    rl, done         "policy": the policy's TrainState, "critic": the critic's (with a critic)

— and in its JSON meta everything else the run's randomness and bookkeeping depend on: the
position and fault counters (`RunControl`), both prompt iterators' epoch and position, the
PRNG key the rollouts split from, the number of metric records written, the summary so far,
and the config. Mini-batch shuffles are seeded by (seed, stage, step, epoch) and need no
state. Restoring all of it makes the resumed run take the same steps, on the same prompts,
with the same random numbers, as a run that never stopped.

The restore targets are the trainer's own freshly built states, so arrays come back in the
new run's shardings, whatever mesh it has.
"""

import dataclasses
import json
import os
import warnings
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax.run import checkpoint_store as checkpointing
from vapo_jax.run import control as run_control

CHECKPOINTS = "checkpoints"


def store(cfg, workdir: str | None, *, read_only: bool = False
          ) -> checkpointing.CheckpointStore | None:
  """The run's checkpoint store under `workdir/checkpoints` (None without a workdir)."""
  if not workdir:
    return None
  ck = cfg.checkpoint
  return checkpointing.CheckpointStore(os.path.join(workdir, CHECKPOINTS), keep=ck.keep,
                                       keep_best=ck.keep_best, async_save=ck.async_save,
                                       read_only=read_only)


def groups(trainer) -> dict[str, Any]:
  """The arrays a checkpoint holds at the trainer's current position."""
  out = {}
  stage = trainer.ctl.stage
  if stage == "sft" and trainer.sft_state is not None:
    out["sft"] = trainer.sft_state
  elif stage in ("rl", "done") and trainer.policy_state is not None:
    out["policy"] = trainer.policy_state
  else:
    out["policy_params"] = trainer.policy_params
  if trainer.critic_state is not None:
    out["critic"] = trainer.critic_state
  return out


def save(trainer, score: float | None = None) -> None:
  """Checkpoints the trainer's position (no-op without a workdir or if already saved).

  Args:
    trainer: the Trainer.
    score: the eval avg@k at this point, if any (the best-scoring checkpoint is kept).
  """
  ckpt = trainer.ckpt
  if not ckpt or ckpt.read_only or trainer.ctl.global_step in ckpt.steps():
    return
  iterators = {"rl": trainer.prompts.get_state()}
  if trainer.sft_prompts is not None:
    iterators["sft"] = trainer.sft_prompts.get_state()
  meta = {"position": trainer.ctl.state(), "iterators": iterators,
          "key": [int(x) for x in np.asarray(jax.random.key_data(trainer.key)).ravel()],
          "metrics_lines": trainer.log.lines, "summary": trainer.summary,
          "config": dataclasses.asdict(trainer.cfg)}
  ckpt.save(trainer.ctl.global_step, groups(trainer), meta, score=score)


def _like(trainer, name: str):
  """A freshly built tree of group `name`: the restore target (structure, shardings)."""
  if name == "sft":
    trainer._sft_setup()  # pylint: disable=protected-access
    return trainer.sft_state
  if name == "policy":
    trainer._rl_setup()  # pylint: disable=protected-access
    return trainer.policy_state
  if name == "critic":
    trainer._ensure_critic()  # pylint: disable=protected-access
    return trainer.critic_state
  if name == "policy_params":
    return trainer.policy_params
  raise checkpointing.CheckpointError(f"unknown checkpoint group {name!r}")


def restore(trainer, step: int | None = None) -> int | None:
  """Puts checkpoint `step` (None: the newest that restores) back into the trainer.

  With step=None, checkpoints that fail to restore are moved aside with a warning and the
  next older one is tried; an explicit step that fails raises. Returns the restored step,
  or None when there is no checkpoint.
  """
  ckpt = trainer.ckpt
  if not ckpt:
    return None
  initial = (trainer.policy_params, trainer.key)

  def attempt(s, meta):
    # Undo what a failed earlier attempt built, so states match a run that never stopped.
    trainer.policy_params, trainer.key = initial
    trainer.sft_state = trainer.sft_prompts = trainer.policy_state = None
    trainer.critic_state = None
    _warn_config_changes(meta.get("config", {}), dataclasses.asdict(trainer.cfg))
    return s, meta, ckpt.restore(s, {n: _like(trainer, n) for n in meta["groups"]})

  if step is None:
    found = ckpt.restore_latest(attempt)
    if found is None:
      return None
  else:
    if step not in ckpt.steps():
      raise checkpointing.CheckpointError(f"no checkpoint {step} in {ckpt.directory} "
                                          f"(there are {ckpt.steps()})")
    found = attempt(step, ckpt.read_meta(step))
  step, meta, arrays = found
  if "sft" in arrays:
    trainer.sft_state = arrays["sft"]
    trainer.policy_params = trainer.sft_state.params
  if "policy" in arrays:
    trainer.policy_state = arrays["policy"]
    trainer.policy_params = trainer.policy_state.params
  if "policy_params" in arrays:
    trainer.policy_params = arrays["policy_params"]
  if "critic" in arrays:
    trainer.critic_state = arrays["critic"]
  trainer.prompts.set_state(meta["iterators"]["rl"])
  trainer.key = jax.random.wrap_key_data(jnp.asarray(meta["key"], jnp.uint32))
  pos = trainer.ctl
  pos.load(meta["position"])
  if pos.stage == "sft":  # (the SFT iterator is only needed while SFT runs)
    trainer._sft_setup()  # pylint: disable=protected-access
    trainer.sft_prompts.set_state(meta["iterators"]["sft"])
  trainer.summary = meta["summary"]
  # Records written after this checkpoint will be written again: drop them.
  purge = {s: 0 for s in run_control.STAGES}
  purge[pos.stage] = pos.step + 1
  purge["eval"] = pos.step + 1 if pos.stage == "rl" and pos.step else 0
  trainer.log.truncate(meta["metrics_lines"], purge)
  print(f"Restored checkpoint {step}: {pos.stage} step {pos.step} "
        f"(global step {pos.global_step})", flush=True)
  return step


def select_step(trainer, which: str) -> int:
  """"latest", "best" (highest eval avg@k) or a number, as a checkpoint step of the run."""
  steps = trainer.ckpt.steps() if trainer.ckpt else []
  if not steps:
    raise checkpointing.CheckpointError(f"no checkpoints under {trainer.workdir}")
  if which == "latest":
    return steps[-1]
  if which == "best":
    best = trainer.ckpt.best_step()
    if best is None:
      raise checkpointing.CheckpointError("no checkpoint has an eval score (best needs "
                                          "eval.every > 0 or a finished RL stage)")
    return best
  return int(which)


def policy_model(trainer):
  """The trainer's policy as an nnx module (for export and evaluation)."""
  return nnx.merge(trainer.graphdef, trainer.policy_params)


def _warn_config_changes(saved: dict, current: dict, prefix: str = "") -> None:
  """Warns about config fields that differ from the checkpoint's (resuming is allowed)."""
  for k in sorted(set(saved) | set(current)):
    a, b = saved.get(k), current.get(k)
    if isinstance(a, dict) and isinstance(b, dict):
      _warn_config_changes(a, b, f"{prefix}{k}.")
    elif json.loads(json.dumps(b)) != a:  # tuples were saved as lists
      warnings.warn(f"resuming with config.{prefix}{k}={b!r}; the checkpoint had {a!r}")
