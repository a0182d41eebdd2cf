"""The forward passes over a rollout and steps 1–3 of an RL step (`Experience`).

The old-log-prob and value passes on the run's row layout, the mini-batch `take`, and the
advantage settings of step 3 (`AdvantageConfig`: the one place they come from).
"""

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import config as config_lib
from vapo_jax import distributed
from vapo_jax import sharding as shd
from vapo_jax.rl import advantages
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import dapo
from vapo_jax.rl import experience as experience_lib
from vapo_jax.rl import forward
from vapo_jax.run import learners
from vapo_jax.run.inputs import Text


def advantage_config(cfg: config_lib.Config) -> advantages.AdvantageConfig:
  """The advantage settings of step 3 (`rl.alpha`, resolved by `Config.alpha`, reaches `gae`
  only through here)."""
  rl = cfg.rl
  return advantages.AdvantageConfig(
      estimator=rl.advantage_estimator, gamma=rl.gamma, decoupled=rl.decoupled_gae,
      lam_critic=rl.lam_critic, length_adaptive=rl.length_adaptive, alpha=cfg.alpha,
      lam_policy=rl.lam_policy, group_std_norm=rl.group_std_norm,
      whiten=rl.whiten_advantages, gae_impl=rl.gae_impl, reward_scale=rl.reward_scale,
      reward_shift=rl.reward_shift)


def logprobs_fn(cfg, graphdef, mesh, rules):
  """(params, tokens_BxL, mask_BxL, *, prompt_len, temperature) -> old log-probs, entropy,
  on the run's row layout."""
  return learners.pass_layout(cfg, "logprobs", mesh, rules).forward(
      "logprobs", functools.partial(forward.policy_logprobs, graphdef), mesh,
      shd.batch_axes(mesh, rules), rules, static=("temperature",))


def values_fn(cfg, graphdef, mesh, rules):
  """(critic params, tokens_BxL, mask_BxL, *, prompt_len) -> V(s_t) [B, R]."""
  return learners.pass_layout(cfg, "values", mesh, rules).forward(
      "values", functools.partial(forward.critic_values, graphdef), mesh,
      shd.batch_axes(mesh, rules), rules)


def take_fn(mesh, batch_axes_):
  """take(batch, idx): rows idx of a batch, sharded like a batch."""
  take = jax.jit(lambda batch, idx: jax.tree.map(lambda x: jnp.take(x, idx, 0), batch),
                 out_shardings=batch_lib.batch_sharding(mesh, batch_axes_))
  # idx is the same on every host; as a replicated global array it also works multi-host.
  return lambda batch, idx: take(batch, distributed.replicated(np.asarray(idx), mesh))


def experience(cfg, sampler, text: Text, scorer, logprobs, place: Callable | None = None
               ) -> experience_lib.Experience:
  """Steps 1–3 of the RL step with the run's settings (the critic's values come with each
  call: `Experience.__call__`); `place` moves each rollout to the train mesh
  (`run.meshes.to_train_mesh`)."""
  ac = advantage_config(cfg)
  return experience_lib.Experience(
      sampler=sampler, text=text, scorer=scorer, logprobs=logprobs,
      advantages=jax.jit(functools.partial(advantages.compute_advantages, ac)),
      # Value pretraining's targets: Monte Carlo (λ = 1), or with value_pretrain.coupled_gae
      # the RL stage's λ_policy (the critic then bootstraps on itself, as without decoupling).
      monte_carlo=jax.jit(functools.partial(advantages.compute_advantages, dataclasses.replace(
          ac, estimator="gae", decoupled=not cfg.value_pretrain.coupled_gae, lam_critic=1.0))),
      temperature=cfg.sampling.temperature, prompts_per_call=cfg.sampling.prompts_per_call,
      overlong=(dapo.Overlong(cfg.sampling.max_new_tokens, cfg.overlong_cache_tokens)
                if cfg.rl.overlong_shaping else None),
      dynamic_rounds=cfg.rl.dynamic_sampling_max_rounds if cfg.rl.dynamic_sampling else -1,
      group_size=cfg.rl.group_size,
      correction=cfg.rl.correction,
      old_logprobs=cfg.old_logprobs, place=place)
