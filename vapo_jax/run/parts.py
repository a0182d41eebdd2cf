"""The one place that builds a run's parts from a `config.Config`.

The meshes (the samplers' decode mesh, and the learners' train mesh: the same one unless
mesh.train_tensor lays its devices out again), policy and critic (the tokenizer and
examples: `run.inputs`); the samplers (and the engines' KV sizing); the forward passes and
steps 1–3 of an RL step (`Experience`, with the advantage settings). The trained networks
are `run.learners` (`LEARNERS`, one row each: optimizer and step). The trainer builds its
run with `build` and `learners.learner`, and `pod/programs` (the compile check) builds the
same programs from abstract parameters with the same functions, so the check compiles
exactly what a run runs.
"""

import dataclasses
import functools
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from vapo_jax import config as config_lib
from vapo_jax import critic as critic_lib
from vapo_jax import distributed
from vapo_jax import sharding as shd
from vapo_jax.models import config as model_config
from vapo_jax.models import hf_io, lora, transformer
from vapo_jax.rewards import fn_for_mode
from vapo_jax.rewards import RewardScorer
from vapo_jax.rl import advantages
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import dapo
from vapo_jax.rl import experience as experience_lib
from vapo_jax.rl import forward
from vapo_jax.run import inputs
from vapo_jax.run import learners
from vapo_jax.run import memory as run_memory
from vapo_jax.run import pass_sizes
from vapo_jax.run.inputs import Text
from vapo_jax.sampler import continuous
from vapo_jax.sampler import kv_pool
from vapo_jax.sampler import ops
from vapo_jax.sampler import paged
from vapo_jax.sampler import static
from vapo_jax.sampler import types as types_lib


def rules_of(cfg) -> shd.Rules:
  """The rules table of the rollout engine's decode replicas (and, with
  mesh.train_layout="shared", of the train passes): mesh.rules, else the default."""
  return tuple((str(k), v if v is None or isinstance(v, str) else tuple(v))
               for k, v in cfg.mesh.rules) if cfg.mesh.rules else shd.DEFAULT_RULES


def train_rules_of(cfg) -> shd.Rules:
  """The rules table of the trained networks' parameters, optimizer states and train
  passes (mesh.train_layout): `rules_of(cfg)`, or with "fsdp" `sharding.fsdp_only` of it."""
  return run_memory.train_rules(cfg, rules_of(cfg))


def build_mesh(cfg):
  """The config's (data, fsdp, tensor) mesh; with no -1 size it uses the first devices."""
  sizes = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
  devices = None
  if -1 not in sizes:
    need = int(np.prod(sizes))
    if need > jax.device_count():
      raise ValueError(f"config.mesh {sizes} needs {need} devices, "
                       f"only {jax.device_count()} are present")
    if jax.process_count() > 1 and need != jax.device_count():
      raise ValueError(f"config.mesh {sizes} uses {need} of the {jax.device_count()} devices "
                       f"of {jax.process_count()} processes; a multi-process mesh must use "
                       "every device (set one size to -1)")
    devices = jax.devices()[:need]
  return shd.make_mesh(*sizes, devices=devices)


def build_train_mesh(cfg, mesh):
  """The learners' mesh (mesh.train_tensor): `mesh` itself, or a second mesh over its devices
  in the same flat order, (data, N / (data t), t) (`run.memory.train_mesh`)."""
  return run_memory.train_mesh(cfg, mesh)


def to_train_mesh(mesh, train_mesh, batch_axes_) -> Callable | None:
  """place(tree) -> the tree's [B, ...] arrays on the train mesh, rows split over its batch
  axes (one jitted reshard, multi-process safe), or None when the meshes are one."""
  if train_mesh is mesh:
    return None
  return jax.jit(lambda tree: tree, out_shardings=batch_lib.batch_sharding(train_mesh,
                                                                           batch_axes_))


def build_policy(cfg, mesh, rules, text: Text):
  """(graphdef, params, ModelConfig) of the policy: an HF checkpoint or a fresh small model."""
  m = cfg.model
  if m.hf_path:
    model, mcfg = hf_io.from_pretrained(m.hf_path, mesh=mesh, rules=rules,
                                        param_dtype=m.param_dtype, dtype=m.dtype,
                                        **model_options(cfg))
    if mcfg.real_vocab_size is None:
      mcfg = mcfg.replace(real_vocab_size=min(text.vocab_size, mcfg.vocab_size))
      model.cfg = mcfg
  else:
    mcfg = fresh_model_config(cfg, text)
    base = lora.base_config(mcfg)  # the same base weights with or without adapters
    model = transformer.init_sharded(lambda r: transformer.Transformer(base, rngs=r), mesh,
                                     rules, seed=cfg.init_seed)
    model = lora.attach(model, mcfg, mesh, rules, seed=cfg.init_seed)
  graphdef, params = nnx.split(model)
  return graphdef, params, mcfg


