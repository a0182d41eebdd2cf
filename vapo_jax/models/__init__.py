"""Decoder-only transformers (Qwen2/2.5, Qwen3, Llama 3), HF checkpoint I/O."""

from vapo_jax.models.config import ModelConfig, tiny_config
from vapo_jax.models.transformer import (KVCache, Transformer, forward_logits,
                                         init_cache, init_sharded,
                                         positions_from_mask)

__all__ = [
    "KVCache",
    "ModelConfig",
    "Transformer",
    "forward_logits",
    "init_cache",
    "init_sharded",
    "positions_from_mask",
    "tiny_config",
]
