"""The critic's room: value pretraining, its stop rule, its targets and its diagnostics.

    value_pretrain(trainer)   the stage: Monte Carlo returns (λ = 1) of the frozen policy's
                              samples, until a `run.stopping` rule holds
    targets(trainer, batch)   a batch as the critic step takes it (return statistics)
    diagnostics(trainer, b)   critic/* of a batch the critic scored before training on it
    heldout_readout(trainer)  the same on fresh rollouts of held-out prompts (at evaluations)

Everything of the critic's that a resumed run needs is one typed record, `CriticState`, kept in
the checkpoint's meta under "critic" (not in the run's summary):

  return_stats   rl.value_norm="running": `critic.ReturnStats` of the targets, so a resumed
                 run un-standardises with the same (μ, σ)
  draws          the batches value pretraining replays (value_pretrain.replay_batches): each
                 one's prompt iterator state and rollout key, so a resumed stage draws them
                 again (the policy is frozen, so they are the same batches)
  heldout        the held-out EV's sums of the last value_pretrain.heldout_batches batches

In critic units a batch's returns are (R − μ')/σ' by the statistics updated with it, its old
values (V − μ)/σ by the ones V was read with (the critic's own outputs), so value clipping
stays centred on them. Value pretraining trains on the last replay_batches batches joined,
value_pretrain.epochs passes in mini-batches of the run's size (`pretrain_loop`); with the
defaults (1 batch, epochs 0) exactly the run's own PPO loop over the step's batch.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import critic as critic_lib
from vapo_jax import distributed
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import update
from vapo_jax.run import compiles
from vapo_jax.run import critic_diagnostics as diag
from vapo_jax.run import learners
from vapo_jax.run import stopping

CRITIC_DIR = "critic"  # workdir/critic: HF-format critic after value pretraining


@dataclasses.dataclass(frozen=True)
class Draw:
  """What draws a value-pretraining batch again: its prompt iterator's state and key."""
  iterator: dict
  key: tuple[int, ...]


@dataclasses.dataclass
class CriticState:
  """The critic's resumable state (checkpoint meta "critic"; see the module docstring)."""
  return_stats: critic_lib.ReturnStats = critic_lib.ReturnStats()
  draws: list[Draw] = dataclasses.field(default_factory=list)
  heldout: list[np.ndarray] = dataclasses.field(default_factory=list)

  def to_meta(self) -> dict:
    return {"return_stats": [float(x) for x in self.return_stats],
            "draws": [{"iterator": d.iterator, "key": list(d.key)} for d in self.draws],
            "heldout": [[float(v) for v in x] for x in self.heldout]}

  @classmethod
  def from_meta(cls, meta: dict | None) -> CriticState:
    """The record a checkpoint saved (None: a fresh one)."""
    if not meta:
      return cls()
    return cls(return_stats=critic_lib.ReturnStats(*meta.get("return_stats", ())),
               draws=[Draw(d["iterator"], tuple(int(k) for k in d["key"]))
                      for d in meta.get("draws", [])],
               heldout=[np.asarray(x, np.float64) for x in meta.get("heldout", [])])


# ------------------------------------------------------------------------ the targets
def in_critic_units(batch: batch_lib.RolloutBatch, before: critic_lib.ReturnStats,
                    after: critic_lib.ReturnStats) -> batch_lib.RolloutBatch:
  """returns_BxR standardised by `after`, old_values_BxR (V, read with `before`) by
  `before`: the critic's own outputs v, so value clipping stays centred on them."""
  m = batch.response_mask_BxR
  return dataclasses.replace(
      batch, returns_BxR=critic_lib.standardise(batch.returns_BxR, m, after),
      old_values_BxR=critic_lib.standardise(batch.old_values_BxR, m, before))


def joined(batches: list[batch_lib.RolloutBatch]) -> batch_lib.RolloutBatch:
  """The batches' rows one after another (one batch: itself)."""
  if len(batches) == 1:
    return batches[0]
  return jax.tree.map(lambda *x: jnp.concatenate(x, axis=0), *batches)