def model_options(cfg) -> dict:
  """ModelConfig fields set by the run config whatever the architecture (LoRA included)."""
  m = cfg.model
  return {"remat": m.remat, "remat_layers": m.remat_layers,
          "remat_selective": m.remat_selective, "scan_layers": m.scan_layers,
          "attention_impl": m.attention_impl,
          "attention_block": m.attention_block, "attention_kernel": m.attention_kernel,
          "collective_matmul": m.collective_matmul, "lora_rank": m.lora.rank,
          "lora_alpha": m.lora.alpha, "lora_targets": tuple(m.lora.targets)}


def fresh_model_config(cfg, text: Text) -> model_config.ModelConfig:
  """The ModelConfig of a config's freshly initialised model (no model.hf_path)."""
  m = cfg.model
  padded_vocab = -(-text.vocab_size // 64) * 64  # padded rows are never sampled
  return model_config.ModelConfig(
      vocab_size=padded_vocab, real_vocab_size=text.vocab_size, hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_layers=m.num_layers,
      num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
      rope_theta=m.rope_theta, tie_word_embeddings=m.tie_word_embeddings,
      qkv_bias=m.model_type == "qwen2", qk_norm=m.model_type == "qwen3",
      model_type=m.model_type, param_dtype=m.param_dtype, dtype=m.dtype,
      **model_options(cfg), eos_token_id=text.eos_ids[0], pad_token_id=text.pad_id)


def build_critic(cfg, policy_graphdef, policy_params, mesh, rules, *, params=None,
                 from_path: bool | None = None):
  """(graphdef, params) of a value model (critic or reward model), its parameters copied.

  From model.critic_path (with model.critic_start = "path", or `from_path`), else the
  policy's weights + a zero head (+ a zero bias with model.critic_head_bias; without LoRA
  adapters, every weight trained, with model.critic_lora=False); `params` (e.g. the trained
  reward model's) replace the weights of the latter.
  """
  if from_path is None:
    from_path = cfg.model.critic_start == "path"
  cls = critic_lib.critic_type(cfg.model.critic_head_bias)
  full = cfg.full_critic
  if from_path:
    options = {**model_options(cfg), **({"lora_rank": 0} if full else {})}
    critic, _ = cls.from_pretrained(
        cfg.model.critic_path, mesh=mesh, rules=rules, param_dtype=cfg.model.param_dtype,
        dtype=cfg.model.dtype, **options)
  else:
    policy = nnx.merge(policy_graphdef, policy_params)
    # Full fine-tuning: the policy's adapters merged into the critic's copy (float32).
    critic = cls.from_policy(lora.merged(policy) if full else policy)
  graphdef, own = nnx.split(critic)
  params = own if params is None else params
  # from_policy shares the policy's buffers; the critic's train step donates its own.
  return graphdef, jax.jit(lambda t: jax.tree.map(jnp.copy, t))(params)


def uses_engine(cfg) -> bool:
  """Whether the run samples with the rollout engine (sampling.engine == "continuous"),
  single- or multi-process: every process runs the same host loop on the same values and
  reads each chunk from replicated arrays (docs/engine.md)."""
  return cfg.sampling.engine == "continuous"


def decode_replicas(mcfg, mesh, rules, slots: int) -> int:
  """The engine's decode replicas: the mesh's batch shards (data x fsdp, each a whole
  tensor-parallel decode copy) when they divide the slots and the tensor axis splits the
  kv heads whole, else 1 (every chip decodes every slot; one line says so)."""
  if mesh is None:
    return 1
  axes = shd.batch_axes(mesh, rules)
  r = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  if r == 1:
    return 1
  why = None
  if slots % r:
    why = f"{slots} slots do not split over {r} batch shards"
  else:
    tp = continuous.kv_head_shards(mcfg, mesh, rules)
    if mcfg.num_kv_heads % tp:
      why = f"{mcfg.num_kv_heads} kv heads do not split over {tp} tensor shards"
  if why:
    print(f"[sampler] decode replicas off ({why}): every chip decodes every slot",
          flush=True)
    return 1
  return r


def build_sampler(cfg, graphdef, mcfg, mesh, rules, text: Text, *, n: int,
                  temperature: float | None = None, greedy: bool = False, rows: int = 0,
                  memory: kv_pool.Memory | None = None, kv_tokens: int = 0):
  """A compiled group sampler with the run's sampling settings.

  The engine's KV pool (`sampler.kv_pool.size`): sampling.kv_tokens, else `kv_tokens`, else
  sized from `memory` (default: the device's HBM less the resident train state,
  `run.memory.engine_memory`; on CPU the cap of slots x one whole response)."""
  s = cfg.sampling
  scfg = ops.SamplingConfig(
      max_new_tokens=s.max_new_tokens, temperature=temperature or s.temperature,
      top_p=s.top_p, top_k=s.top_k, greedy=greedy, stop_token_ids=text.eos_ids,
      pad_id=text.pad_id, vocab_size=text.vocab_size, n_per_prompt=n,
      max_prompt_len=cfg.data.max_prompt_tokens,
      prompt_buckets=(cfg.data.max_prompt_tokens,), decode_windows=s.decode_windows)
  if uses_engine(cfg):  # the rollout engine (docs/engine.md)
    slots = s.slots or rows or n  # 0: as many slots as the static sampler has rows
    scfg = dataclasses.replace(scfg, prompt_buckets=pass_sizes.prompt_buckets(cfg))
    if memory is None and not (s.kv_tokens or kv_tokens):
      memory = run_memory.engine_memory(cfg, mcfg, mesh, rules, learners.optimizer)
    replicas = decode_replicas(mcfg, mesh, rules, slots)
    pool = kv_pool.size(slots=slots, page_size=s.page_size,
                        whole_tokens=cfg.data.max_prompt_tokens + s.max_new_tokens - 1,
                        token_bytes_=kv_pool.token_bytes(mcfg, mcfg.dtype, mesh, rules),
                        memory=memory, explicit=s.kv_tokens or kv_tokens, replicas=replicas)
    engine = continuous.Engine(graphdef, mcfg, scfg, continuous.EngineConfig(
        slots=slots, page_size=s.page_size, chunk_steps=s.chunk_steps, kv_tokens=pool.tokens,
        decode_dtype=s.decode_dtype, replicas=replicas, overlap=s.overlap,
        decode_buckets=s.decode_buckets,
        kernel=continuous.attention_kernel(
            s.attention_kernel, mcfg, mesh, rules, s.page_size,
            table=(slots // replicas, paged.pages_for(
                cfg.data.max_prompt_tokens + s.max_new_tokens - 1, s.page_size)))),
        mesh=mesh, rules=rules)
    engine.pool = pool  # how it was sized (the compile check's KV-pool line)
    return engine
  # The KV cache's kv_heads axis is split like the k/v projections (over `tensor`), not
  # only its rows over the batch axes: at 32B × 20k tokens a row's cache is 5.6 GB, and
  # replicating it over a 4-way tensor axis is what keeps it off any v5p slice.
  init = functools.partial(transformer.init_cache, mcfg)
  spec = shd.logical_to_spec((None, None, "kv_heads", "head_dim"), rules, mesh,
                             (1, 1, mcfg.num_kv_heads, mcfg.head_dim))
  kv_sharding = NamedSharding(mesh, spec)

  def init_cache(batch, max_len):
    cache = init(batch, max_len)
    if not any(spec):
      return cache
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, kv_sharding), cache)

  return static.Sampler(graphdef, init_cache, scfg, mesh=mesh, rules=rules)


