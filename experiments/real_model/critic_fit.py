"""Which critic lever makes the real model's critic learn? (issue 63 item 5 on reasoning-gym;
issue 53 item 2 and issue 42 on the word problems before)

  python -m experiments.real_model.critic_fit --config=configs/smollm2_rg.py \\
      --workdir=<a run after its SFT> --train_batches=10 --fresh_batches=8 --fixed_steps=0 \\
      --out=experiments/real_model/results/rg-critic-levers-<date>/critic_levers.json

  python -m experiments.real_model.critic_fit --config=configs/smollm2_135m.py \\
      --train_batches=8 --fresh_batches=4 --fixed_steps=8 \\
      --out=experiments/real_model/results/critic-levers-2026-12-05/critic_levers.json

One command, every lever of the config's set (`default_set`: `RG_LEVERS` for a reasoning-gym
config, else the word problems' `levers`; or --levers=a,b from either), on the same rollouts.
With --workdir=<run> the policy is that run's checkpoint (--step, default its newest: the SFT'd
policy once its SFT stage has ended), restored read-only as `ceiling.py` does, and each lever's
critic is built from it as value pretraining builds it (model.critic_start); without it, the
config's initial policy. The policy is frozen, so its rollouts are drawn once and every
lever's critic sees the same ones:
  - train batches: the run's own next value-pretraining prompts (the run's prompt iterator
    and key; after a restore, where the checkpoint left them), `--train_batches` of them;
  - fresh batches: prompts of the held-out split (`parts.eval_examples`: data.eval_path, the
    synthetic test split, or reasoning-gym's held-out split, disjoint from the training
    questions) with keys from a stream the run never draws from
    (fold_in(key(seed), FRESH_STREAM + k)): rollouts no critic was trained on.
For each lever (its config overrides on top of --config), a fresh critic is built and:
  fixed   (with --fixed_steps > 0) trained `--fixed_steps` value-pretraining steps on train
          batch 0 alone (each step the lever's epochs over it); value loss on that batch / the
          best constant's (½·Var_tok of the targets in the critic's units) after each step,
          then the figures on the fresh batches;
  fresh   a fresh critic trained on the train batches in order, as value pretraining does
          (with the lever's replay and epochs): on each batch before it trains on it the
          pooled and the within-group EV (progressive held-out figures), then on the fresh
          batches (with --fresh_every_step also after each training batch) `figures`.
`figures` pool ALL fresh batches' tokens (never an average over batches): the issue's bar,
within-group EV over all tokens with its 95% bootstrap interval over groups (critic/group_ev,
_lo, _hi), within-group EV at each response's last token (critic/group_ev_last), last-token
AUROC (critic/auroc_last), pooled EV (fresh_ev = critic/pooled_ev), bias (critic/bias), and
the rest of `run.critic_diagnostics.heldout_report` (Spearman of V(s_0) against the prompts'
pass rates, EV by half and by position, Brier score).
R_t is the Monte Carlo return (λ = 1, γ = 1) of the lever's rewards (rl.reward_scale/shift).
The figures go to --out as JSON (one entry per lever, written as each lever ends: a rerun
skips the levers already there) and a markdown table beside it (--out with .md), with the
rule's pick once every lever of a set is measured: `choose_rg` for `RG_LEVERS`, `choose` for
the word problems' levers. Issue 63's rule (`choose_rg`): the lever with the highest lower
bound of fresh held-out within-group EV wins; ties (within 0.01) go to the one that changes
fewer settings.
"""

