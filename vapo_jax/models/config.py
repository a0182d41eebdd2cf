"""`ModelConfig`: one frozen description of a decoder-only transformer.

Built from an HF `config.json` dict (`ModelConfig.from_hf`) or directly (the
tiny CPU configs). `to_hf()` writes a dict that transformers reads back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

# model_type -> (architecture class name, qkv_bias default, qk_norm).
SUPPORTED = {
    "qwen2": ("Qwen2ForCausalLM", True, False),
    "qwen3": ("Qwen3ForCausalLM", False, True),
    "llama": ("LlamaForCausalLM", False, False),
}

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
           "float16": jnp.float16}


def _dtype_name(dtype: Any) -> str:
  return jnp.dtype(dtype).name


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the transformer.

  Attributes:
    vocab_size: rows of the embedding (may exceed the tokenizer's size).
    hidden_size: residual width D.
    intermediate_size: MLP width F.
    num_layers: number of decoder blocks L.
    num_heads: query heads H.
    num_kv_heads: key/value heads K; H % K == 0 (GQA).
    head_dim: per-head width Dh (default D // H).
    rms_norm_eps: epsilon of every RMSNorm.
    rope_theta: RoPE base.
    rope_scaling: None, or a dict with rope_type "llama3" (factor,
      low_freq_factor, high_freq_factor, original_max_position_embeddings)
      or "linear" (factor).
    qkv_bias: q/k/v projections have biases (Qwen2/2.5).
    qk_norm: RMSNorm over Dh on q and k before RoPE (Qwen3).
    mlp_bias: gate/up/down projections have biases (some Llama variants).
    o_bias: the output projection has a bias (Llama attention_bias=True).
    tie_word_embeddings: the LM head is the embedding transposed.
    param_dtype: storage dtype of parameters.
    dtype: compute dtype of matmuls (norms, softmax and RoPE angles are
      float32 whatever this is).
    remat: rematerialise each decoder block in the backward pass.
    remat_layers: with remat, how many blocks (the first ones) are rematerialised; the
      others keep their activations for the backward pass (one forward less each, their
      activations held). -1: every block. Chosen by memory (`pod.compile_check
      --remat_search`): the fewest that fit.
    remat_selective: of the rematerialised blocks, how many (the last ones) remat
      selectively: they keep their matmul outputs (`transformer.SAVED`: q, k, v, o, gate,
      up, and the splash kernel's residuals) and recompute only the elementwise work (norms,
      RoPE, SiLU, bias; on the pure-JAX paths the attention forward too); the first
      num_remat - remat_selective
      recompute everything (keep only their input). 0: none (every rematerialised block
      full). At most the number of rematerialised blocks.
    scan_layers: the blocks' parameters are stacked on a leading layer axis [L, ...]
      (logical axis "layers", never sharded; `models.stacked`) and a cache-free call runs
      them under `jax.lax.scan` -- two scans with a partial remat, the rematerialised
      blocks then the rest -- so a program compiles one block, whatever the depth.
      False: a list of L blocks run by a Python loop (per-layer parameters
      `blocks/<i>/...`, the layout of checkpoints before 2026-12-05; the decode copy's
      layout, and the oracle the scan is tested against).
    attention_impl: "dense" (`jax.nn.dot_product_attention` with a [B, 1,
      T, S] mask: T x S scores per layer), "blocked" (`attention.
      blocked_attention`: key blocks with an online softmax and its own
      backward, O(T x attention_block) memory) or "auto": blocked for a
      multi-token call whose key length S >= 4 * attention_block, dense
      otherwise (short sequences and one-token decode steps).
    attention_block: keys per block of the blocked path (and, rounded down to a multiple
      of 128, the splash kernel's block).
    attention_kernel: the cache-free causal self-attention of the train passes (packed or
      padded rows): "auto" (jax's Pallas splash kernel where it runs: TPU, with one line
      when it refuses the shapes; the pure-JAX path of `attention_impl` on CPU and GPU),
      "jax" (always the pure-JAX path) or "tpu" (the kernel; an error where it cannot run).
    collective_matmul: in a cache-free call (the train passes; scanned or looped blocks) on
      an activation mesh with a tensor axis > 1, the residual stream split over `tensor` on
      positions between blocks and each block's projections as ring collective matmuls in
      shard_maps manual over `tensor`, whose transfers overlap the products
      (`models.sequence_parallel`); the same values as the partitioned block. Where the
      call does not divide over the mesh, the partitioned block, with one line saying why.
    lora_rank: r of the LoRA adapters (`models.lora`); 0: none.
    lora_alpha: adapters are scaled by lora_alpha / lora_rank.
    lora_targets: the adapted projections, of q, k, v, o, gate, up, down.
    model_type: HF model_type ("qwen2", "qwen3", "llama").
    real_vocab_size: tokens the tokenizer knows (<= vocab_size), if known.
    max_position_embeddings: written back to config.json.
    bos_token_id, eos_token_id, pad_token_id: passed through to config.json.
  """
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int | None = None
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  qkv_bias: bool = False
  qk_norm: bool = False
  mlp_bias: bool = False
  o_bias: bool = False
  tie_word_embeddings: bool = False
  param_dtype: Any = jnp.float32
  dtype: Any = jnp.float32
  remat: bool = False
  remat_layers: int = -1
  remat_selective: int = 0
  scan_layers: bool = True
  attention_impl: str = "auto"
  attention_block: int = 512
  attention_kernel: str = "auto"
  collective_matmul: bool = False
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ()
  model_type: str = "qwen2"
  real_vocab_size: int | None = None
  max_position_embeddings: int = 32768
  bos_token_id: Any = None
  eos_token_id: Any = None
  pad_token_id: Any = None

  def __post_init__(self):
    if self.head_dim is None:
      if self.hidden_size % self.num_heads:
        raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                         f"num_heads={self.num_heads}; set head_dim.")
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                       f"num_kv_heads={self.num_kv_heads}.")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE.")
    if self.attention_impl not in ("auto", "dense", "blocked"):
      raise ValueError(f"attention_impl={self.attention_impl!r}; allowed: "
                       "'auto', 'dense', 'blocked'.")
    if self.attention_kernel not in ("auto", "jax", "tpu"):
      raise ValueError(f"attention_kernel={self.attention_kernel!r}; allowed: "
                       "'auto', 'jax', 'tpu'.")
    if self.attention_block < 1:
      raise ValueError(f"attention_block={self.attention_block} must be >= 1.")
    if not 0 <= self.remat_selective <= self.num_remat:
      raise ValueError(f"remat_selective={self.remat_selective}: between 0 and the "
                       f"{self.num_remat} rematerialised blocks (remat={self.remat}, "
                       f"remat_layers={self.remat_layers}, num_layers={self.num_layers}).")
    object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
    unknown = set(self.lora_targets) - set(LORA_TARGETS)
    if self.lora_rank < 0 or unknown:
      raise ValueError(f"lora_rank={self.lora_rank} (>= 0), lora_targets="
                       f"{self.lora_targets}: targets are of {LORA_TARGETS}.")
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling",
                         tuple(sorted(self.rope_scaling.items())))
    if self.rope_scaling is not None:
      kind = dict(self.rope_scaling).get("rope_type", "default")
      if kind not in ("llama3", "linear", "default"):
        raise ValueError(f"Unsupported rope_type {kind!r}; supported: "
                         "'default', 'linear', 'llama3'.")
    for field in ("param_dtype", "dtype"):
      v = getattr(self, field)
      if isinstance(v, str):
        if v not in _DTYPES:
          raise ValueError(f"{field}={v!r}; allowed: {sorted(_DTYPES)}.")
        object.__setattr__(self, field, _DTYPES[v])
    if (self.real_vocab_size is not None
        and self.real_vocab_size > self.vocab_size):
      raise ValueError(f"real_vocab_size={self.real_vocab_size} exceeds "
                       f"vocab_size={self.vocab_size}.")

  def remats(self, layer: int) -> bool:
    """Whether block `layer` is rematerialised in the backward pass."""
    return self.remat and (self.remat_layers < 0 or layer < self.remat_layers)

  def remat_kind(self, layer: int) -> str | None:
    """Block `layer`'s backward: "full" (recomputes its forward from its input),
    "selective" (keeps its matmul outputs) or None (keeps its activations)."""
    n = self.num_remat
    if layer >= n:
      return None
    return "full" if layer < n - self.remat_selective else "selective"

  @property
  def num_remat(self) -> int:
    """How many blocks (the first ones) are rematerialised: N of `remats`."""
    if not self.remat:
      return 0
    return self.num_layers if self.remat_layers < 0 else min(self.remat_layers,
                                                               self.num_layers)

  @property
  def rope(self) -> dict[str, Any]:
    return dict(self.rope_scaling or ())

  @property
  def num_params(self) -> int:
    """Parameter count (embedding and head counted once if tied)."""
    d, f, h, k, dh = (self.hidden_size, self.intermediate_size,
                      self.num_heads, self.num_kv_heads, self.head_dim)
    attn = d * dh * (h + 2 * k) + h * dh * d
    if self.qkv_bias:
      attn += dh * (h + 2 * k)
    if self.qk_norm:
      attn += 2 * dh
    per_layer = attn + 3 * d * f + 2 * d
    emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * per_layer + emb + d

  def blocked_attention(self, t: int, s: int) -> bool:
    """Whether a call with T=t queries and S=s keys takes the blocked path."""
    if t < 2 or self.attention_impl == "dense":
      return False
    return self.attention_impl == "blocked" or s >= 4 * self.attention_block

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_hf(cls, hf: dict[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from an HF `config.json` dict.

    Accepts both the transformers-4 keys (`rope_theta`, `rope_scaling`) and
    the transformers-5 `rope_parameters` dict.

    Args:
      hf: the parsed config.json.
      **overrides: fields to set after parsing (e.g. dtype, remat).

    Returns:
      The config. Raises ValueError for an unsupported architecture.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED:
      raise ValueError(
          f"Unsupported architecture model_type={model_type!r} "
          f"(architectures={hf.get('architectures')}); vapo_jax supports "
          f"{sorted(SUPPORTED)}.")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
      raise ValueError(f"hidden_act={act!r} is not supported (only 'silu').")
    if hf.get("use_sliding_window"):
      raise ValueError("use_sliding_window=True is not supported.")
    _, qkv_bias, qk_norm = SUPPORTED[model_type]
    if model_type in ("llama", "qwen3"):
      qkv_bias = bool(hf.get("attention_bias", False))
    rope = dict(hf.get("rope_parameters") or {})
    if hf.get("rope_scaling"):
      rope.update(hf["rope_scaling"])
    if "type" in rope and "rope_type" not in rope:
      rope["rope_type"] = rope.pop("type")
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", "default")
    scaling = None if rope_type == "default" else rope
    kw = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim"),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=scaling,
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        o_bias=bool(hf.get("attention_bias", False)) and model_type == "llama",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        model_type=model_type,
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
    )
    kw.update(overrides)
    return cls(**kw)

  def to_hf(self, architecture: str | None = None) -> dict[str, Any]:
    """An HF config.json dict (transformers-5 style `rope_parameters`)."""
    arch = architecture or SUPPORTED[self.model_type][0]
    rope = {"rope_theta": self.rope_theta, "rope_type": "default"}
    rope.update(self.rope)
    out = {
        "architectures": [arch],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "rope_parameters": rope,
        "rope_theta": self.rope_theta,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "dtype": _dtype_name(self.param_dtype),
        "bos_token_id": self.bos_token_id,
        "eos_token_id": self.eos_token_id,
        "pad_token_id": self.pad_token_id,
        "use_cache": True,
    }
    if self.rope_scaling:  # transformers-4 readers look here
      out["rope_scaling"] = dict(self.rope_scaling)
    if self.model_type in ("llama", "qwen3"):
      out["attention_bias"] = self.qkv_bias
    if self.model_type == "llama":
      out["mlp_bias"] = self.mlp_bias
    if self.model_type in ("qwen2", "qwen3"):
      out["use_sliding_window"] = False
    return out


def tiny_config(vocab_size: int = 40, **kw) -> ModelConfig:
  """A small Qwen2-style config for CPU tests (hidden 128, 2 layers)."""
  base = dict(vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
              num_layers=2, num_heads=4, num_kv_heads=2, qkv_bias=True,
              tie_word_embeddings=True, max_position_embeddings=4096)
  base.update(kw)
  return ModelConfig(**base)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Forward matmul FLOPs per token (2 x multiply-adds), incl. attention.

  Training (forward + backward) is 3x this. The attention term counts the
  full T x T score and value products (no causal saving), as in PaLM's MFU.
  """
  d, f, h, k, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                    cfg.num_kv_heads, cfg.head_dim)
  per_layer = 2 * (d * dh * (h + 2 * k) + h * dh * d + 3 * d * f)
  per_layer += 2 * 2 * seq_len * h * dh
  return cfg.num_layers * per_layer + 2 * d * cfg.vocab_size