def device_count_check(cfg, mesh, rules, *, train: bool = False) -> None:
  """The samplers' batches must split evenly over the batch shards of the mesh under
  `rules`; with `train` (the train rules) the rows the train passes see: a rollout's
  responses and an SFT batch."""
  axes = shd.batch_axes(mesh, rules)
  shards = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  sizes = ((("rl.prompts_per_step × rl.responses_per_prompt",
             cfg.prompts_per_step * cfg.responses_per_prompt),
            ("sft.batch_size", cfg.sft.batch_size if cfg.sft.enabled else 0))
           if train else
           (("rl.prompts_per_step", cfg.prompts_per_step),
            ("eval.batch_prompts", cfg.eval.batch_prompts),
            ("sft.batch_size", cfg.sft.batch_size),
            ("sampling.prompts_per_call", cfg.sampling.prompts_per_call)))
  for what, rows in sizes:
    if rows % shards:
      layout = (f" (mesh.train_layout={cfg.mesh.train_layout!r}, mesh.train_tensor="
                f"{cfg.mesh.train_tensor})" if train else "")
      raise ValueError(f"config.{what}={rows} must be a multiple of the {shards} batch "
                       f"shards of the mesh {dict(mesh.shape)}{layout}")


# ------------------------------------------------------------- forwards and steps 1–3


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


@dataclasses.dataclass(frozen=True)
class Samplers:
  """The run's samplers: engines (`continuous.Engine`), or with sampling.engine="static"
  static samplers (`static.Sampler`)."""
  rollout: types_lib.RolloutSampler  # n = responses_per_prompt
  eval: types_lib.RolloutSampler     # n = eval.samples_per_problem
  greedy: types_lib.RolloutSampler   # n = 1, argmax