def targets(t, batch: batch_lib.RolloutBatch,
            replayed: list[batch_lib.RolloutBatch] = ()) -> batch_lib.RolloutBatch:
  """A fresh batch (after `replayed` older ones, joined) as the critic step takes it: with
  rl.value_norm="running" the statistics are updated with the fresh batch's returns and
  every return standardised by them; else as they are."""
  if t.cfg.rl.value_norm == "none":
    return joined([*replayed, batch])
  cs = t.state.critic
  before = cs.return_stats
  cs.return_stats = after = critic_lib.update_stats(
      before, batch.returns_BxR, batch.response_mask_BxR, t.cfg.rl.value_norm_decay)
  return joined([in_critic_units(b, after, after) for b in replayed]
                + [in_critic_units(batch, before, after)])


def bound_values(values_fn, critic_params, stats, tokens_BxL, mask_BxL, prompt_len: int):
  """The critic's V(s_t) [B, R] of a rollout, its parameters bound (`Experience`'s values);
  with return statistics (rl.value_norm), un-standardised: V = σ·v + μ."""
  values = values_fn(critic_params, tokens_BxL, mask_BxL, prompt_len=prompt_len)
  if stats is None:
    return values
  return critic_lib.unstandardise(values, mask_BxL[:, prompt_len:], stats)


def pretrain_loop(cfg, num_batches: int) -> update.PPOLoop:
  """Value pretraining's loop over `num_batches` joined batches: value_pretrain.epochs
  (0: rl.ppo_epochs) passes of rl.num_minibatches mini-batches per batch, each of the run's
  mini-batch rows (the compiled step's shape)."""
  loop = learners.ppo_loop(cfg)
  return dataclasses.replace(loop, epochs=cfg.value_pretrain.epochs or loop.epochs,
                             num_minibatches=loop.num_minibatches * num_batches)


def last(items: list, k: int) -> list:
  """The last k items (none for k = 0)."""
  return items[len(items) - k:] if k > 0 else []


# ----------------------------------------------------------------------- diagnostics
def host_values(batch):
  """(values, returns, response mask) of a batch on the host: the critic's V before it
  trained on the batch (old_values_BxR, in units of the returns) and its targets."""
  return distributed.to_host((batch.old_values_BxR, batch.returns_BxR,
                              batch.response_mask_BxR))


def diagnostics(t, batch: batch_lib.RolloutBatch) -> dict[str, float]:
  """critic/* of a batch the critic scored before training on it (`run.critic_diagnostics`,
  over the whole batch), with metrics.critic_diagnostics; else none."""
  if not t.cfg.metrics.critic_diagnostics:
    return {}
  values, returns, mask = host_values(batch)
  return diag.metrics(values, returns, mask, distributed.to_host(batch.scores_B),
                      t.cfg.rl.group_size,
                      correct_B=distributed.to_host(batch.scores_B)
                      >= t.cfg.eval.correct_threshold)


def heldout_readout(t, rl_step: int) -> dict[str, float]:
  """critic_heldout/* on fresh rollouts of held-out prompts (metrics.critic_heldout_batches
  batches of the run's shape, the first such prompts of the held-out split, keys from
  (seed, rl_step): the run's own key is not touched); with a bootstrap interval over groups
  for the within-group EV. Values are read, the critic is not trained."""
  k = t.cfg.metrics.critic_heldout_batches
  if not k or "critic" not in t.state.learners:
    return {}
  per = t.cfg.rl.rollout_prompts
  pool = t.parts.eval_examples  # (cycled when it holds fewer than the batches need)
  if not pool:
    return {}
  key = jax.random.fold_in(jax.random.key(t.cfg.seed + 11), rl_step)
  parts = []
  for j in range(k):
    chunk = [pool[(j * per + i) % len(pool)] for i in range(per)]
    batch, _ = t.experience(chunk, for_value_pretraining=True, key=jax.random.fold_in(key, j))
    parts.append((*host_values(batch), distributed.to_host(batch.scores_B)))
  values, returns, mask, scores = (np.concatenate(x) for x in zip(*parts))
  out = diag.heldout_report(values, returns, mask, scores, t.cfg.rl.group_size,
                            correct=scores >= t.cfg.eval.correct_threshold)
  return {k.replace("critic/", "critic_heldout/"): v for k, v in out.items()}


