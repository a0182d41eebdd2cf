"""The policy and value networks a run starts from, and the model options its config sets.

`build_policy`: an HF checkpoint or a fresh model, LoRA adapters attached; `build_critic`:
model.critic_path, or the policy's weights with a zero head.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from vapo_jax import critic as critic_lib
from vapo_jax.models import config as model_config
from vapo_jax.models import hf_io, lora, transformer
from vapo_jax.run.inputs import Text


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
