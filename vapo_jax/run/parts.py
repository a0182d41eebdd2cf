"""A run's parts (`RunParts`), built from a `config.Config` in the order that fails fastest.

Each from its room: meshes and rules (`run.meshes`), text and examples (`run.inputs`), the
policy (`run.networks`), samplers (`run.sampling`), forwards and `Experience`
(`run.forwards`); the trained networks come later (`run.learners`). The compile check
(`pod.programs`) builds its programs with the same rooms' functions.
"""

import dataclasses
import warnings
from typing import Any, Callable

from vapo_jax import config as config_lib
from vapo_jax import sharding as shd
from vapo_jax.models import config as model_config
from vapo_jax.rewards import fn_for_mode
from vapo_jax.rewards import RewardScorer
from vapo_jax.rl import experience as experience_lib
from vapo_jax.run import forwards
from vapo_jax.run import inputs
from vapo_jax.run import meshes
from vapo_jax.run import networks
from vapo_jax.run import sampling


@dataclasses.dataclass
class RunParts:
  """What a run is built from (the trained networks come later: `learner`)."""
  mesh: Any                     # the learners' and train passes' (mesh.train_tensor)
  decode_mesh: Any              # the samplers' (mesh.data, .fsdp, .tensor); else `mesh` itself
  rules: shd.Rules              # the train passes' (mesh.train_layout)
  batch_axes: tuple[str, ...]   # theirs
  decode_rules: shd.Rules       # the samplers' (mesh.rules)
  text: inputs.Text
  train_examples: list
  eval_examples: list
  data_stats: dict
  graphdef: Any                 # the policy's
  policy_params: Any            # its initial parameters
  model_cfg: model_config.ModelConfig
  scorer: RewardScorer          # training rewards (reward.mode)
  eval_scorer: Any              # the same pool, checking in eval.reward_mode
  samplers: sampling.Samplers
  experience: experience_lib.Experience  # steps 1–3
  take: Callable                # take(batch, idx): the mini-batch of rows idx, on the mesh


def build(cfg: config_lib.Config) -> RunParts:
  """A run's parts, in the order that fails fastest (config vs devices, files, model)."""
  decode_rules, rules = meshes.rules_of(cfg), meshes.train_rules_of(cfg)
  decode_mesh = meshes.build_mesh(cfg)
  mesh = meshes.build_train_mesh(cfg, decode_mesh)  # the learners'; by default `decode_mesh`
  meshes.device_count_check(cfg, decode_mesh, decode_rules)
  meshes.device_count_check(cfg, mesh, rules, train=True)
  text = inputs.build_text(cfg)
  train, held_out, stats = inputs.build_examples(cfg, text)
  if not held_out:
    warnings.warn("no held-out examples (data.eval_path is empty): evaluating on the first "
                  f"{cfg.eval.num_examples} training examples")
    held_out = train[:cfg.eval.num_examples]
  graphdef, params, mcfg = networks.build_policy(cfg, mesh, rules, text)
  scorer = RewardScorer(fn_for_mode(cfg.reward.fn, cfg.reward.mode),
                        num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s)
  built = sampling.samplers(cfg, graphdef, mcfg, decode_mesh, decode_rules, text)
  axes = shd.batch_axes(mesh, rules)
  return RunParts(
      mesh=mesh, decode_mesh=decode_mesh, rules=rules, batch_axes=axes,
      decode_rules=decode_rules, text=text,
      train_examples=train,
      eval_examples=held_out, data_stats=stats, graphdef=graphdef, policy_params=params,
      model_cfg=mcfg, scorer=scorer,
      eval_scorer=scorer.using(fn_for_mode(cfg.reward.fn, cfg.eval.reward_mode)),
      samplers=built,
      experience=forwards.experience(cfg, built.rollout, text, scorer,
                                     forwards.logprobs_fn(cfg, graphdef, mesh, rules),
                                     meshes.to_train_mesh(decode_mesh, mesh, axes)),
      take=forwards.take_fn(mesh, axes))