# ---------------------------------------------------------------------------- the stage
def _draw_of(state) -> Draw:
  """What draws the run's next batch again (call before drawing): the prompt iterator's
  state and the key the next `state.next_key()` returns."""
  sub = jax.random.split(state.key)[1]
  return Draw(state.prompts.get_state(),
              tuple(int(x) for x in np.asarray(jax.random.key_data(sub)).ravel()))


def _redraw(t, d: Draw) -> batch_lib.RolloutBatch:
  """A recorded draw's batch again (the policy is frozen: the same batch)."""
  it = type(t.state.prompts)(t.parts.train_examples, t.cfg.rl.rollout_prompts, seed=t.cfg.seed)
  it.set_state(d.iterator)
  key = jax.random.wrap_key_data(jnp.asarray(d.key, jnp.uint32))
  return t.experience(next(it), for_value_pretraining=True, key=key)[0]


def value_pretrain(t) -> dict[str, float]:
  """Trains the critic on Monte Carlo returns of the frozen policy until a rule holds."""
  vp, cfg, s = t.cfg.value_pretrain, t.cfg, t.state
  t.setup("critic")
  start = t.ctl.enter("value_pretrain")
  bar = t._bar(vp.max_steps, "value pretraining", start)  # pylint: disable=protected-access
  cs = s.critic
  if not start:  # (a resumed stage goes on with what its checkpoint holds)
    cs.draws, cs.heldout = [], []
  replay = [_redraw(t, d) for d in cs.draws]
  metrics, losses, keep = {}, [], vp.replay_batches - 1
  for i in range(start, vp.max_steps):
    c0 = compiles.snapshot()
    draw = _draw_of(s) if keep else None
    batch, em = t.experience(next(s.prompts), for_value_pretraining=True, key=s.next_key())
    # Held-out: the critic scored this fresh batch before training on any of it.
    ev = em["value/explained_variance"]
    if vp.heldout_batches > 1 or cfg.metrics.critic_diagnostics:
      cs.heldout = (cs.heldout + [diag.ev_sums(*host_values(batch))])[-vp.heldout_batches:]
      ev = diag.pooled_ev(cs.heldout) if vp.heldout_batches > 1 else ev
      em["critic/heldout_ev"] = ev
      em.update(diagnostics(t, batch))
    # The policy is frozen: older batches' Monte Carlo returns are still exact targets.
    replay, cs.draws = last(replay, keep), last(cs.draws, keep)
    um = t.update(targets(t, batch, replay), stage="value_pretrain", step=i, policy=False,
                  loop=pretrain_loop(cfg, len(replay) + 1))
    replay.append(batch)
    cs.draws = last(cs.draws + [draw], keep)
    metrics = {**em, **um, **compiles.since(c0)}
    losses.append(um["value_loss"])
    why = stopping.stop_reason(
        losses, ev, step=i + 1, max_steps=vp.max_steps, min_steps=vp.min_steps,
        stop_value_loss=vp.stop_value_loss, stop_explained_variance=vp.stop_explained_variance,
        plateau_window=vp.plateau_window, plateau_smooth=vp.plateau_smooth,
        plateau_tol=vp.plateau_tol, group_ev=metrics.get("critic/group_ev"),
        stop_group_ev=vp.stop_group_ev)
    if why is not None:
      metrics["value_pretrain/stopped_by"] = why
      print(f"value pretraining ended after step {i + 1} by "
            + (f"its cap (max_steps={vp.max_steps}): no stopping rule held" if why == "cap"
               else f"the {why} rule"), flush=True)
    s.log.write("value_pretrain", i + 1, metrics)
    bar.update(1)
    bar.set_postfix(vloss=f"{um['value_loss']:.4f}", ev=f"{ev:.3f}")
    t._step_end("value_pretrain", i + 1, last=why is not None)  # pylint: disable=protected-access
    if why is not None:
      break
  bar.close()
  return metrics


def save(t, workdir: str | None) -> None:
  """The value-pretrained critic as an HF directory (workdir/critic) other runs load via
  model.critic_path; with value normalisation its head gives values in return units."""
  if not (workdir and t.cfg.checkpoint.save_critic and "critic" in t.state.learners):
    return
  model = t.critic_model()
  if t.cfg.rl.value_norm != "none":
    model = critic_lib.in_return_units(model, t.state.critic.return_stats)
  critic_lib.save_pretrained(model, os.path.join(workdir, CRITIC_DIR))