import json
import math
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from vapo_jax import config as config_lib
from vapo_jax import distributed
from vapo_jax.rl import batch as batch_lib
from vapo_jax.run import checkpoint as run_checkpoint
from vapo_jax.run import critic_diagnostics as diag
from vapo_jax.run import critic_stage
from vapo_jax.run import trainer as trainer_lib

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined only when it runs (importing `choose` defines none)."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file.")
  flags.DEFINE_string("levers", "", "comma-separated lever names (default: the config's set, "
                      "`default_set`)")
  flags.DEFINE_string("workdir", "", "a run's folder: start from its checkpoint (read-only)")
  flags.DEFINE_string("step", "latest", "with --workdir: the checkpoint (latest, best or a "
                      "number)")
  flags.DEFINE_integer("train_batches", 4, "value-pretraining batches to train on")
  flags.DEFINE_integer("fresh_batches", 2, "held-out batches of fresh rollouts")
  flags.DEFINE_integer("fixed_steps", 8, "steps on the one fixed batch (0: no fixed protocol)")
  flags.DEFINE_bool("fresh_every_step", False, "the fresh batches' figures also after each "
                    "training batch of the fresh protocol (a value pass over them each step)")
  flags.DEFINE_integer("bootstrap", 1000, "group resamples of the within-group EV's interval")
  flags.DEFINE_string("out", "", "JSON file for the figures (optional)")

FRESH_STREAM = 1_000_003  # fold_in index of the fresh batches' keys (the run splits, never folds)


def levers(cfg) -> dict[str, dict]:
  """The word problems' levers (configs/smollm2_135m.py, issue 53): lever name -> config
  overrides (dotted field -> value), relative to `cfg`."""
  head_lr = cfg.optim.critic_lr / 20
  reuse = {"value_pretrain.replay_batches": 4, "value_pretrain.epochs": 4}
  return {
      "baseline": {},
      "head_bias_lr": {"model.critic_head_bias": True, "optim.critic_head_lr": head_lr},
      "rewards_pm1": {"rl.reward_scale": 2.0, "rl.reward_shift": -1.0},
      "value_norm": {"rl.value_norm": "running"},
      "reuse": reuse,
      "full_finetune": {"model.critic_lora": False, "optim.critic_lr": 1e-5},
      "all": {"model.critic_head_bias": True, "optim.critic_head_lr": head_lr,
              "rl.value_norm": "running", **reuse},
  }


# The reasoning-gym levers: overrides of configs/smollm2_rg.py (`rg_levers` says why each).
RG_LEVERS = {
    "rg_baseline": {},
    "rg_lr1e-4": {"optim.critic_lr": 1e-4},
    "rg_lr3e-4": {"optim.critic_lr": 3e-4},
    "rg_lora": {"model.critic_lora": True, "optim.critic_lr": 1e-3},
    "rg_no_head_bias": {"model.critic_head_bias": False, "optim.critic_head_lr": -1.0},
    # Last: 3.6 times the others' training passes (`passes`).
    "rg_reuse4": {"value_pretrain.replay_batches": 4, "value_pretrain.epochs": 4},
}


def rg_levers(cfg) -> dict[str, dict]:  # pylint: disable=unused-argument
  """The reasoning-gym levers (issue 63 item 5): lever name -> overrides of
  configs/smollm2_rg.py (`RG_LEVERS`).

  That config fully fine-tunes the critic at 3e-5 beside a LoRA r = 16 policy at 1e-4, with a
  head bias and the head at 1e-3, each value-pretraining step replaying 2 batches for 2
  epochs. Its first run's critic (docs/real_model.md, 2026-12-07) learned which problem it
  reads (pooled EV 0.23, AUROC 0.79) but not which answer (within-group EV −0.07
  [−0.10, −0.04]); each lever is a way it might learn the latter:

    rg_baseline      the config as it is: the reference (no setting changed).
    rg_lr1e-4        critic lr 1e-4, the policy's (1×; 3.3× the baseline): at 3e-5 the
                     backbone barely moves while the head at 1e-3 fits the problem's pass
                     rate; a backbone that moves can learn features of the answer.
    rg_lr3e-4        critic lr 3e-4, 3× the policy's and 10× the baseline's: the field's
                     critic/actor ratio (verl, ROLL, Tunix 10×, OpenRLHF 18×) on the full
                     critic; high for a full fine-tune, so it may diverge (the fresh figures
                     show it).
    rg_lora          the critic trains LoRA adapters (rank model.lora.rank, 16; from the SFT'd
                     policy's) at lr 1e-3: the 10× rule of verl and Tunix on the policy's LoRA
                     lr 1e-4; the frozen base keeps the features the SFT'd policy wrote its
                     answers with.
    rg_no_head_bias  no head bias and no head lr of its own (the head at optim.critic_lr): the
                     head at 1e-3 fits each batch's pass rate and each problem's difficulty at
                     once, the prompt-level knowledge the diagnostics show; without it the
                     backbone has to carry what V knows.
    rg_reuse4        4 batches replayed × 4 epochs (not 2 × 2): answers that differ within a
                     group are a small share of the reward's variance (between-problem share
                     0.64), so more passes over more groups of the frozen policy's exact
                     returns show the critic more contrasting pairs (overfitting the train
                     batches would show on the fresh ones).

  The selection rule (`choose_rg`): the lever with the highest lower bound of fresh held-out
  within-group EV wins; ties (within 0.01) go to the one that changes fewer settings.
  """
  return {k: dict(v) for k, v in RG_LEVERS.items()}


