"""The VAPO pipeline: SFT warm start → [reward model] → value pretraining → RL, on a mesh.

    Trainer(cfg, workdir).run()

One RL step reads as its parts, in order:

    experience (rollout → reward → advantages)   [rl.experience]
      → update (ppo_epochs × num_minibatches × (policy step, critic step))   [rl.update]
      → checkpoint (periodic / best / on SIGTERM)   [run.checkpoint]

Value pretraining is the same loop with the policy frozen: the critic learns the Monte Carlo
returns (λ = 1) of the starting policy's samples until a stopping rule holds. With
model.critic_start = "reward_model" a reward-model stage comes first: an outcome reward model
(the policy's weights + a scalar head) learns the checker's score at the last token of the
frozen policy's samples, and the critic starts from it. The trainer
only orders the stages; their parts are built by `run.parts`, and everything a checkpoint
holds is the trainer's `RunState` (`run.checkpoint`).
"""

import functools
import os
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vapo_jax import config as config_lib
from vapo_jax import critic as critic_lib
from vapo_jax import data as data_lib
from vapo_jax.data import PromptIterator
from vapo_jax.run import learners as run_learners
from vapo_jax.run import checkpoint as run_checkpoint
from vapo_jax.run import compiles
from vapo_jax.run import host_memory
from vapo_jax.run import control as run_control
from vapo_jax.run import critic_stage
from vapo_jax.run import eval_records
from vapo_jax.run import evaluation
from vapo_jax.run import inputs
from vapo_jax.run import metrics as metrics_lib
from vapo_jax.run import forwards, networks, parts
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import update

CRITIC_DIR = critic_stage.CRITIC_DIR  # workdir/critic: HF-format critic after value pretraining
REWARD_MODEL_DIR = "reward_model"  # workdir/reward_model: HF-format RM after its stage
CURVES_PNG = "curves.png"


