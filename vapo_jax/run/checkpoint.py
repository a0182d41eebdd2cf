"""Step 5 of an RL step, the checkpoint: what it holds, and how it goes back into a run.

At a position (stage, step) a checkpoint holds the arrays that exist there —

    sft stage        "sft": the SFT TrainState (params, AdamW state, step)
    reward_model     "policy_params": the frozen policy, "reward_model": the RM's TrainState
    value_pretrain   "policy_params": the frozen policy, "critic": the critic's TrainState
    rl, done         "policy": the policy's TrainState, "critic": the critic's (with a critic),
                     "reference": the frozen initial policy (with GRPO's KL, rl.kl_coef > 0)

— and in its JSON meta everything else the run's randomness and bookkeeping depend on: the
position and fault counters (`RunControl`), both prompt iterators' epoch and position, the
PRNG key the rollouts split from, the number of metric records written, the summary so far,
the critic's typed record (`critic_stage.CriticState`) and the config. Mini-batch shuffles
are seeded by (seed, stage, step, epoch) and need no state. Restoring all of it makes the
resumed run take the same steps, on the same prompts, with the same random numbers, as a run
that never stopped.

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
from vapo_jax.run import learners
from vapo_jax.run import checkpoint_store
from vapo_jax.run import control as run_control
from vapo_jax.run import critic_stage
from vapo_jax.run import metrics as metrics_lib

CHECKPOINTS = "checkpoints"


@dataclasses.dataclass
class RunState:
  """Everything a checkpoint saves and restores, and where it goes (owned by the trainer).

  The arrays (`groups`) and, in the JSON meta, the position and fault counters (`ctl`), the
  prompt iterators, the PRNG key, the metric records written (`log`) and the summary.
  """
  cfg: Any                                   # config.Config
  ckpt: checkpoint_store.CheckpointStore | None
  ctl: run_control.RunControl
  log: metrics_lib.MetricsWriter
  prompts: PromptIterator                    # the RL / value-pretraining prompts
  key: jax.Array                             # rollouts split their keys from it
  policy_params: Any
  sft_prompts: PromptIterator | None = None  # while SFT runs
  # The trained networks ("sft", "policy", "critic", "reward_model": `rl.train_state.Learner`),
  # once their stage has set them up; their TrainStates are checkpoint groups of that name.
  learners: dict[str, Any] = dataclasses.field(default_factory=dict)
  ref_params: Any = None                     # the KL penalty's reference policy, once set up
  summary: dict[str, Any] = dataclasses.field(default_factory=dict)
  # The critic's return statistics, replayed draws and held-out sums (`run.critic_stage`).
  critic: critic_stage.CriticState = dataclasses.field(default_factory=critic_stage.CriticState)

  def next_key(self) -> jax.Array:
    self.key, sub = jax.random.split(self.key)
    return sub

  def train_state(self, name: str) -> Any:
    """The TrainState of learner `name`, or None when it is not set up."""
    learner = self.learners.get(name)
    return learner.state if learner is not None else None


def store(cfg, workdir: str | None, *, read_only: bool = False
          ) -> checkpoint_store.CheckpointStore | None:
  """The run's checkpoint store under `workdir/checkpoints` (None without a workdir)."""
  if not workdir:
    return None
  ck = cfg.checkpoint
  return checkpoint_store.CheckpointStore(os.path.join(workdir, CHECKPOINTS), keep=ck.keep,
                                       keep_best=ck.keep_best, async_save=ck.async_save,
                                       read_only=read_only)


# The learners whose parameters are the policy's, and the learner each stage trains; a
# learner is saved at its own stage, any other (the critic) whenever it is set up.
POLICY_LEARNERS = ("sft", "policy")
STAGE_LEARNER = {"sft": "sft", "reward_model": "reward_model", "rl": "policy", "done": "policy"}
# The frozen parameter trees a checkpoint may hold beside the learners' TrainStates.
FROZEN = ("policy_params", "reference")
# Every group a checkpoint may hold.
GROUPS = (*learners.LEARNERS, *FROZEN)


def groups(state: RunState) -> dict[str, Any]:
  """The arrays a checkpoint holds at the run's current position: the TrainState of the
  stage's learner and of any learner no stage owns (the critic), the policy's parameters
  unless that learner holds them, and the KL penalty's reference."""
  out = {}
  own = STAGE_LEARNER.get(state.ctl.stage)
  if own in state.learners:
    out[own] = state.learners[own].state
  if not (own in POLICY_LEARNERS and own in state.learners):
    out["policy_params"] = state.policy_params
  for name, learner in state.learners.items():
    if name not in STAGE_LEARNER.values():
      out[name] = learner.state
  if state.ref_params is not None:
    out["reference"] = state.ref_params
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
          "critic": state.critic.to_meta(),
          "config": dataclasses.asdict(state.cfg)}
  ckpt.save(state.ctl.global_step, groups(state), meta, score=score)