def lever_sets(cfg) -> dict[str, dict[str, dict]]:
  """Set name -> its levers: "rg" (`rg_levers`) and "word" (`levers`)."""
  return {"rg": rg_levers(cfg), "word": levers(cfg)}


def default_set(cfg) -> str:
  """The set a config's levers are measured from: "rg" for data.source="reasoning_gym"."""
  return "rg" if cfg.data.source == "reasoning_gym" else "word"


def all_levers(cfg) -> dict[str, dict]:
  """Every lever --levers can name (the sets' names do not overlap)."""
  out = {}
  for table_ in lever_sets(cfg).values():
    out.update(table_)
  return out


def constant_loss(returns_BxR, mask_BxR) -> float:
  """½·Var_tok(R): the value loss of the best constant predictor over the real tokens."""
  m = np.asarray(mask_BxR, np.float64)
  r = np.asarray(returns_BxR, np.float64)
  mean = (r * m).sum() / m.sum()
  return float(0.5 * (((r - mean) ** 2) * m).sum() / m.sum())


def with_overrides(config, overrides: dict):
  c = config.copy_and_resolve_references()
  for dotted, value in overrides.items():
    *path, name = dotted.split(".")
    node = c
    for p in path:
      node = node[p]
    node[name] = value
  return config_lib.from_config_dict(c)


# ----------------------------------------------------------------------- the rollouts
def start(cfg, workdir: str = "", step: str = "latest") -> tuple[trainer_lib.Trainer, dict]:
  """(the trainer that draws the rollouts, where its policy came from). With a workdir: that
  run's checkpoint `step` restored read-only (nothing in the run's folder is written), its
  prompt iterator and key where the run left them; refused while its SFT stage is unfinished
  (its policy is not the SFT'd one yet). Without: the config's initial policy."""
  t = trainer_lib.Trainer(cfg, workdir or None, progress=False, read_only=bool(workdir))
  if not workdir:
    return t, {}
  try:
    got = t.resume(run_checkpoint.select_step(t.ckpt, step))
    if got is None:
      raise app.UsageError(f"{workdir}: no checkpoint to restore")
    stage, at = t.ctl.stage, t.ctl.step
    if stage == "sft" and cfg.sft.enabled:
      raise app.UsageError(f"{workdir}: checkpoint {got} is inside the SFT stage (step {at}); "
                           "its policy is not the SFT'd one yet")
    if stage == "rl" and at > 0:
      print(f"note: checkpoint {got} is at RL step {at}: its policy has been trained by RL",
            flush=True)
  except BaseException:
    t.close()
    raise
  return t, {"workdir": workdir, "checkpoint_step": got, "checkpoint_stage": stage,
             "checkpoint_stage_step": at}


def draw(t, train_batches: int, fresh_batches: int) -> tuple[list, list]:
  """(train, fresh) raw rollouts of the trainer's frozen policy: batches of tokens, masks and
  scores."""
  s, p = t.state, t.parts
  train = [p.experience.sample_and_score(s.policy_params, next(s.prompts), s.next_key())[0]
           for _ in range(train_batches)]
  return train, fresh_rollouts(t, fresh_batches)


