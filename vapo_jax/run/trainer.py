"""The VAPO pipeline: SFT warm start → value pretraining → RL, on a device mesh.

    Trainer(cfg, workdir).run()

RL step (group sampling, then PPO-style updates):

    P prompts ──sampler (n each)──▶ rollout ──checker──▶ scores
      └─ policy forward (old log-probs) and critic forward (V(s_t)), dispatched before the
         host scores the responses so device and host work overlap
      ──▶ advantages (λ_policy) and critic targets (λ_critic)      [rl_batch]
      ──▶ ppo_epochs × num_minibatches × (policy step, critic step)  [train_steps]

Value pretraining is the same loop with the policy frozen: the critic learns the Monte Carlo
returns (λ = 1) of the starting policy's samples until a stopping rule holds.
"""

import dataclasses
import functools
import os
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax.run import parts as builders
from vapo_jax import critic as critic_lib
from vapo_jax import distributed as dist
from vapo_jax.run import evaluation
from vapo_jax.rl import rollout as host_data
from vapo_jax.run import metrics as metrics_lib
from vapo_jax.rl import advantages as rl_batch
from vapo_jax.sampler import types as rollout_lib
from vapo_jax.run import checkpoint as run_checkpoint
from vapo_jax.run import control as run_control
from vapo_jax.rl import update as ts
from vapo_jax.data import PromptIterator
from vapo_jax.rewards import RewardScorer

CRITIC_DIR = "critic"          # workdir/critic: HF-format critic after value pretraining
CURVES_PNG = "curves.png"


def _mean_metrics(records: list[dict]) -> dict[str, float]:
  records = jax.device_get(records)
  keys = records[0].keys()
  return {k: float(np.mean([r[k] for r in records])) for k in keys}


def _lr(base: float, warmup: int, count) -> float:
  """The learning rate of `ts.make_optimizer`'s schedule after `count` updates."""
  return base * min(1.0, int(count) / warmup) if warmup else base


