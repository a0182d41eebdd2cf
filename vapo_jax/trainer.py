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
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import builders
from vapo_jax import distributed as dist
from vapo_jax import evaluation
from vapo_jax import host_data
from vapo_jax import rl_batch
from vapo_jax import rollout as rollout_lib
from vapo_jax import train_steps as ts
from vapo_jax.data import PromptIterator
from vapo_jax.rewards import RewardScorer


class MetricsLog:
  """Appends one JSON line per record to `workdir/metrics.jsonl` (process 0 only)."""

  def __init__(self, workdir: str | None):
    self.path = None
    if workdir and jax.process_index() == 0:
      os.makedirs(workdir, exist_ok=True)
      self.path = os.path.join(workdir, "metrics.jsonl")

  def write(self, stage: str, step: int, metrics: dict[str, float]) -> None:
    if self.path:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"stage": stage, "step": step, "time": time.time(), **metrics})
                + "\n")


def _mean_metrics(records: list[dict]) -> dict[str, float]:
  records = jax.device_get(records)
  keys = records[0].keys()
  return {k: float(np.mean([r[k] for r in records])) for k in keys}


class Trainer:
  """Holds the run's parts and runs its stages in order."""

  def __init__(self, cfg, workdir: str | None = None, *, progress: bool = True):
    self.cfg = cfg
    self.workdir = workdir
    self.progress = progress
    self.log = MetricsLog(workdir)
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
        ts.policy_logprobs, self.graphdef), self.forward_chunks),
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
          self.critic_state, self.mesh, self.batch_axes)
      self._values_fn = jax.jit(ts.in_micro_batches(functools.partial(
          ts.critic_values, self.critic_graphdef), self.forward_chunks),
                                static_argnames=("prompt_len",))

  # ------------------------------------------------------------------------- stages
  def sft(self) -> dict[str, float]:
    """Supervised warm start on the examples' worked solutions."""
    cfg = self.cfg
    o = cfg.optim
    tx = ts.make_optimizer(o.sft_lr, warmup_steps=min(o.warmup_steps, cfg.sft.steps // 10),
                           weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                           grad_clip=o.grad_clip)
    state = ts.init_state(self.policy_params, tx)
    step = ts.compile_step(functools.partial(ts.sft_step, self.graphdef, tx), state, self.mesh,
                           self.batch_axes)
    it = PromptIterator(self.train_examples, cfg.sft.batch_size, seed=cfg.seed + 1,
                        process_index=jax.process_index(), process_count=jax.process_count())
    bar = self._bar(cfg.sft.steps, "sft")
    metrics = {}
    for i in range(cfg.sft.steps):
      batch = builders.sft_batch(next(it), self.text, cfg.data.max_prompt_tokens,
                                 cfg.sampling.max_new_tokens)
      state, m = step(state, ts.shard_batch(batch, self.mesh, self.batch_axes))
      if (i + 1) % cfg.log_every == 0 or i + 1 == cfg.sft.steps:
        metrics = {k: float(v) for k, v in jax.device_get(m).items()}
        self.log.write("sft", i + 1, metrics)
        if bar:
          bar.set_postfix(loss=f"{metrics['sft_loss']:.3f}")
      if bar:
        bar.update(1)
    if bar:
      bar.close()
    self.policy_params = state.params
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
    """ppo_epochs passes of num_minibatches (policy, critic) updates over one batch."""
    cfg = self.cfg
    rows = batch["scores_B"].shape[0]
    records = []
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
    return _mean_metrics(records)

  def value_pretrain(self) -> dict[str, float]:
    """Trains the critic on Monte Carlo returns of the frozen policy until the rule holds."""
    vp = self.cfg.value_pretrain
    self._ensure_critic()
    bar = self._bar(vp.max_steps, "value pretraining")
    metrics = {}
    for i in range(vp.max_steps):
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
      if i + 1 >= vp.min_steps and (done_loss or done_ev):
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
    """VAPO RL (or the preset's variant) for rl.steps steps."""
    cfg, o, rl = self.cfg, self.cfg.optim, self.cfg.rl
    if rl.use_critic:
      self._ensure_critic()
    tx = ts.make_optimizer(o.policy_lr, warmup_steps=o.warmup_steps,
                           weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                           grad_clip=o.grad_clip)
    self.policy_state = ts.init_state(self.policy_params, tx)
    hp = ts.policy_hparams(cfg, self.micro_batches)
    self._policy_step = ts.compile_step(functools.partial(ts.policy_step, self.graphdef, tx, hp),
                                        self.policy_state, self.mesh, self.batch_axes)
    bar = self._bar(rl.steps, "rl")
    history = []
    for i in range(rl.steps):
      t0 = time.perf_counter()
      batch, em = self.experience(next(self.prompts))
      t1 = time.perf_counter()
      um = self._updates(batch, policy=True, critic=rl.use_critic, stage=1, step=i)
      self.policy_params = self.policy_state.params
      t2 = time.perf_counter()
      metrics = {**em, **um, "time/update_s": t2 - t1, "time/step_s": t2 - t0}
      if cfg.eval.every and (i + 1) % cfg.eval.every == 0 and i + 1 < rl.steps:
        metrics.update({f"eval/{k}": v for k, v in self.evaluate().items()})
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
    if bar:
      bar.close()
    return {"history": history}

  def run(self) -> dict[str, Any]:
    """All stages in order; returns the evaluation before and after RL."""
    cfg = self.cfg
    summary: dict[str, Any] = {"data": self.data_stats}
    t0 = time.perf_counter()
    if cfg.sft.enabled:
      summary["sft"] = self.sft()
    if cfg.value_pretrain.enabled and cfg.rl.use_critic:
      summary["value_pretrain"] = self.value_pretrain()
    summary["eval_before_rl"] = self.evaluate()
    self.log.write("eval", 0, summary["eval_before_rl"])
    if cfg.rl.steps:
      summary["rl_last"] = self.rl()["history"][-1]
      summary["eval_after_rl"] = self.evaluate()
      self.log.write("eval", cfg.rl.steps, summary["eval_after_rl"])
    summary["wall_s"] = time.perf_counter() - t0
    return summary

  def close(self):
    self.scorer.close()