def restore(state: RunState, build: Callable[[str], Any], step: int | None = None
            ) -> int | None:
  """Puts checkpoint `step` (None: the newest that restores) back into the run's state.

  With step=None, damaged checkpoints are moved aside with a warning and the next older one
  is tried; an explicit step that fails raises. A checkpoint that does not fit this run
  (other trees, shapes or iterator settings, from a changed config) raises
  CheckpointMismatch, one line naming the first difference and the config fields changed
  since it was saved, and leaves every checkpoint in place. With
  `config.checkpoint.restore="weights"`, a checkpoint whose weights fit but whose optimizer
  state does not gives its weights to freshly built states instead. Returns the restored
  step, or None when there is no checkpoint.

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
  initial = (state.policy_params, state.key, state.prompts.get_state())
  current = dataclasses.asdict(state.cfg)
  weights_ok = state.cfg.checkpoint.restore == "weights"

  def like(name: str):
    if name not in GROUPS:
      raise checkpoint_store.CheckpointError(f"unknown checkpoint group {name!r}")
    return build(name)

  def reset():
    # Undo what a failed attempt built or set, so states match a run that never stopped.
    state.policy_params, state.key = initial[:2]
    state.prompts.set_state(initial[2])
    state.sft_prompts = state.ref_params = None
    state.learners.clear()
    state.critic = critic_stage.CriticState()

  def attempt(s, meta):
    reset()
    changes = _config_changes(meta.get("config", {}), current)

    def mismatch(what: str, weights_hint: bool):
      how = ("rerun with the checkpoint's config, start over with a fresh --workdir"
             + (", or set --config.checkpoint.restore=weights to restore only the model "
                "weights (fresh optimizer state)" if weights_hint else ""))
      return checkpoint_store.CheckpointMismatch(
          f"{what}; config changed since it was saved: {', '.join(changes) or 'nothing'}; "
          f"every checkpoint was left in place; to go on, {how}")

    likes = {n: like(n) for n in meta["groups"]}
    try:
      _set_iterators(state, meta, build)
    except ValueError as e:
      raise mismatch(f"checkpoint {s} does not fit this run: {e}", False) from e
    note = None
    try:
      arrays = ckpt.restore(s, likes)
    except checkpoint_store.CheckpointMismatch as e:
      weights = {n: _weights(n, t) for n, t in likes.items()}
      subtrees = {n: _weights_path(n) for n in likes}
      try:
        ckpt.check(s, weights, subtrees=subtrees)
      except checkpoint_store.CheckpointMismatch as e2:
        raise mismatch(f"{e2} (its model weights do not fit this run)", False) from e2
      if not weights_ok:  # (only the optimizer state does not fit)
        raise mismatch(f"{e} (the checkpoint does not fit this run)", True) from e
      params = ckpt.restore(s, weights, subtrees=subtrees)
      arrays = {n: p if n in FROZEN else dataclasses.replace(likes[n], params=p)
                for n, p in params.items()}
      note = (f"checkpoint.restore=weights: restored only the weights of checkpoint {s}; "
              f"the optimizer state starts fresh ({e})")
    return s, meta, arrays, changes, note

  if step is None:
    found = ckpt.restore_latest(attempt)
    if found is None:
      reset()
      return None
  else:
    if step not in ckpt.steps():
      raise checkpoint_store.CheckpointError(f"no checkpoint {step} in {ckpt.directory} "
                                          f"(there are {ckpt.steps()})")
    found = attempt(step, ckpt.read_meta(step))
  step, meta, arrays, changes, note = found
  for change in changes:
    warnings.warn(f"resuming with config.{change} (changed since checkpoint {step})")
  if note:
    warnings.warn(note)
  for name, tree in arrays.items():
    if name in state.learners:  # (set up by `build` as the restore target)
      state.learners[name].state = tree
      if name in POLICY_LEARNERS:
        state.policy_params = tree.params
  if "policy_params" in arrays:
    state.policy_params = arrays["policy_params"]
  if "reference" in arrays:
    state.ref_params = arrays["reference"]
  state.key = jax.random.wrap_key_data(jnp.asarray(meta["key"], jnp.uint32))
  pos = state.ctl
  pos.load(meta["position"])
  state.summary = meta["summary"]
  state.critic = critic_stage.CriticState.from_meta(meta.get("critic")
                                                    or _legacy_critic(state.summary))
  # Records written after this checkpoint will be written again: drop them.
  purge = {s: 0 for s in run_control.STAGES}
  purge[pos.stage] = pos.step + 1
  purge["eval"] = pos.step + 1 if pos.stage == "rl" and pos.step else 0
  state.log.truncate(meta["metrics_lines"], purge)
  print(f"Restored checkpoint {step}: {pos.stage} step {pos.step} "
        f"(global step {pos.global_step})", flush=True)
  return step


def initial_policy(run: str, like: Any, step: int | None = None) -> tuple[Any, str]:
  """The policy weights of another run's newest checkpoint (`model.init_from`).

  Args:
    run: that run's workdir (or its `checkpoints` directory).
    like: this run's freshly built policy parameters (structure and shardings).
    step: that checkpoint instead of the newest (a kept one; None: the newest).

  Returns:
    (the parameters, a note naming the checkpoint they came from).

  Raises:
    CheckpointError: there is no checkpoint there, or it holds no policy; CheckpointMismatch
      when its policy is another model than this run's.
  """
  directory = run if os.path.basename(os.path.normpath(run)) == CHECKPOINTS else os.path.join(
      run, CHECKPOINTS)
  if not os.path.isdir(directory):
    raise checkpoint_store.CheckpointError(f"model.init_from={run!r}: no {directory}")
  source = checkpoint_store.CheckpointStore(directory, keep_best=False, read_only=True)
  try:
    steps = source.steps()
    if not steps:
      raise checkpoint_store.CheckpointError(f"model.init_from={run!r}: no checkpoint in "
                                          f"{directory}")
    if step is not None:
      if step not in steps:
        raise checkpoint_store.CheckpointError(
            f"model.init_from={run!r}: no checkpoint {step} in {directory} (kept: {steps})")
      steps = [s for s in steps if s <= step]
    saved = source.read_meta(steps[-1])["groups"]
    name = next((g for g in ("policy", "sft", "policy_params") if g in saved), None)
    if name is None:
      raise checkpoint_store.CheckpointError(f"model.init_from={run!r}: checkpoint {steps[-1]} "
                                          f"holds no policy (it has {sorted(saved)})")
    params = source.restore(steps[-1], {name: like}, subtrees={name: _weights_path(name)}
                            )[name]
  finally:
    source.close()
  return params, f"the policy of {directory} step {steps[-1]} ({name})"


def _legacy_critic(summary: dict) -> dict:
  """The critic's record from a checkpoint saved before it had its own (2026-12-07): the
  summary's "critic_return_stats" and "critic_replay" entries, taken out of the summary."""
  stats = summary.pop("critic_return_stats", None)
  replay = summary.pop("critic_replay", None) or {}
  out = {"draws": replay.get("draws", []), "heldout": replay.get("heldout", [])}
  return {**out, "return_stats": stats} if stats else out


