"""The one place that builds a run's parts from a `config.Config`.

Mesh, policy and critic (the tokenizer and examples: `run.inputs`); the samplers; the
settings of each RL step (every Config → dataclass adapter); the trained networks
(`LEARNERS`, one row each: optimizer and compiled step) and the jitted programs. The trainer
builds its run with `build` and `learner`, and `tools/programs` (the compile check) builds
the same programs from abstract parameters with the same functions, so the check compiles
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
from vapo_jax import packing
from vapo_jax import sharding as shd
from vapo_jax.models import config as model_config
from vapo_jax.models import hf_io, lora, transformer
from vapo_jax.rewards import fn_for_mode
from vapo_jax.rewards import RewardScorer
from vapo_jax.rl import advantages
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import experience as experience_lib
from vapo_jax.rl import forward
from vapo_jax.rl import packed as packed_lib
from vapo_jax.rl import train_state
from vapo_jax.rl import update
from vapo_jax.run import inputs
from vapo_jax.run import memory as run_memory
from vapo_jax.run.inputs import Text
from vapo_jax.sampler import continuous
from vapo_jax.sampler import kv_pool
from vapo_jax.sampler import ops
from vapo_jax.sampler import static
from vapo_jax.sampler import types as types_lib


def rules_of(cfg) -> shd.Rules:
  return tuple((str(k), v if v is None or isinstance(v, str) else tuple(v))
               for k, v in cfg.mesh.rules) if cfg.mesh.rules else shd.DEFAULT_RULES


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
  return {"remat": m.remat, "attention_impl": m.attention_impl,
          "attention_block": m.attention_block, "lora_rank": m.lora.rank,
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
  policy's weights + a zero head; `params` (e.g. the trained reward model's) replace the
  weights of the latter.
  """
  if from_path is None:
    from_path = cfg.model.critic_start == "path"
  if from_path:
    critic, _ = critic_lib.Critic.from_pretrained(
        cfg.model.critic_path, mesh=mesh, rules=rules, param_dtype=cfg.model.param_dtype,
        dtype=cfg.model.dtype, **model_options(cfg))
  else:
    policy = nnx.merge(policy_graphdef, policy_params)
    critic = critic_lib.Critic.from_policy(policy)
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
    if memory is None and not (s.kv_tokens or kv_tokens):
      memory = run_memory.engine_memory(cfg, mcfg, mesh, rules, optimizer)
    replicas = decode_replicas(mcfg, mesh, rules, slots)
    pool = kv_pool.size(slots=slots, page_size=s.page_size,
                        whole_tokens=cfg.data.max_prompt_tokens + s.max_new_tokens - 1,
                        token_bytes_=kv_pool.token_bytes(mcfg, mcfg.dtype, mesh, rules),
                        memory=memory, explicit=s.kv_tokens or kv_tokens, replicas=replicas)
    engine = continuous.Engine(graphdef, mcfg, scfg, continuous.EngineConfig(
        slots=slots, page_size=s.page_size, chunk_steps=s.chunk_steps, kv_tokens=pool.tokens,
        decode_dtype=s.decode_dtype, replicas=replicas,
        kernel=continuous.attention_kernel(s.attention_kernel, mcfg, mesh, rules,
                                           s.page_size)), mesh=mesh, rules=rules)
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


def device_count_check(cfg, mesh, rules) -> None:
  """The rollout batch must split evenly over the batch shards of the mesh."""
  axes = shd.batch_axes(mesh, rules)
  shards = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  for what, rows in (("rl.prompts_per_step", cfg.prompts_per_step),
                     ("eval.batch_prompts", cfg.eval.batch_prompts),
                     ("sft.batch_size", cfg.sft.batch_size),
                     ("sampling.prompts_per_call", cfg.sampling.prompts_per_call)):
    if rows % shards:
      raise ValueError(f"config.{what}={rows} must be a multiple of the {shards} batch "
                       f"shards of the mesh {dict(mesh.shape)}")



# ---------------------------------------------------------------- config -> step settings


def advantage_config(cfg: config_lib.Config) -> advantages.AdvantageConfig:
  """The advantage settings of step 3 (`rl.alpha` reaches `gae` only through here)."""
  rl = cfg.rl
  return advantages.AdvantageConfig(
      estimator=rl.advantage_estimator, gamma=rl.gamma, decoupled=rl.decoupled_gae,
      lam_critic=rl.lam_critic, length_adaptive=rl.length_adaptive, alpha=rl.alpha,
      lam_policy=rl.lam_policy, group_std_norm=rl.group_std_norm,
      whiten=rl.whiten_advantages, gae_impl=rl.gae_impl)