def fresh_rollouts(t, batches: int) -> list:
  """`batches` raw rollouts of the trainer's current policy on held-out prompts, with keys
  from a stream no run draws from: batch k takes the held-out split's prompts
  [k n, (k + 1) n) (n = prompts per step, wrapping) and key fold_in(key(seed),
  FRESH_STREAM + k), the same for every policy. The held-out split is `parts.eval_examples`
  (a reasoning-gym config's interleaves its arms: every batch mixes them)."""
  s, p = t.state, t.parts
  held, n = p.eval_examples, t.cfg.rl.rollout_prompts
  if len(held) < n:
    raise ValueError(f"{len(held)} held-out problems; a fresh batch needs {n}")
  fresh = []
  for k in range(batches):
    start_ = (k * n) % (len(held) - n + 1)
    key = jax.random.fold_in(jax.random.key(t.cfg.seed), FRESH_STREAM + k)
    fresh.append(p.experience.sample_and_score(s.policy_params, held[start_:start_ + n],
                                               key)[0])
  return fresh


# ------------------------------------------------------------------------ the critic
def lever_trainer(cfg, policy=None) -> trainer_lib.Trainer:
  """A trainer of the lever's config with a fresh critic, built from `policy` (a restored
  run's policy parameters; None: the config's own) as value pretraining builds it."""
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    if policy is not None:
      t.state.policy_params = policy
    t.setup("critic")
  except BaseException:
    t.close()
    raise
  return t


def annotate(t, raw) -> batch_lib.RolloutBatch:
  """A raw rollout as value pretraining's batch: the critic's values V(s_t) now (before it
  trains on it), the lever's Monte Carlo returns."""
  critic = t.state.learners["critic"]
  tokens, mask, resp = raw.tokens_BxL, raw.mask_BxL, raw.response_mask_BxR
  p = tokens.shape[1] - resp.shape[1]
  stats = t.return_stats() if t.cfg.rl.value_norm != "none" else None
  values = critic_stage.bound_values(t.critic_values, critic.state.params, stats, tokens,
                                     mask, p)
  lengths = jnp.sum(resp, axis=1).astype(jnp.int32)
  groups = jnp.arange(resp.shape[0], dtype=jnp.int32) // t.cfg.rl.group_size
  adv = t.parts.experience.monte_carlo(raw.scores_B, lengths, resp, values, groups)
  return batch_lib.RolloutBatch(
      tokens_BxL=tokens, mask_BxL=mask, old_logp_BxR=jnp.zeros_like(values),
      advantages_BxR=adv.advantages_BxR, returns_BxR=adv.returns_BxR, old_values_BxR=values,
      response_mask_BxR=resp, scores_B=raw.scores_B)


def host(batch):
  return distributed.to_host((batch.old_values_BxR, batch.returns_BxR, batch.response_mask_BxR))


def fresh_values(t, fresh) -> tuple[np.ndarray, ...]:
  """(values, returns, mask, scores) of the critic on the fresh batches, on the host, the
  batches' rows one after another (each batch whole groups, so rows b answer prompt b // n)."""
  parts = []
  for raw in fresh:
    b = annotate(t, raw)
    parts.append((*host(b), distributed.to_host(b.scores_B)))
  return tuple(np.concatenate(x) for x in zip(*parts))


def figures(values, returns, mask, scores, group_size: int, threshold: float,
            n_boot: int = 1000) -> dict[str, float]:
  """The critic's figures over every token of every fresh batch given, pooled:
  `diag.heldout_report` (correct: score >= threshold; with group_size > 1 the within-group
  EV's 95% interval over n_boot group resamples) and fresh_ev, the pooled EV."""
  scores = np.asarray(scores, np.float64)
  out = diag.heldout_report(values, returns, mask, scores, group_size,
                            correct=scores >= threshold, n_boot=n_boot)
  return {"fresh_ev": diag.pooled_ev(diag.ev_sums(values, returns, mask)),
          **{k: float(v) for k, v in out.items()}}


def fresh_figures(t, fresh, n_boot: int = 1000) -> dict[str, float]:
  """`figures` of the trainer's critic on the fresh batches, pooled."""
  return figures(*fresh_values(t, fresh), t.cfg.rl.group_size, t.cfg.eval.correct_threshold,
                 n_boot)