class Trainer:
  """Holds the run's parts and state and runs its stages in order."""

  def __init__(self, cfg, workdir: str | None = None, *, progress: bool = True,
               read_only: bool = False):
    """Builds the run's parts.

    Args:
      cfg: the run's `config.Config`.
      workdir: where metrics, checkpoints and the plot go (None: nowhere).
      progress: show progress bars.
      read_only: only read the workdir's checkpoints (tools that evaluate or export a run,
        perhaps while it trains): no metrics are written and no checkpoint is touched.
    """
    self.cfg, self.workdir, self.progress = cfg, workdir, progress
    # Before anything compiles: JAX reads the persistent cache's setting at its first compile.
    self.compile_cache = compiles.enable_cache(cfg.compile.cache, cfg.compile.cache_dir)
    wandb_args = None if read_only else _wandb_args(cfg)  # a missing wandb stops us here
    self.parts = p = parts.build(cfg)
    self.critic_values = None  # the critic's jitted forward, once it is set up
    self.ckpt = run_checkpoint.store(cfg, workdir, read_only=read_only)
    self.ctl = run_control.RunControl(
        stage=run_control.first_stage(cfg), max_in_a_row=cfg.faults.max_consecutive_nonfinite,
        save_every=cfg.checkpoint.every, collective_timeout_s=cfg.faults.collective_timeout_s,
        step_timeout_s=cfg.faults.step_timeout_s, sigterm_grace_s=cfg.faults.sigterm_grace_s)
    policy_params = p.policy_params
    if cfg.model.init_from:  # (a checkpoint of this run's own, if any, replaces it on resume)
      policy_params, note = run_checkpoint.initial_policy(cfg.model.init_from, policy_params)
      print(f"model.init_from: starting from {note}", flush=True)
    # The global batch of prompts, identical on every host; each host then feeds only the
    # rows its devices hold (see rl.experience).
    self.state = run_checkpoint.RunState(
        cfg=cfg, ckpt=self.ckpt, ctl=self.ctl,
        log=metrics_lib.MetricsWriter(None if read_only else workdir,
                                      tensorboard=cfg.metrics.tensorboard,
                                      wandb=wandb_args),
        prompts=PromptIterator(p.train_examples, cfg.rl.rollout_prompts, seed=cfg.seed),
        key=jax.random.key(cfg.seed), policy_params=policy_params)

  # -------------------------------------------------------------------------- parts
  def setup(self, name: str):
    """Sets up (once) and returns a checkpoint group's tree: one of `run_learners.LEARNERS` ("sft",
    "policy", "critic", "reward_model": a `Learner`, whose TrainState is returned),
    "policy_params" or "reference" (a frozen copy of the policy's parameters as they are
    now: at RL's start).

    The critic starts as model.critic_start says; from "reward_model" it takes the trained
    reward model's weights when there is one (else the policy's shape: a restore target)."""
    s, p, cfg = self.state, self.parts, self.cfg
    if name == "policy_params":
      return s.policy_params
    if name == "reference":
      if s.ref_params is None:
        # A copy: the policy's train step donates (and so invalidates) its own buffers.
        s.ref_params = jax.jit(lambda t: jax.tree.map(jnp.copy, t))(s.policy_params)
      return s.ref_params
    if name not in s.learners:
      graphdef, params = self._network(name)
      s.learners[name] = run_learners.learner(cfg, name, graphdef, params, p.mesh, p.rules)
      if name == "critic":
        self.critic_values = forwards.values_fn(cfg, graphdef, p.mesh, p.rules)
      if name == "sft":
        # The global batch, identical on every host (like the RL prompts): SFT is the same
        # for any number of processes, and resumes on a different number.
        s.sft_prompts = PromptIterator(p.train_examples, cfg.sft.batch_size,
                                       seed=cfg.init_seed + 1)
    return s.learners[name].state

  def _network(self, name: str):
    """(graphdef, initial parameters) of a network to train: the policy's for "sft" and
    "policy", a value model for "critic" and "reward_model" (`networks.build_critic`)."""
    s, p = self.state, self.parts
    if name == "critic":
      rm = s.learners.get("reward_model")
      return networks.build_critic(self.cfg, p.graphdef, s.policy_params, p.mesh, p.rules,
                                   params=rm.state.params if rm else None)
    if name == "reward_model":
      return networks.build_critic(self.cfg, p.graphdef, s.policy_params, p.mesh, p.rules,
                                   from_path=False)
    return p.graphdef, s.policy_params

  def policy_model(self):
    return nnx.merge(self.parts.graphdef, self.state.policy_params)

  def critic_model(self):
    return self.state.learners["critic"].model()

  def _bar(self, total: int, desc: str, start: int = 0):
    return metrics_lib.progress_bar(total, desc, enabled=self.progress, start=start)

  # ------------------------------------------------------------------------- stages
  def sft(self) -> dict[str, float]:
    """Supervised warm start on the examples' worked solutions."""
    cfg, s = self.cfg, self.state
    self.setup("sft")
    sft = s.learners["sft"]
    start = self.ctl.enter("sft")
    bar = self._bar(cfg.sft.steps, "sft", start)
    metrics = {}
    for i in range(start, cfg.sft.steps):
      c0 = compiles.snapshot()
      batch = batch_lib.RolloutBatch(**inputs.sft_batch(
          next(s.sft_prompts), self.parts.text, cfg.data.max_prompt_tokens,
          cfg.sampling.max_new_tokens))
      sft.state, m, skipped = sft.step(
          sft.state, batch_lib.shard_batch(batch, self.parts.mesh, self.parts.batch_axes))
      m = {k: float(v) for k, v in jax.device_get(m).items()}
      m.update(self.ctl.count_skipped([float(skipped) > 0], f"sft step {i + 1}"))
      m.update(compiles.since(c0))
      if (i + 1) % cfg.log_every == 0 or i + 1 == cfg.sft.steps:
        m["lr/sft"] = sft.learning_rate()
        metrics = m
        s.log.write("sft", i + 1, metrics)
        bar.set_postfix(loss=f"{metrics['sft_loss']:.3f}")
      bar.update(1)
      self._step_end("sft", i + 1, last=i + 1 == cfg.sft.steps)
    bar.close()
    s.policy_params = sft.state.params
    del s.learners["sft"]  # frees the SFT optimizer's moments before the critic is built
    return metrics

  def reward_model(self) -> dict[str, float]:
    """Trains an outcome reward model on the frozen policy's scored samples (MSE at the last
    token, `update.reward_model_step`): reward_model.steps rollout steps."""
    cfg, s = self.cfg, self.state
    self.setup("reward_model")
    rm = s.learners["reward_model"]
    start = self.ctl.enter("reward_model")
    steps = cfg.reward_model.steps
    bar = self._bar(steps, "reward model", start)
    metrics = {}
    for i in range(start, steps):
      batch, em = self.parts.experience.sample_and_score(s.policy_params, next(s.prompts),
                                                         s.next_key())
      states, um, skipped = update.ppo_updates(run_learners.ppo_loop(cfg), [rm], batch,
                                               self.parts.take, stage="reward_model", step=i)
      rm.state = states["reward_model"]
      um.update(self.ctl.count_skipped(skipped, f"reward_model step {i + 1}"))
      um["lr/reward_model"] = rm.learning_rate()
      metrics = {**em, **um}
      s.log.write("reward_model", i + 1, metrics)
      bar.update(1)
      bar.set_postfix(rm_loss=f"{um['rm_loss']:.4f}")
      self._step_end("reward_model", i + 1, last=i + 1 == steps)
    bar.close()
    return metrics

  def _critic_from_reward_model(self):
    """After the reward-model stage: the RM as an HF directory (workdir/reward_model, which
    model.critic_path of other runs loads), and the critic set up from it."""
    s = self.state
    if self.workdir and self.cfg.checkpoint.save_critic:
      critic_lib.save_pretrained(s.learners["reward_model"].model(),
                                 os.path.join(self.workdir, REWARD_MODEL_DIR))
    self.setup("critic")
    del s.learners["reward_model"]  # the critic holds the weights now; frees its optimizer

  def experience(self, examples, *, for_value_pretraining: bool = False, key=None
                 ) -> tuple[batch_lib.RolloutBatch, dict]:
    """Steps 1–3 on the step's global prompts: (device batch, metrics); see rl.experience.

    Dynamic sampling's extra rounds take the next prompts of the same iterator (so a resumed
    run draws the same ones); the reference's log-probs come with the KL penalty. The
    rollout key is `key`, else the run's next."""
    s = self.state
    critic = s.learners.get("critic")
    values = None
    if critic is not None:
      values = functools.partial(critic_stage.bound_values, self.critic_values,
                                 critic.state.params,
                                 self.return_stats() if self.cfg.rl.value_norm != "none"
                                 else None)
    return self.parts.experience(
        s.policy_params, examples, s.next_key() if key is None else key, values=values,
        for_value_pretraining=for_value_pretraining,
        ref_params=None if for_value_pretraining else s.ref_params,
        more_examples=lambda: next(s.prompts))

  def update(self, batch: batch_lib.RolloutBatch, *, stage: str, step: int, policy: bool,
             loop: update.PPOLoop | None = None) -> dict:
    """Step 4: the PPO loop (default: the run's, `run_learners.ppo_loop`) over one batch;
    skipped non-finite updates are counted here."""
    names = ["policy"] * policy + ["critic"] * ("critic" in self.state.learners)
    learners = [self.state.learners[n] for n in names]
    states, out, skipped = update.ppo_updates(loop or run_learners.ppo_loop(self.cfg), learners,
                                              batch, self.parts.take, stage=stage, step=step)
    for learner in learners:
      learner.state = states[learner.name]
    out.update(self.ctl.count_skipped(skipped, f"{stage} step {step + 1}"))
    out.update({f"lr/{learner.name}": learner.learning_rate() for learner in learners})
    return out

  # ---------------------------------------------------------- the critic (run.critic_stage)
  def return_stats(self) -> critic_lib.ReturnStats:
    """The running statistics of the critic's targets (rl.value_norm="running")."""
    return self.state.critic.return_stats

  def critic_targets(self, batch: batch_lib.RolloutBatch,
                     replayed: list[batch_lib.RolloutBatch] = ()) -> batch_lib.RolloutBatch:
    return critic_stage.targets(self, batch, replayed)

  def value_pretrain(self) -> dict[str, float]:
    return critic_stage.value_pretrain(self)

  def evaluate(self, examples=None, rl_step: int | None = None,
               records_path: str | None = None) -> dict[str, float]:
    """The held-out evaluation; its per-problem records go to records_path, else (at an RL
    step of a run that writes metrics) to `eval_records.run_path`."""
    cfg, p = self.cfg, self.parts
    examples = (examples or p.eval_examples)[:cfg.eval.num_examples]
    if records_path is None and rl_step is not None and self.state.log.workdir:
      records_path = eval_records.run_path(self.state.log.workdir, rl_step)
    out = evaluation.evaluate(p.samplers.eval, p.samplers.greedy, self.state.policy_params,
                               examples, p.text, p.eval_scorer, jax.random.key(cfg.seed + 7),
                               batch_prompts=cfg.eval.batch_prompts,
                               threshold=cfg.eval.correct_threshold,
                               short_tokens=cfg.eval.short_response_tokens,
                               kind_of=_kind_of(cfg.data),
                               records_path=records_path)
    if rl_step is not None:  # the critic on fresh held-out rollouts (metrics.critic_heldout_*)
      out.update(critic_stage.heldout_readout(self, rl_step))
    return out

  def rl(self) -> dict[str, Any]:
    """VAPO RL (or the preset's variant) for rl.steps steps (continuing a resumed run)."""
    cfg, rl, s = self.cfg, self.cfg.rl, self.state
    if cfg.uses_critic:
      self.setup("critic")
    if rl.kl_coef > 0:
      self.setup("reference")
    self.setup("policy")
    start = self.ctl.enter("rl")
    bar = self._bar(rl.steps, "rl", start)
    history = []
    for i in range(start, rl.steps):
      c0 = compiles.snapshot()
      t0 = time.perf_counter()
      batch, em = self.experience(next(s.prompts))
      host_memory.trim()  # the rollout's KV pool and decode copy are free (run/host_memory.py)
      if cfg.uses_critic:
        em.update(critic_stage.diagnostics(self, batch))
        batch = self.critic_targets(batch)
      t1 = time.perf_counter()
      um = self.update(batch, stage="rl", step=i, policy=True)
      s.policy_params = s.learners["policy"].state.params
      t2 = time.perf_counter()
      metrics = {**em, **um, "time/update_s": t2 - t1, "time/step_s": t2 - t0}
      score = None
      if cfg.eval.every and (i + 1) % cfg.eval.every == 0 and i + 1 < rl.steps:
        ev = self.evaluate(rl_step=i + 1)
        metrics.update({f"eval/{k}": v for k, v in ev.items()})
        metrics["time/eval_s"] = time.perf_counter() - t2
        s.log.write("eval", i + 1, ev)
        score = ev[f"avg@{cfg.eval.samples_per_problem}"]
      metrics.update(compiles.since(c0))  # the step's compiles, its evaluation's included
      history.append(metrics)
      if (i + 1) % cfg.log_every == 0 or i + 1 == rl.steps:
        s.log.write("rl", i + 1, metrics)
      shown = {"reward": ("reward/mean", 3), "acc": ("reward/accuracy", 3),
               "len": ("response/length_mean", 1), "ent": ("entropy", 3),
               "vloss": ("value_loss", 4), "ev": ("value/explained_variance", 2)}
      bar.update(1)
      bar.set_postfix({k: f"{metrics[m]:.{d}f}" for k, (m, d) in shown.items() if m in metrics})
      self._step_end("rl", i + 1, last=i + 1 == rl.steps, score=score)
    bar.close()
    return {"history": history}

  def run(self) -> dict[str, Any]:
    """All stages in order, resuming from the workdir's newest good checkpoint.

    Returns the evaluation before and after RL (and the stages' last metrics). On SIGTERM
    the run saves at the next step boundary and returns early with `summary["preempted"]`;
    running the same command again continues exactly where it stopped.
    """
    cfg = self.cfg
    t0 = time.perf_counter()
    self.state.summary = {"data": self.parts.data_stats}
    if cfg.checkpoint.resume:
      self.resume()
    elif self.ckpt and self.ckpt.steps():
      raise ValueError(f"{self.ckpt.directory} holds checkpoints {self.ckpt.steps()} and "
                       "config.checkpoint.resume is False: use a fresh --workdir (a new run "
                       "would not be able to save over them)")
    summary, log = self.state.summary, self.state.log
    if cfg.faults.handle_sigterm:
      self.ctl.install_sigterm()
    try:
      if self.ctl.stage == "sft":
        summary["sft"] = self.sft()
        self._finish_stage("sft")
      if self.ctl.stage == "reward_model":
        summary["reward_model"] = self.reward_model()
        self._critic_from_reward_model()
        self._finish_stage("reward_model")
      if self.ctl.stage == "value_pretrain":
        summary["value_pretrain"] = self.value_pretrain()
        critic_stage.save(self, self.workdir)
        self._finish_stage("value_pretrain")
      if self.ctl.stage == "rl":
        if self.ctl.step == 0:
          summary["eval_before_rl"] = self.evaluate(rl_step=0)
          log.write("eval", 0, summary["eval_before_rl"])
        score = None
        if cfg.rl.steps:
          history = self.rl()["history"]
          if history:
            summary["rl_last"] = history[-1]
          summary["eval_after_rl"] = self.evaluate(rl_step=cfg.rl.steps)
          log.write("eval", cfg.rl.steps, summary["eval_after_rl"])
          score = summary["eval_after_rl"][f"avg@{cfg.eval.samples_per_problem}"]
        self._finish_stage("rl", score=score)
    except run_control.Preempted as e:
      summary["preempted"] = str(e)
    finally:
      if self.ckpt:
        with self.ctl.guard("checkpoint write"):
          self.ckpt.wait()
      self.ctl.close()
      log.flush()
    if "preempted" not in summary:
      self._plot()
    summary["wall_s"] = time.perf_counter() - t0
    return summary

  def close(self):
    self.ctl.close()
    self.parts.scorer.close()
    self.state.log.close()
    if self.ckpt:
      self.ckpt.close()

  # -------------------------------------------------------------------- checkpoints
  def _step_end(self, stage: str, done: int, *, last: bool, score: float | None = None):
    """Step boundary: periodic / best / preemption saves; raises Preempted on SIGTERM."""
    host_memory.trim()
    self.ctl.advance(stage, done)
    stop = self.ctl.stop_requested()
    if stop or (not last and self.ctl.periodic_save_due()) or (
        score is not None and self.cfg.checkpoint.keep_best):
      self.save(score=score)
    if stop:
      if self.ckpt:
        with self.ctl.guard("checkpoint write"):
          self.ckpt.wait()
      raise run_control.Preempted(
          f"stopped by SIGTERM after {stage} step {done} (global step "
          f"{self.ctl.global_step}); " + (f"checkpoint saved in {self.ckpt.directory}, "
                                          "run the same command to resume" if self.ckpt
                                          else "no workdir, nothing saved"))

  def _finish_stage(self, stage: str, score: float | None = None):
    self.ctl.stage, self.ctl.step = run_control.next_stage(self.cfg, stage), 0
    self.save(score=score)

  def save(self, score: float | None = None) -> None:
    """Checkpoints the current position (no-op without a workdir or if already saved)."""
    with self.ctl.guard(f"checkpoint save {self.ctl.global_step}"):
      run_checkpoint.save(self.state, score=score)

  def resume(self, step: int | None = None) -> int | None:
    """Restores checkpoint `step` (None: the newest good one); returns its step or None."""
    with self.ctl.guard("checkpoint restore"):
      return run_checkpoint.restore(self.state, self.setup, step)

  def _plot(self):
    if not (self.workdir and self.cfg.metrics.plot and self.state.log.path):
      return
    try:
      from vapo_jax.run import plotting  # pylint: disable=import-outside-toplevel
      plotting.plot_runs([self.workdir], os.path.join(self.workdir, CURVES_PNG))
    except ImportError as e:
      warnings.warn(f"no {CURVES_PNG}: {e}")


def _wandb_args(cfg) -> dict[str, Any] | None:
  """`MetricsWriter`'s W&B arguments from metrics.wandb*, or None when it is off.

  Checks first that `wandb` imports, so that a missing package stops the run before any
  work with one line (an ImportError naming what to install)."""
  m = cfg.metrics
  if not m.wandb:
    return None
  from vapo_jax.run import wandb_log  # pylint: disable=import-outside-toplevel
  wandb_log.require()
  return {"project": m.wandb_project, "name": m.wandb_name,
          "config": config_lib.to_dict(cfg)}


def _kind_of(d):
  """The evaluation's per-kind breakdown (avg@k/<kind>): chain_or_guess's kinds, or the arm
  of a reasoning-gym problem; None for other data."""
  if d.source == "synthetic" and d.synthetic_task == "chain_or_guess":
    return data_lib.chain_mix.kind_of
  if d.source == "reasoning_gym":
    return data_lib.reasoning_gym.arm_of
  return None
