"""Step 5 of an RL step, the checkpoint: what it holds, and how it goes back into a run.

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

All of it is a `RunState`, which the trainer owns and hands over: save reads it, restore
writes it. The restore targets are freshly built states (the trainer's `build` callback), so
arrays come back in the new run's shardings, whatever mesh it has.
"""

import dataclasses
import json
import os
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax.data import PromptIterator
from vapo_jax.run import checkpoint_store as checkpointing
from vapo_jax.run import control as run_control
from vapo_jax.run import metrics as metrics_lib

CHECKPOINTS = "checkpoints"


@dataclasses.dataclass
class RunState:
  """Everything a checkpoint saves and restores, and where it goes (owned by the trainer).

  The arrays (`groups`) and, in the JSON meta, the position and fault counters (`ctl`), the
  prompt iterators, the PRNG key, the metric records written (`log`) and the summary.
  """
  cfg: Any                                   # config.Config
  ckpt: checkpointing.CheckpointStore | None
  ctl: run_control.RunControl
  log: metrics_lib.MetricsWriter
  prompts: PromptIterator                    # the RL / value-pretraining prompts
  key: jax.Array                             # rollouts split their keys from it
  policy_params: Any
  sft_prompts: PromptIterator | None = None  # while SFT runs
  sft_state: Any = None                      # TrainStates, once their stage has set them up
  policy_state: Any = None
  critic_state: Any = None
  summary: dict[str, Any] = dataclasses.field(default_factory=dict)

  def next_key(self) -> jax.Array:
    self.key, sub = jax.random.split(self.key)
    return sub


def store(cfg, workdir: str | None, *, read_only: bool = False
          ) -> checkpointing.CheckpointStore | None:
  """The run's checkpoint store under `workdir/checkpoints` (None without a workdir)."""
  if not workdir:
    return None
  ck = cfg.checkpoint
  return checkpointing.CheckpointStore(os.path.join(workdir, CHECKPOINTS), keep=ck.keep,
                                       keep_best=ck.keep_best, async_save=ck.async_save,
                                       read_only=read_only)


def groups(state: RunState) -> dict[str, Any]:
  """The arrays a checkpoint holds at the run's current position."""
  out = {}
  stage = state.ctl.stage
  if stage == "sft" and state.sft_state is not None:
    out["sft"] = state.sft_state
  elif stage in ("rl", "done") and state.policy_state is not None:
    out["policy"] = state.policy_state
  else:
    out["policy_params"] = state.policy_params
  if state.critic_state is not None:
    out["critic"] = state.critic_state
  return out


def save(state: RunState, score: float | None = None) -> None:
  """Checkpoints the run's position (no-op without a workdir or if already saved).

  Args:
    state: the run's state.
    score: the eval avg@k at this point, if any (the best-scoring checkpoint is kept).
  """
  ckpt = state.ckpt
  if not ckpt or ckpt.read_only or state.ctl.global_step in ckpt.steps():
    return
  iterators = {"rl": state.prompts.get_state()}
  if state.sft_prompts is not None:
    iterators["sft"] = state.sft_prompts.get_state()
  meta = {"position": state.ctl.state(), "iterators": iterators,
          "key": [int(x) for x in np.asarray(jax.random.key_data(state.key)).ravel()],
          "metrics_lines": state.log.lines, "summary": state.summary,
          "config": dataclasses.asdict(state.cfg)}
  ckpt.save(state.ctl.global_step, groups(state), meta, score=score)


GROUPS = ("sft", "policy", "critic", "policy_params")


def restore(state: RunState, build: Callable[[str], Any], step: int | None = None
            ) -> int | None:
  """Puts checkpoint `step` (None: the newest that restores) back into the run's state.

  With step=None, checkpoints that fail to restore are moved aside with a warning and the
  next older one is tried; an explicit step that fails raises. Returns the restored step,
  or None when there is no checkpoint.

  Args:
    state: the run's state (written in place).
    build: build(group) sets up that group's freshly built tree in `state` (the restore
      target: structure and shardings) and returns it; groups are GROUPS, "sft" also sets
      up the SFT prompt iterator. Calling it again returns what is there.
    step: the checkpoint.
  """
  ckpt = state.ckpt
  if not ckpt:
    return None
  initial = (state.policy_params, state.key)

  def like(name: str):
    if name not in GROUPS:
      raise checkpointing.CheckpointError(f"unknown checkpoint group {name!r}")
    return build(name)

  def attempt(s, meta):
    # Undo what a failed earlier attempt built, so states match a run that never stopped.
    state.policy_params, state.key = initial
    state.sft_state = state.sft_prompts = state.policy_state = None
    state.critic_state = None
    _warn_config_changes(meta.get("config", {}), dataclasses.asdict(state.cfg))
    return s, meta, ckpt.restore(s, {n: like(n) for n in meta["groups"]})

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
    state.sft_state = arrays["sft"]
    state.policy_params = state.sft_state.params
  if "policy" in arrays:
    state.policy_state = arrays["policy"]
    state.policy_params = state.policy_state.params
  if "policy_params" in arrays:
    state.policy_params = arrays["policy_params"]
  if "critic" in arrays:
    state.critic_state = arrays["critic"]
  state.prompts.set_state(meta["iterators"]["rl"])
  state.key = jax.random.wrap_key_data(jnp.asarray(meta["key"], jnp.uint32))
  pos = state.ctl
  pos.load(meta["position"])
  if pos.stage == "sft":  # (the SFT iterator is only needed while SFT runs)
    build("sft")
    state.sft_prompts.set_state(meta["iterators"]["sft"])
  state.summary = meta["summary"]
  # Records written after this checkpoint will be written again: drop them.
  purge = {s: 0 for s in run_control.STAGES}
  purge[pos.stage] = pos.step + 1
  purge["eval"] = pos.step + 1 if pos.stage == "rl" and pos.step else 0
  state.log.truncate(meta["metrics_lines"], purge)
  print(f"Restored checkpoint {step}: {pos.stage} step {pos.step} "
        f"(global step {pos.global_step})", flush=True)
  return step


def select_step(ckpt: checkpointing.CheckpointStore | None, which: str) -> int:
  """"latest", "best" (highest eval avg@k) or a number, as a checkpoint step of the run."""
  steps = ckpt.steps() if ckpt else []
  if not steps:
    raise checkpointing.CheckpointError(
        f"no checkpoints under {ckpt.directory if ckpt else 'a run without a workdir'}")
  if which == "latest":
    return steps[-1]
  if which == "best":
    best = ckpt.best_step()
    if best is None:
      raise checkpointing.CheckpointError("no checkpoint has an eval score (best needs "
                                          "eval.every > 0 or a finished RL stage)")
    return best
  return int(which)


def _warn_config_changes(saved: dict, current: dict, prefix: str = "") -> None:
  """Warns about config fields that differ from the checkpoint's (resuming is allowed)."""
  for k in sorted(set(saved) | set(current)):
    a, b = saved.get(k), current.get(k)
    if isinstance(a, dict) and isinstance(b, dict):
      _warn_config_changes(a, b, f"{prefix}{k}.")
    elif json.loads(json.dumps(b)) != a:  # tuples were saved as lists
      warnings.warn(f"resuming with config.{prefix}{k}={b!r}; the checkpoint had {a!r}")