BAR = ("fresh_ev", "critic/group_ev", "critic/group_ev_lo", "critic/group_ev_hi",
       "critic/group_ev_last", "critic/auroc_last", "critic/bias")  # per step (--fresh_every_step)


def step(t, batch, replay, i) -> dict:
  """One value-pretraining update as the trainer runs it (the lever's replay and epochs)."""
  return t.update(t.critic_targets(batch, replay), stage="value_pretrain", step=i,
                  policy=False, loop=critic_stage.pretrain_loop(t.cfg, len(replay) + 1))


def passes(cfg, train_batches: int, fixed_steps: int) -> dict[str, int]:
  """What a lever costs, in batches of the run's shape: critic_train, forward and backward
  passes over one batch (the fixed protocol's fixed_steps × epochs, the fresh protocol's
  Σ_i min(i + 1, replay_batches) × epochs); critic_value, value passes without the fresh
  batches' (one per train batch, one for the fixed protocol's batch 0)."""
  vp = cfg.value_pretrain
  epochs = vp.epochs or cfg.rl.ppo_epochs
  fresh = sum(min(i + 1, max(vp.replay_batches, 1)) for i in range(train_batches)) * epochs
  return {"critic_train": fixed_steps * epochs + fresh,
          "critic_value": train_batches + (1 if fixed_steps else 0)}


def run_lever(cfg, train, fresh, policy=None, *, fixed_steps: int = 0,
              fresh_every_step: bool = False, n_boot: int = 1000) -> dict:
  out = {}
  if fixed_steps:  # fixed: one batch, fixed_steps steps.
    t = lever_trainer(cfg, policy)
    try:
      ratios, batch = [], annotate(t, train[0])
      for i in range(fixed_steps):
        target = t.critic_targets(batch)
        base = constant_loss(*distributed.to_host((target.returns_BxR,
                                                   target.response_mask_BxR)))
        um = t.update(target, stage="value_pretrain", step=i, policy=False,
                      loop=critic_stage.pretrain_loop(t.cfg, 1))
        ratios.append(um["value_loss"] / base if base > 0 else float("nan"))
      out["fixed"] = {"loss_over_constant_by_step": ratios, **fresh_figures(t, fresh, n_boot)}
    finally:
      t.close()
  # fresh: the train batches in order, as value pretraining.
  t = lever_trainer(cfg, policy)
  try:
    vp, n = cfg.value_pretrain, cfg.rl.group_size
    replay, progressive, group_ev, by_step = [], [], [], []
    for i, raw in enumerate(train):
      batch = annotate(t, raw)
      v, r, m = host(batch)
      progressive.append(diag.pooled_ev(diag.ev_sums(v, r, m)))
      group_ev.append(diag.within_group_ev(v, r, m, n) if n > 1 else float("nan"))
      replay = replay[len(replay) - vp.replay_batches + 1:] if vp.replay_batches > 1 else []
      step(t, batch, replay, i)
      replay.append(batch)
      if fresh_every_step and i + 1 < len(train):
        f = fresh_figures(t, fresh, n_boot)
        by_step.append({k: f[k] for k in BAR if k in f})
    out["fresh"] = {"heldout_ev_by_step": progressive, "heldout_group_ev_by_step": group_ev,
                    **fresh_figures(t, fresh, n_boot)}
    if fresh_every_step:
      out["fresh"]["fresh_by_step"] = by_step + [{k: out["fresh"][k] for k in BAR
                                                  if k in out["fresh"]}]
  finally:
    t.close()
  return out


# ------------------------------------------------------------------------- the rules
NEAR = 0.02   # the registered rule's margin of held-out EV (docs/real_model.md)
RG_NEAR = 0.01  # `choose_rg`'s margin of the within-group EV's lower bound