def _weights_path(group: str) -> str:
  """Where a group's model parameters sit in its tree: a TrainState's `.params`, or the
  whole (frozen) tree."""
  return "" if group in FROZEN else ".params"


def _weights(group: str, tree: Any) -> Any:
  """The model parameters in a group's tree (a TrainState's params, or the tree itself)."""
  return tree if group in FROZEN else tree.params


def _set_iterators(state: RunState, meta: dict, build: Callable[[str], Any]) -> None:
  """The prompt iterators continue from the checkpoint's; ValueError if they do not fit
  (other data, batch size, seed or process count)."""
  state.prompts.set_state(meta["iterators"]["rl"])
  if meta["position"]["stage"] == "sft":  # (the SFT iterator is only needed while SFT runs)
    build("sft")
    state.sft_prompts.set_state(meta["iterators"]["sft"])


def select_step(ckpt: checkpoint_store.CheckpointStore | None, which: str) -> int:
  """"latest", "best" (highest eval avg@k) or a number, as a checkpoint step of the run."""
  steps = ckpt.steps() if ckpt else []
  if not steps:
    raise checkpoint_store.CheckpointError(
        f"no checkpoints under {ckpt.directory if ckpt else 'a run without a workdir'}")
  if which == "latest":
    return steps[-1]
  if which == "best":
    best = ckpt.best_step()
    if best is None:
      raise checkpoint_store.CheckpointError("no checkpoint has an eval score (best needs "
                                          "eval.every > 0 or a finished RL stage)")
    return best
  return int(which)


def _config_changes(saved: dict, current: dict, prefix: str = "") -> list[str]:
  """Config fields that differ from the checkpoint's: ["optim.grad_clip=0.0 (was 1.0)", ...]."""
  out = []
  for k in sorted(set(saved) | set(current)):
    a, b = saved.get(k), current.get(k)
    if isinstance(a, dict) and isinstance(b, dict):
      out += _config_changes(a, b, f"{prefix}{k}.")
    elif json.loads(json.dumps(b)) != a:  # tuples were saved as lists
      out.append(f"{prefix}{k}={b!r} (was {a!r})")
  return out