def policy_hparams(cfg: config_lib.Config, micro_batches: int = 1) -> update.PolicyHParams:
  """The policy step's settings (the config's VAPO switches resolved)."""
  rl = cfg.rl
  return update.PolicyHParams(
      temperature=cfg.sampling.temperature, eps_low=rl.eps_low, eps_high=cfg.eps_high,
      dual_clip=rl.dual_clip or None, loss_mode=cfg.loss_mode, nll_coef=rl.nll_coef,
      nll_threshold=rl.nll_threshold, micro_batches=micro_batches, kl_coef=rl.kl_coef,
      policy_loss=rl.policy_loss)


def critic_hparams(cfg: config_lib.Config, micro_batches: int = 1) -> update.CriticHParams:
  return update.CriticHParams(value_clip=cfg.rl.value_clip or None, loss_mode="token",
                              micro_batches=micro_batches)


@dataclasses.dataclass(frozen=True)
class Rows:
  """Row counts of one RL step."""
  rollout: int         # B = prompts_per_step × responses_per_prompt
  minibatch: int       # rows of one mini-batch (one optimizer update)
  micro_batches: int   # gradient-accumulation micro-batches per mini-batch
  forward_chunks: int  # micro-batches of the old-log-prob and value passes over B rows


def rows_of(cfg: config_lib.Config) -> Rows:
  rows = cfg.prompts_per_step * cfg.responses_per_prompt
  minibatch = rows // cfg.rl.num_minibatches
  micro = cfg.rl.micro_batch_size
  # The old-log-prob and value passes over the whole rollout run in train-sized
  # micro-batches: at 32B × 20k tokens the whole batch at once would not fit any pod.
  return Rows(rows, minibatch, minibatch // micro if micro else 1, rows // micro if micro else 1)


def ppo_loop(cfg: config_lib.Config) -> update.PPOLoop:
  return update.PPOLoop(epochs=cfg.rl.ppo_epochs, num_minibatches=cfg.rl.num_minibatches,
                        minibatch_rows=rows_of(cfg).minibatch, seed=cfg.seed)


def sft_warmup(cfg: config_lib.Config) -> int:
  return min(cfg.optim.warmup_steps, cfg.sft.steps // 10)


# ------------------------------------------------------------------------------ programs
# Each takes parameters or a TrainState, concrete or abstract (`jax.ShapeDtypeStruct`s with
# shardings): only their structure and shardings are read.


def _compile(step_fn, state, mesh, rules):
  return train_state.compile_step(step_fn, state, mesh, shd.batch_axes(mesh, rules), rules)


def sft_step(cfg, graphdef, tx, state, mesh, rules):
  del cfg
  return _compile(functools.partial(update.sft_step, graphdef, tx), state, mesh, rules)


def policy_step(cfg, graphdef, tx, state, mesh, rules):
  hp = policy_hparams(cfg, rows_of(cfg).micro_batches)
  return _compile(functools.partial(update.policy_step, graphdef, tx, hp), state, mesh, rules)


def critic_step(cfg, graphdef, tx, state, mesh, rules):
  hp = critic_hparams(cfg, rows_of(cfg).micro_batches)
  return _compile(functools.partial(update.critic_step, graphdef, tx, hp), state, mesh, rules)


def reward_model_step(cfg, graphdef, tx, state, mesh, rules):
  hp = critic_hparams(cfg, rows_of(cfg).micro_batches)
  return _compile(functools.partial(update.reward_model_step, graphdef, tx, hp), state, mesh,
                  rules)


@dataclasses.dataclass(frozen=True)
class LearnerRow:
  """How one trained network is built: its optimizer's (rate, warm-up) from the config, and
  its step builder (cfg, graphdef, tx, state, mesh, rules) -> compiled step."""
  schedule: Callable[[config_lib.Config], tuple[float, int]]
  step: Callable


# Every network a run trains, by name: the one table (a process reward model or a second
# critic would be one more row, plus its step function in rl.update).
LEARNERS: dict[str, LearnerRow] = {
    "sft": LearnerRow(lambda cfg: (cfg.optim.sft_lr, sft_warmup(cfg)), sft_step),
    "policy": LearnerRow(lambda cfg: (cfg.optim.policy_lr, cfg.optim.warmup_steps),
                         policy_step),
    "critic": LearnerRow(lambda cfg: (cfg.optim.critic_lr, cfg.optim.warmup_steps),
                         critic_step),
    "reward_model": LearnerRow(lambda cfg: (cfg.optim.critic_lr, cfg.optim.warmup_steps),
                               reward_model_step),
}


def optimizer(cfg: config_lib.Config, name: str) -> train_state.Optimizer:
  """The AdamW of one of LEARNERS."""
  o = cfg.optim
  lr, warmup = LEARNERS[name].schedule(cfg)
  return train_state.make_optimizer(lr, warmup_steps=warmup, weight_decay=o.weight_decay,
                                    b1=o.b1, b2=o.b2, eps=o.eps, grad_clip=o.grad_clip)


def learner(cfg, name: str, graphdef, params, mesh, rules) -> train_state.Learner:
  """One of LEARNERS set up: its optimizer, a fresh TrainState of `params`, its compiled
  step (with rl.packing: the packed step behind a host wrapper that plans each batch,
  `packed_step`)."""
  tx = optimizer(cfg, name)
  state = train_state.init_state(params, tx)
  step = (packed_step(cfg, name, graphdef, tx, state, mesh, rules) if cfg.rl.packing
          else LEARNERS[name].step(cfg, graphdef, tx, state, mesh, rules))
  return train_state.Learner(name, graphdef, tx, step, state)


# ------------------------------------------------------------------------- sequence packing


def pack_spec(cfg, mesh, rules, rows_per_micro: int) -> packing.PackSpec:
  """Rows of rl.packing_row_tokens (default P + R) and a token budget per device of
  rl.packing_tokens_per_device (default: what a padded micro-batch of `rows_per_micro`
  rows puts on each device)."""
  axes = shd.batch_axes(mesh, rules)
  shards = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  return packing.spec_for(cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens,
                          rows_per_micro, shards, cfg.rl.packing_row_tokens,
                          cfg.rl.packing_tokens_per_device)


def pass_spec(cfg, name: str, mesh, rules) -> packing.PackSpec:
  """The PackSpec of one packed pass: a LEARNERS step (its padded micro-batch's rows) or
  "logprobs" / "values" (a forward chunk's rows)."""
  rows = rows_of(cfg)
  per_micro = {"sft": cfg.sft.batch_size,
               "logprobs": rows.rollout // rows.forward_chunks,
               "values": rows.rollout // rows.forward_chunks}.get(
                   name, rows.minibatch // max(rows.micro_batches, 1))
  return pack_spec(cfg, mesh, rules, per_micro)


def packed_step(cfg, name, graphdef, tx, state, mesh, rules) -> Callable:
  """A LEARNERS step on packed rows (`rl.packed`): same losses and gradients, and
  `perf/<name>_token_efficiency` in its metrics. `.compiled` is the jitted packed step
  (state, rl.packed.Packed) and `.spec` its PackSpec (the compile check lowers them)."""
  rows = rows_of(cfg)
  fn = {"sft": lambda: functools.partial(packed_lib.sft_step, graphdef, tx),
        "policy": lambda: functools.partial(packed_lib.policy_step, graphdef, tx,
                                            policy_hparams(cfg, rows.micro_batches)),
        "critic": lambda: functools.partial(packed_lib.critic_step, graphdef, tx,
                                            critic_hparams(cfg, rows.micro_batches)),
        "reward_model": lambda: functools.partial(packed_lib.reward_model_step, graphdef, tx,
                                                  critic_hparams(cfg, rows.micro_batches)),
        }[name]()
  return packed_lib.packed_learner_step(name, _compile(fn, state, mesh, rules),
                                        pass_spec(cfg, name, mesh, rules), mesh,
                                        shd.batch_axes(mesh, rules))


def logprobs_fn(cfg, graphdef, mesh, rules, packed: bool = False):
  """(params, tokens_BxL, mask_BxL, *, prompt_len, temperature) -> old log-probs, entropy.

  packed: on packed rows (`rl.packed.packed_forward`; the run passes rl.packing)."""
  if packed:
    return packed_lib.packed_forward(
        "logprobs", functools.partial(packed_lib.policy_logprobs, graphdef),
        pass_spec(cfg, "logprobs", mesh, rules), mesh, shd.batch_axes(mesh, rules), rules,
        static=("temperature",))
  return jax.jit(forward.in_micro_batches(functools.partial(forward.policy_logprobs, graphdef),
                                          rows_of(cfg).forward_chunks, mesh, rules),
                 static_argnames=("prompt_len", "temperature"))


def values_fn(cfg, graphdef, mesh, rules, packed: bool = False):
  """(critic params, tokens_BxL, mask_BxL, *, prompt_len) -> V(s_t) [B, R] (packed: as in
  `logprobs_fn`)."""
  if packed:
    return packed_lib.packed_forward(
        "values", functools.partial(packed_lib.critic_values, graphdef),
        pass_spec(cfg, "values", mesh, rules), mesh, shd.batch_axes(mesh, rules), rules)
  return jax.jit(forward.in_micro_batches(functools.partial(forward.critic_values, graphdef),
                                          rows_of(cfg).forward_chunks, mesh, rules),
                 static_argnames=("prompt_len",))


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
    memory = run_memory.engine_memory(cfg, mcfg, mesh, rules, optimizer)
  kv = kv_tokens or {}
  n, k, ev = cfg.responses_per_prompt, cfg.eval.samples_per_problem, cfg.eval.batch_prompts
  return Samplers(
      build(n=n, rows=n * cfg.prompts_per_step, memory=memory, kv_tokens=kv.get("rollout", 0)),
      build(n=k, rows=k * ev, memory=memory, kv_tokens=kv.get("eval", 0)),
      build(n=1, greedy=True, rows=ev, memory=memory, kv_tokens=kv.get("greedy", 0)))


def experience(cfg, sampler, text: Text, scorer, logprobs) -> experience_lib.Experience:
  """Steps 1–3 of the RL step with the run's settings (the critic's values come with each
  call: `Experience.__call__`)."""
  ac = advantage_config(cfg)
  return experience_lib.Experience(
      sampler=sampler, text=text, scorer=scorer, logprobs=logprobs,
      advantages=jax.jit(functools.partial(advantages.compute_advantages, ac)),
      # Value pretraining's targets: Monte Carlo (λ = 1), or with value_pretrain.coupled_gae
      # the RL stage's λ_policy (the critic then bootstraps on itself, as without decoupling).
      monte_carlo=jax.jit(functools.partial(advantages.compute_advantages, dataclasses.replace(
          ac, estimator="gae", decoupled=not cfg.value_pretrain.coupled_gae, lam_critic=1.0))),
      temperature=cfg.sampling.temperature, prompts_per_call=cfg.sampling.prompts_per_call,
      overlong=((cfg.sampling.max_new_tokens, cfg.overlong_cache_tokens)
                if cfg.rl.overlong_shaping else None),
      dynamic_rounds=cfg.rl.dynamic_sampling_max_rounds if cfg.rl.dynamic_sampling else -1,
      group_size=cfg.responses_per_prompt)


@dataclasses.dataclass
class RunParts:
  """What a run is built from (the trained networks come later: `learner`)."""
  mesh: Any
  rules: shd.Rules
  batch_axes: tuple[str, ...]
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
  rules = rules_of(cfg)
  mesh = build_mesh(cfg)
  device_count_check(cfg, mesh, rules)
  text = inputs.build_text(cfg)
  train, held_out, stats = inputs.build_examples(cfg, text)
  if not held_out:
    warnings.warn("no held-out examples (data.eval_path is empty): evaluating on the first "
                  f"{cfg.eval.num_examples} training examples")
    held_out = train[:cfg.eval.num_examples]
  graphdef, params, mcfg = build_policy(cfg, mesh, rules, text)
  scorer = RewardScorer(fn_for_mode(cfg.reward.fn, cfg.reward.mode),
                        num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s)
  built = samplers(cfg, graphdef, mcfg, mesh, rules, text)
  axes = shd.batch_axes(mesh, rules)
  return RunParts(
      mesh=mesh, rules=rules, batch_axes=axes, text=text, train_examples=train,
      eval_examples=held_out, data_stats=stats, graphdef=graphdef, policy_params=params,
      model_cfg=mcfg, scorer=scorer,
      eval_scorer=scorer.using(fn_for_mode(cfg.reward.fn, cfg.eval.reward_mode)),
      samplers=built,
      experience=experience(cfg, built.rollout, text, scorer,
                            logprobs_fn(cfg, graphdef, mesh, rules, cfg.rl.packing)),
      take=take_fn(mesh, axes))