def choose(results: dict) -> tuple[str, str]:
  """The lever the registered rule picks from `results` (name -> {"overrides", "fixed",
  "fresh"}), and why, in one line.

  Rule (docs/real_model.md, "The third run", fixed before its runs): the lever with the highest
  pooled held-out EV of its `fresh` protocol; among the levers within NEAR of that best, the one
  that changes the fewest settings (then the higher EV); "baseline" if no lever's fixed-batch
  loss ends below the best constant's (loss / constant < 1).
  """
  levers_ = {k: v for k, v in results.items() if not k.startswith("_")}
  if not levers_:
    raise ValueError("no lever measured")
  if not all(v.get("fixed") for v in levers_.values()):
    raise ValueError("the rule reads the fixed protocol: measure with --fixed_steps > 0")
  if not any(v["fixed"]["loss_over_constant_by_step"][-1] < 1.0 for v in levers_.values()):
    return "baseline", "no lever's fixed-batch loss fell below the best constant's"
  ev = {k: float(v["fresh"]["fresh_ev"]) for k, v in levers_.items()}
  best = max(ev, key=ev.get)
  near = [k for k in ev if ev[k] >= ev[best] - NEAR]
  pick = min(near, key=lambda k: (len(levers_[k]["overrides"]), -ev[k]))
  why = (f"highest held-out EV {best} ({ev[best]:+.4f}); within {NEAR} of it: "
         + ", ".join(f"{k} ({ev[k]:+.4f}, {len(levers_[k]['overrides'])} settings)"
                     for k in sorted(near, key=lambda k: -ev[k]))
         + f"; fewest settings: {pick}")
  return pick, why


def _lower_bound(r: dict) -> float:
  lo = r["fresh"].get("critic/group_ev_lo", math.nan)
  return -math.inf if lo is None or math.isnan(lo) else float(lo)


def choose_rg(results: dict) -> tuple[str, str]:
  """The lever `RG_LEVERS`' rule picks from `results` (name -> {"overrides", "fresh"}), and
  why, in one line.

  Rule (issue 63 item 5, fixed before the measurement): the lever with the highest lower bound
  of fresh held-out within-group EV (critic/group_ev_lo of its `fresh` protocol) wins; ties
  (within RG_NEAR = 0.01 of the best) go to the one that changes fewer settings (then the
  higher bound). The line also says whether the pick meets issue 63's bar (within-group EV's
  interval above 0, pooled EV >= 0.2, last-token AUROC >= 0.7).
  """
  levers_ = {k: v for k, v in results.items() if not k.startswith("_")}
  if not levers_:
    raise ValueError("no lever measured")
  lo = {k: _lower_bound(v) for k, v in levers_.items()}
  best = max(lo, key=lo.get)
  near = [k for k in lo if lo[k] >= lo[best] - RG_NEAR]
  pick = min(near, key=lambda k: (len(levers_[k]["overrides"]), -lo[k]))
  f = levers_[pick]["fresh"]
  met = {"within-group EV > 0": lo[pick] > 0,
         "pooled EV >= 0.2": f.get("fresh_ev", math.nan) >= 0.2,
         "AUROC >= 0.7": f.get("critic/auroc_last", math.nan) >= 0.7}
  why = (f"highest lower bound of held-out within-group EV {best} ({lo[best]:+.4f}); within "
         f"{RG_NEAR} of it: "
         + ", ".join(f"{k} ({lo[k]:+.4f}, {len(levers_[k]['overrides'])} settings)"
                     for k in sorted(near, key=lambda k: -lo[k]))
         + f"; fewest settings: {pick}; issue 63's bar "
         + ("met" if all(met.values()) else
            "not met (" + ", ".join(k for k, ok in met.items() if not ok) + " fails)"))
  return pick, why


RULES = {"rg": choose_rg, "word": choose}
RULE_NAMES = {"rg": "Issue 63's rule", "word": "The registered rule"}