def samplers(cfg, graphdef, mcfg, mesh, rules, text: Text, *,
             memory: kv_pool.Memory | None = None,
             kv_tokens: dict[str, int] | None = None) -> Samplers:
  """The rollout, evaluation and greedy samplers. memory / kv_tokens ({"rollout" | "eval" |
  "greedy": tokens}) size the engines' KV pools (`build_sampler`; the compile check)."""
  build = functools.partial(build_sampler, cfg, graphdef, mcfg, mesh, rules, text)
  if (memory is None and uses_engine(cfg) and not cfg.sampling.kv_tokens
      and not kv_tokens):
    memory = run_memory.engine_memory(cfg, mcfg, mesh, rules, learners.optimizer)
  kv = kv_tokens or {}
  n, k, ev = cfg.responses_per_prompt, cfg.eval.samples_per_problem, cfg.eval.batch_prompts
  return Samplers(
      build(n=n, rows=n * cfg.prompts_per_step, memory=memory, kv_tokens=kv.get("rollout", 0)),
      build(n=k, rows=k * ev, memory=memory, kv_tokens=kv.get("eval", 0)),
      build(n=1, greedy=True, rows=ev, memory=memory, kv_tokens=kv.get("greedy", 0)))


def experience(cfg, sampler, text: Text, scorer, logprobs, place: Callable | None = None
               ) -> experience_lib.Experience:
  """Steps 1–3 of the RL step with the run's settings (the critic's values come with each
  call: `Experience.__call__`); `place` moves each rollout to the train mesh
  (`to_train_mesh`)."""
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
      group_size=cfg.responses_per_prompt,
      correction=cfg.rl.correction,
      old_logprobs=cfg.old_logprobs, place=place)


@dataclasses.dataclass
class RunParts:
  """What a run is built from (the trained networks come later: `learner`)."""
  mesh: Any                     # the learners' and train passes' (mesh.train_tensor)
  decode_mesh: Any              # the samplers' (mesh.data, .fsdp, .tensor); else `mesh` itself
  rules: shd.Rules              # the train passes' (mesh.train_layout)
  batch_axes: tuple[str, ...]   # theirs
  decode_rules: shd.Rules       # the samplers' (mesh.rules)
  text: Text
  train_examples: list
  eval_examples: list
  data_stats: dict
  graphdef: Any                 # the policy's
  policy_params: Any            # its initial parameters
  model_cfg: model_config.ModelConfig
  scorer: RewardScorer          # training rewards (reward.mode)
  eval_scorer: Any              # the same pool, checking in eval.reward_mode
  samplers: Samplers
  experience: experience_lib.Experience  # steps 1–3
  take: Callable                # take(batch, idx): the mini-batch of rows idx, on the mesh


def build(cfg: config_lib.Config) -> RunParts:
  """A run's parts, in the order that fails fastest (config vs devices, files, model)."""
  decode_rules, rules = rules_of(cfg), train_rules_of(cfg)
  decode_mesh = build_mesh(cfg)
  mesh = build_train_mesh(cfg, decode_mesh)  # the learners'; `decode_mesh` itself by default
  device_count_check(cfg, decode_mesh, decode_rules)
  device_count_check(cfg, mesh, rules, train=True)
  text = inputs.build_text(cfg)
  train, held_out, stats = inputs.build_examples(cfg, text)
  if not held_out:
    warnings.warn("no held-out examples (data.eval_path is empty): evaluating on the first "
                  f"{cfg.eval.num_examples} training examples")
    held_out = train[:cfg.eval.num_examples]
  graphdef, params, mcfg = build_policy(cfg, mesh, rules, text)
  scorer = RewardScorer(fn_for_mode(cfg.reward.fn, cfg.reward.mode),
                        num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s)
  built = samplers(cfg, graphdef, mcfg, decode_mesh, decode_rules, text)
  axes = shd.batch_axes(mesh, rules)
  return RunParts(
      mesh=mesh, decode_mesh=decode_mesh, rules=rules, batch_axes=axes,
      decode_rules=decode_rules, text=text,
      train_examples=train,
      eval_examples=held_out, data_stats=stats, graphdef=graphdef, policy_params=params,
      model_cfg=mcfg, scorer=scorer,
      eval_scorer=scorer.using(fn_for_mode(cfg.reward.fn, cfg.eval.reward_mode)),
      samplers=built,
      experience=experience(cfg, built.rollout, text, scorer,
                            logprobs_fn(cfg, graphdef, mesh, rules),
                            to_train_mesh(decode_mesh, mesh, axes)),
      take=take_fn(mesh, axes))