class Trainer:
  """Holds the run's parts and runs its stages in order."""

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
    self.cfg = cfg
    self.workdir = workdir
    self.progress = progress
    self.log = metrics_lib.MetricsWriter(None if read_only else workdir,
                                         tensorboard=cfg.metrics.tensorboard)
    ck = cfg.checkpoint
    self.ckpt = run_checkpoint.store(cfg, workdir, read_only=read_only)
    self.ctl = run_control.RunControl(
        stage=run_control.first_stage(cfg), max_in_a_row=cfg.faults.max_consecutive_nonfinite,
        save_every=ck.every)
    self.summary: dict[str, Any] = {}
    self.sft_state = self.sft_prompts = self.policy_state = None
    self.rules = builders.rules_of(cfg)
    self.mesh = builders.build_mesh(cfg)
    self.batch_axes = builders.batch_axes(self.mesh, self.rules)
    builders.device_count_check(cfg, self.mesh, self.rules)
    self.text = builders.build_text(cfg)
    self.train_examples, self.eval_examples, self.data_stats = builders.build_examples(
        cfg, self.text)
    if not self.eval_examples:
      self.eval_examples = self.train_examples[:cfg.eval.num_examples]
    self.graphdef, self.policy_params, self.model_cfg = builders.build_policy(
        cfg, self.mesh, self.rules, self.text)
    self.critic_graphdef = self.critic_state = None
    self.scorer = RewardScorer(cfg.reward.fn, num_workers=cfg.reward.num_workers,
                               timeout_s=cfg.reward.timeout_s)
    self.key = jax.random.key(cfg.seed)
    # The global batch of prompts, identical on every host; each host then feeds only the
    # rows its devices hold (see experience()).
    self.prompts = PromptIterator(self.train_examples, cfg.prompts_per_step, seed=cfg.seed)
    n = cfg.responses_per_prompt
    self.rollout_sampler = builders.build_sampler(cfg, self.graphdef, self.model_cfg,
                                                  self.mesh, self.rules, self.text, n=n)
    self.eval_sampler = builders.build_sampler(cfg, self.graphdef, self.model_cfg, self.mesh,
                                               self.rules, self.text,
                                               n=cfg.eval.samples_per_problem)
    self.greedy_sampler = builders.build_sampler(cfg, self.graphdef, self.model_cfg,
                                                 self.mesh, self.rules, self.text, n=1,
                                                 greedy=True)
    self.adv_cfg = rl_batch.advantage_config(cfg)
    self._adv_fn = jax.jit(functools.partial(rl_batch.compute_advantages, self.adv_cfg))
    self._mc_fn = jax.jit(functools.partial(rl_batch.compute_advantages, dataclasses.replace(
        self.adv_cfg, use_critic=True, decoupled=True, lam_critic=1.0)))
    rows = cfg.prompts_per_step * n
    self.minibatch_rows = rows // cfg.rl.num_minibatches
    mb = cfg.rl.micro_batch_size
    self.micro_batches = self.minibatch_rows // mb if mb else 1
    # The old-log-prob and value passes over the whole rollout run in train-sized
    # micro-batches: at 32B × 20k tokens the whole batch at once would not fit any pod.
    self.forward_chunks = rows // mb if mb else 1
    self._logp_fn = jax.jit(ts.in_micro_batches(functools.partial(
        ts.policy_logprobs, self.graphdef), self.forward_chunks, self.mesh, self.rules),
                            static_argnames=("prompt_len", "temperature"))
    take = jax.jit(lambda batch, idx: jax.tree.map(lambda x: jnp.take(x, idx, 0), batch),
                   out_shardings=ts.batch_sharding(self.mesh, self.batch_axes))
    # idx is the same on every host; as a replicated global array it also works multi-host.
    self._take = lambda batch, idx: take(batch, dist.replicated(np.asarray(idx), self.mesh))

  # ------------------------------------------------------------------------ helpers
  def _next_key(self):
    self.key, sub = jax.random.split(self.key)
    return sub

  def _bar(self, total: int, desc: str):
    if not self.progress:
      return None
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(total=total, desc=desc, dynamic_ncols=True, leave=True)

  def _ensure_critic(self):
    if self.critic_state is None:
      self.critic_graphdef, params = builders.build_critic(
          self.cfg, self.graphdef, self.policy_params, self.mesh, self.rules)
      o = self.cfg.optim
      self.critic_tx = ts.make_optimizer(o.critic_lr, warmup_steps=o.warmup_steps,
                                         weight_decay=o.weight_decay, b1=o.b1, b2=o.b2,
                                         eps=o.eps, grad_clip=o.grad_clip)
      self.critic_state = ts.init_state(params, self.critic_tx)
      hp = ts.critic_hparams(self.cfg, self.micro_batches)
      self._critic_step = ts.compile_step(
          functools.partial(ts.critic_step, self.critic_graphdef, self.critic_tx, hp),
          self.critic_state, self.mesh, self.batch_axes, self.rules)
      self._values_fn = jax.jit(ts.in_micro_batches(functools.partial(
          ts.critic_values, self.critic_graphdef), self.forward_chunks, self.mesh, self.rules),
                                static_argnames=("prompt_len",))

  def _sft_setup(self):
    """The SFT optimizer, state, compiled step and iterator (once)."""
    if self.sft_state is not None:
      return
    cfg, o = self.cfg, self.cfg.optim
    self.sft_warmup = min(o.warmup_steps, cfg.sft.steps // 10)
    tx = ts.make_optimizer(o.sft_lr, warmup_steps=self.sft_warmup,
                           weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                           grad_clip=o.grad_clip)
    self.sft_state = ts.init_state(self.policy_params, tx)
    self._sft_step = ts.compile_step(functools.partial(ts.sft_step, self.graphdef, tx),
                                     self.sft_state, self.mesh, self.batch_axes, self.rules)
    self.sft_prompts = PromptIterator(self.train_examples, cfg.sft.batch_size,
                                      seed=cfg.seed + 1, process_index=jax.process_index(),
                                      process_count=jax.process_count())

  def _rl_setup(self):
    """The policy optimizer, state and compiled step of the RL stage (once)."""
    if self.policy_state is not None:
      return
    cfg, o = self.cfg, self.cfg.optim
    tx = ts.make_optimizer(o.policy_lr, warmup_steps=o.warmup_steps,
                           weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                           grad_clip=o.grad_clip)
    self.policy_state = ts.init_state(self.policy_params, tx)
    hp = ts.policy_hparams(cfg, self.micro_batches)
    self._policy_step = ts.compile_step(functools.partial(ts.policy_step, self.graphdef, tx, hp),
                                        self.policy_state, self.mesh, self.batch_axes,
                                        self.rules)

  # ------------------------------------------------------------------------- stages
  def sft(self) -> dict[str, float]:
    """Supervised warm start on the examples' worked solutions."""
    cfg = self.cfg
    self._sft_setup()
    start = self.ctl.enter("sft")
    bar = self._bar(cfg.sft.steps, "sft")
    if bar:
      bar.update(start)
    metrics = {}
    for i in range(start, cfg.sft.steps):
      batch = builders.sft_batch(next(self.sft_prompts), self.text, cfg.data.max_prompt_tokens,
                                 cfg.sampling.max_new_tokens)
      self.sft_state, m = self._sft_step(self.sft_state,
                                         ts.shard_batch(batch, self.mesh, self.batch_axes))
      m = {k: float(v) for k, v in jax.device_get(m).items()}
      m.update(self.ctl.count_skipped([m.pop("sft_skipped") > 0], f"sft step {i + 1}"))
      if (i + 1) % cfg.log_every == 0 or i + 1 == cfg.sft.steps:
        m["lr/sft"] = _lr(cfg.optim.sft_lr, self.sft_warmup, self.sft_state.step)
        metrics = m
        self.log.write("sft", i + 1, metrics)
        if bar:
          bar.set_postfix(loss=f"{metrics['sft_loss']:.3f}")
      if bar:
        bar.update(1)
      self._step_end("sft", i + 1, last=i + 1 == cfg.sft.steps)
    if bar:
      bar.close()
    self.policy_params = self.sft_state.params
    self.sft_state = None  # frees the SFT optimizer's moments before the critic is built
    return metrics

  def experience(self, examples, *, for_value_pretraining: bool = False) -> tuple[dict, dict]:
    """Samples, scores and annotates one rollout batch: (device batch, metrics).

    `examples` is the step's global list of prompts, the same on every host; each host
    tokenizes and scores only the rows its devices hold (`host_data`), so 2 processes × 2
    devices compute exactly what 1 process × 4 devices does.
    """
    cfg = self.cfg
    n = cfg.responses_per_prompt
    t0 = time.perf_counter()
    rollout = host_data.sample(self.rollout_sampler, self.policy_params,
                               lambda i: self.text.prompt_ids(examples[i].problem),
                               len(examples), self._next_key(),
                               prompts_per_call=cfg.sampling.prompts_per_call)
    tokens, mask = rollout_lib.rollout_tokens(rollout)
    p = rollout.prompt_len
    jax.block_until_ready(rollout.lengths_B)
    # Free the KV cache for the train steps' activations (at 32B × 20k it is tens of GB per
    # chip); allocating it again next step costs nothing next to sampling.
    self.rollout_sampler.clear_cache()
    t1 = time.perf_counter()
    # Device work first (asynchronous), then the host scores the responses meanwhile.
    old_logp, entropy = self._logp_fn(self.policy_params, tokens, mask, prompt_len=p,
                                      temperature=cfg.sampling.temperature)
    values = (self._values_fn(self.critic_state.params, tokens, mask, prompt_len=p)
              if self.critic_state is not None else None)
    scored = host_data.score(self.scorer, rollout, self.text.decode,
                             [ex.problem for ex in examples], [ex.answer for ex in examples],
                             n)
    t2 = time.perf_counter()
    scores_B = scored.scores_B
    fn = self._mc_fn if for_value_pretraining else self._adv_fn
    adv = fn(scores_B, rollout.lengths_B, rollout.response_mask_BxR, values)
    batch = {"tokens_BxL": tokens, "mask_BxL": mask, "old_logp_BxR": old_logp,
             "advantages_BxR": adv.pop("advantages_BxR"),
             "returns_BxR": adv.pop("returns_BxR"),
             "old_values_BxR": values if values is not None else jnp.zeros_like(old_logp),
             "response_mask_BxR": rollout.response_mask_BxR, "scores_B": scores_B}
    adv.pop("lam_policy_B")
    resp_mask = rollout.response_mask_BxR
    lengths, truncated = dist.to_host((rollout.lengths_B, rollout.truncated_B))
    ent = jnp.sum(entropy * resp_mask) / jnp.maximum(jnp.sum(resp_mask), 1)
    metrics = {**scored.all_scores.metrics(),
               **{k: float(v) for k, v in dist.to_host({**adv, "entropy": ent}).items()}}
    metrics.update({
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": float(truncated.mean()),
        "time/rollout_s": t1 - t0,
        "time/reward_and_forward_s": t2 - t1,
        "rollout_tokens_per_s": float(lengths.sum()) / max(t1 - t0, 1e-9),
    })
    return batch, metrics

  def _updates(self, batch: dict, *, policy: bool, critic: bool, stage: int, step: int) -> dict:
    """ppo_epochs passes of num_minibatches (policy, critic) updates over one batch.

    Updates with a non-finite loss or gradient were skipped inside the step; they are
    counted here, in order (`RunControl.count_skipped` stops the run after too many).
    """
    cfg = self.cfg
    rows = batch["scores_B"].shape[0]
    records = []
    t0 = time.perf_counter()
    for epoch in range(cfg.rl.ppo_epochs):
      perm = np.random.default_rng([cfg.seed, stage, step, epoch]).permutation(rows)
      for k in range(cfg.rl.num_minibatches):
        idx = jnp.asarray(perm[k * self.minibatch_rows:(k + 1) * self.minibatch_rows])
        mb = self._take(batch, idx)
        m = {}
        if policy:
          self.policy_state, pm = self._policy_step(self.policy_state, mb)
          m.update(pm)
        if critic:
          self.critic_state, cm = self._critic_step(self.critic_state, mb)
          m.update(cm)
        records.append(m)
    records = jax.device_get(records)
    dt = time.perf_counter() - t0
    skipped = [max(float(r.pop("policy_skipped", 0)), float(r.pop("critic_skipped", 0))) > 0
               for r in records]
    out = _mean_metrics(records)
    out.update(self.ctl.count_skipped(skipped, f"{('value_pretrain', 'rl')[stage]} step "
                                               f"{step + 1}"))
    tokens = float(jax.device_get(jnp.sum(batch["mask_BxL"]))) * cfg.rl.ppo_epochs
    out["train_tokens_per_s"] = tokens / max(dt, 1e-9)
    o = cfg.optim
    if policy:
      out["lr/policy"] = _lr(o.policy_lr, o.warmup_steps, self.policy_state.step)
    if critic:
      out["lr/critic"] = _lr(o.critic_lr, o.warmup_steps, self.critic_state.step)
    return out

  def value_pretrain(self) -> dict[str, float]:
    """Trains the critic on Monte Carlo returns of the frozen policy until the rule holds."""
    vp = self.cfg.value_pretrain
    self._ensure_critic()
    start = self.ctl.enter("value_pretrain")
    bar = self._bar(vp.max_steps, "value pretraining")
    metrics = {}
    for i in range(start, vp.max_steps):
      batch, em = self.experience(next(self.prompts), for_value_pretraining=True)
      um = self._updates(batch, policy=False, critic=True, stage=0, step=i)
      metrics = {**em, **um}
      self.log.write("value_pretrain", i + 1, metrics)
      if bar:
        bar.update(1)
        bar.set_postfix(vloss=f"{um['value_loss']:.4f}",
                        ev=f"{em['value/explained_variance']:.3f}")
      done_loss = vp.stop_value_loss > 0 and um["value_loss"] < vp.stop_value_loss
      done_ev = em["value/explained_variance"] >= vp.stop_explained_variance
      stop = i + 1 >= vp.min_steps and (done_loss or done_ev)
      self._step_end("value_pretrain", i + 1, last=stop or i + 1 == vp.max_steps)
      if stop:
        break
    if bar:
      bar.close()
    return metrics

  def evaluate(self, examples=None) -> dict[str, float]:
    cfg = self.cfg
    examples = (examples or self.eval_examples)[:cfg.eval.num_examples]
    return evaluation.evaluate(self.eval_sampler, self.greedy_sampler, self.policy_params,
                               examples, self.text, self.scorer, jax.random.key(cfg.seed + 7),
                               batch_prompts=cfg.eval.batch_prompts,
                               threshold=cfg.rl.nll_threshold)

  def rl(self) -> dict[str, Any]:
    """VAPO RL (or the preset's variant) for rl.steps steps (continuing a resumed run)."""
    cfg, rl = self.cfg, self.cfg.rl
    if rl.use_critic:
      self._ensure_critic()
    self._rl_setup()
    start = self.ctl.enter("rl")
    bar = self._bar(rl.steps, "rl")
    if bar:
      bar.update(start)
    history = []
    for i in range(start, rl.steps):
      t0 = time.perf_counter()
      batch, em = self.experience(next(self.prompts))
      t1 = time.perf_counter()
      um = self._updates(batch, policy=True, critic=rl.use_critic, stage=1, step=i)
      self.policy_params = self.policy_state.params
      t2 = time.perf_counter()
      metrics = {**em, **um, "time/update_s": t2 - t1, "time/step_s": t2 - t0}
      score = None
      if cfg.eval.every and (i + 1) % cfg.eval.every == 0 and i + 1 < rl.steps:
        ev = self.evaluate()
        metrics.update({f"eval/{k}": v for k, v in ev.items()})
        metrics["time/eval_s"] = time.perf_counter() - t2
        self.log.write("eval", i + 1, ev)
        score = ev[f"avg@{cfg.eval.samples_per_problem}"]
      history.append(metrics)
      if (i + 1) % cfg.log_every == 0 or i + 1 == rl.steps:
        self.log.write("rl", i + 1, metrics)
      if bar:
        bar.update(1)
        post = {"reward": f"{metrics['reward/mean']:.3f}",
                "acc": f"{metrics['reward/accuracy']:.3f}",
                "len": f"{metrics['response/length_mean']:.1f}",
                "ent": f"{metrics['entropy']:.3f}"}
        if rl.use_critic:
          post.update(vloss=f"{metrics['value_loss']:.4f}",
                      ev=f"{metrics['value/explained_variance']:.2f}")
        bar.set_postfix(post)
      self._step_end("rl", i + 1, last=i + 1 == rl.steps, score=score)
    if bar:
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
    self.summary = {"data": self.data_stats}
    if cfg.checkpoint.resume:
      self.resume()
    elif self.ckpt and self.ckpt.steps():
      raise ValueError(f"{self.ckpt.directory} holds checkpoints {self.ckpt.steps()} and "
                       "config.checkpoint.resume is False: use a fresh --workdir (a new run "
                       "would not be able to save over them)")
    summary = self.summary
    if cfg.faults.handle_sigterm:
      self.ctl.install_sigterm()
    try:
      if self.ctl.stage == "sft":
        summary["sft"] = self.sft()
        self._finish_stage("sft")
      if self.ctl.stage == "value_pretrain":
        summary["value_pretrain"] = self.value_pretrain()
        self._save_critic()
        self._finish_stage("value_pretrain")
      if self.ctl.stage == "rl":
        if self.ctl.step == 0:
          summary["eval_before_rl"] = self.evaluate()
          self.log.write("eval", 0, summary["eval_before_rl"])
        score = None
        if cfg.rl.steps:
          history = self.rl()["history"]
          if history:
            summary["rl_last"] = history[-1]
          summary["eval_after_rl"] = self.evaluate()
          self.log.write("eval", cfg.rl.steps, summary["eval_after_rl"])
          score = summary["eval_after_rl"][f"avg@{cfg.eval.samples_per_problem}"]
        self._finish_stage("rl", score=score)
    except run_control.Preempted as e:
      summary["preempted"] = str(e)
    finally:
      self.ctl.uninstall_sigterm()
      if self.ckpt:
        self.ckpt.wait()
      self.log.flush()
    if "preempted" not in summary:
      self._plot()
    summary["wall_s"] = time.perf_counter() - t0
    return summary

  def close(self):
    self.scorer.close()
    self.log.close()
    if self.ckpt:
      self.ckpt.close()

  # -------------------------------------------------------------------- checkpoints
  def _step_end(self, stage: str, done: int, *, last: bool, score: float | None = None):
    """Step boundary: periodic / best / preemption saves; raises Preempted on SIGTERM."""
    self.ctl.advance(stage, done)
    stop = self.ctl.stop_requested()
    if stop or (not last and self.ctl.periodic_save_due()) or (
        score is not None and self.cfg.checkpoint.keep_best):
      self.save(score=score)
    if stop:
      if self.ckpt:
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
    run_checkpoint.save(self, score=score)

  def resume(self, step: int | None = None) -> int | None:
    """Restores checkpoint `step` (None: the newest good one); returns its step or None."""
    return run_checkpoint.restore(self, step)

  def _save_critic(self):
    """The value-pretrained critic as an HF directory other runs load via model.critic_path."""
    if not (self.workdir and self.cfg.checkpoint.save_critic and self.critic_state):
      return
    from flax import nnx  # pylint: disable=import-outside-toplevel
    critic = nnx.merge(self.critic_graphdef, self.critic_state.params)
    critic_lib.save_pretrained(critic, os.path.join(self.workdir, CRITIC_DIR))

  def _plot(self):
    if not (self.workdir and self.cfg.metrics.plot and self.log.path):
      return
    try:
      from vapo_jax.run import plotting  # pylint: disable=import-outside-toplevel
      plotting.plot_runs([self.workdir], os.path.join(self.workdir, CURVES_PNG))
    except ImportError as e:
      warnings.warn(f"no {CURVES_PNG}: {e}")