# ------------------------------------------------------------------------- the table
def _f(x, fmt="+.3f") -> str:
  return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def table(results: dict) -> str:
  lines = ["| lever | fixed: loss/const (last) | fixed: fresh EV | progressive EV (last) | "
           "fresh EV | within-group EV [lo, hi] | within-group EV last token | AUROC last | "
           "bias | ρ(V(s0), pass rate) | EV 1st half | EV 2nd half |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    if name.startswith("_"):
      continue
    f, g = r.get("fixed"), r["fresh"]
    group = (f"{_f(g.get('critic/group_ev'))} [{_f(g.get('critic/group_ev_lo'))}, "
             f"{_f(g.get('critic/group_ev_hi'))}]")
    lines.append(
        f"| {name} | {_f(f['loss_over_constant_by_step'][-1], '.3f') if f else '–'} | "
        f"{_f(f['fresh_ev']) if f else '–'} | {_f(g['heldout_ev_by_step'][-1])} | "
        f"{_f(g['fresh_ev'])} | {group} | {_f(g.get('critic/group_ev_last'))} | "
        f"{_f(g.get('critic/auroc_last'), '.3f')} | {_f(g.get('critic/bias'))} | "
        f"{_f(g.get('critic/prompt_value_spearman'))} | "
        f"{_f(g.get('critic/ev_first_half'))} | {_f(g.get('critic/ev_second_half'))} |")
  return "\n".join(lines) + "\n"


def main(_):
  base = config_lib.from_command_line(FLAGS.config)
  sets, table_of = lever_sets(base), all_levers(base)
  names = FLAGS.levers.split(",") if FLAGS.levers else list(sets[default_set(base)])
  unknown = sorted(set(names) - set(table_of))
  if unknown:
    raise app.UsageError(f"unknown levers {unknown}; choose from {sorted(table_of)}")
  results = {}
  if FLAGS.out and os.path.exists(FLAGS.out):
    results = json.load(open(FLAGS.out, encoding="utf-8"))
  for name in names:
    if name in results:
      print(f"{name}: done before, skipped", flush=True)
  todo = [n for n in names if n not in results]
  for name in todo:
    cost = passes(with_overrides(FLAGS.config, table_of[name]), FLAGS.train_batches,
                  FLAGS.fixed_steps)
    print(f"{name}: {cost['critic_train']} critic training passes over a batch, "
          f"{cost['critic_value']} + {FLAGS.fresh_batches} × "
          f"{1 + bool(FLAGS.fixed_steps) + FLAGS.fresh_every_step * (FLAGS.train_batches - 1)}"
          " value passes", flush=True)
  policy = None
  if todo:   # the rollouts are drawn only when a lever needs them
    t, source = start(base, FLAGS.workdir, FLAGS.step)
    try:
      before = results.get("_rollouts", {})
      for k, v in source.items():
        if k in before and before[k] != v:
          raise app.UsageError(f"{FLAGS.out} holds levers measured with {k}={before[k]!r}, "
                               f"not {v!r}: write to another --out")
      train, fresh = draw(t, FLAGS.train_batches, FLAGS.fresh_batches)
      if FLAGS.workdir:
        policy = t.state.policy_params
    finally:
      t.close()
    del t   # (the restored checkpoint's other trees: only the policy is kept)
    rewards = [float(jnp.mean(b.scores_B)) for b in train + fresh]
    results["_rollouts"] = {**source, "train_reward_mean": rewards[:len(train)],
                            "fresh_reward_mean": rewards[len(train):],
                            "responses_per_batch": int(train[0].scores_B.shape[0])}
  for name in todo:
    results[name] = {"overrides": table_of[name],
                     **run_lever(with_overrides(FLAGS.config, table_of[name]), train, fresh,
                                 policy, fixed_steps=FLAGS.fixed_steps,
                                 fresh_every_step=FLAGS.fresh_every_step,
                                 n_boot=FLAGS.bootstrap)}
    print(f"{name}: {json.dumps(results[name])}", flush=True)
    if FLAGS.out:
      os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
      with open(FLAGS.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
  text = table(results)
  for set_name, set_levers in sets.items():
    if set(set_levers) <= set(results):
      try:
        pick, why = RULES[set_name]({k: results[k] for k in set_levers})
      except ValueError as e:
        text += f"\n{RULE_NAMES[set_name]} picks nothing: {e}.\n"
        continue
      text += f"\n{RULE_NAMES[set_name]} picks **{pick}**: {why}.\n"
  print(text, flush=True)
  if FLAGS.out:
    with open(os.path.splitext(FLAGS.out)[0] + ".md", "w", encoding="utf-8") as f:
      f.write(text)


if __name__ == "__main__":
  define_flags()
  app.run(main)
