"""Model shapes without weights: the architectures the compile check knows by name.

The compile check runs where the checkpoint is not (a CPU box, CI). It takes the policy's
`ModelConfig` from, in order: `--arch` (a name below or a `config.json` path), the config's
`model.hf_path/config.json` if present (a directory, or a Hub id's snapshot already in the Hub
cache: nothing is downloaded), the name at the end of `model.hf_path` (e.g.
"checkpoints/Qwen2.5-32B" or "Qwen/Qwen2.5-32B@main" → qwen2.5-32b), or the config's own small
model (no hf_path).
The entries are the fields of the published Hugging Face `config.json` files.
"""

from __future__ import annotations

import json
import os

from vapo_jax import hub
from vapo_jax.models.config import ModelConfig
from vapo_jax.pod import slices

_QWEN25 = {"model_type": "qwen2", "hidden_act": "silu", "rope_theta": 1000000.0,
           "max_position_embeddings": 32768, "bos_token_id": 151643,
           "eos_token_id": 151643}
QWEN25_TOKENS = 151665   # len(tokenizer): rows of the embedding a sample may take

KNOWN = {
    "qwen2.5-0.5b": {**_QWEN25, "hidden_size": 896, "intermediate_size": 4864,
                     "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-6,
                     "tie_word_embeddings": True},
    "qwen2.5-1.5b": {**_QWEN25, "hidden_size": 1536, "intermediate_size": 8960,
                     "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-6,
                     "tie_word_embeddings": True},
    "qwen2.5-7b": {**_QWEN25, "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "vocab_size": 152064, "rms_norm_eps": 1e-6,
                   "tie_word_embeddings": False, "max_position_embeddings": 131072},
    "qwen2.5-32b": {**_QWEN25, "hidden_size": 5120, "intermediate_size": 27648,
                    "num_hidden_layers": 64, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "vocab_size": 152064, "rms_norm_eps": 1e-5,
                    "tie_word_embeddings": False, "max_position_embeddings": 131072},
}


def _name_of(path: str) -> str | None:
  base = os.path.basename(os.path.normpath(path.split("@")[0])).lower()
  for suffix in ("-instruct", "-base"):
    base = base.removesuffix(suffix)
  return base if base in KNOWN else None


def _config_json(spec: str) -> str | None:
  """model.hf_path's config.json: in the directory or a cached Hub snapshot (no download)."""
  try:
    base = hub.resolve(spec, allow_patterns=("config.json",), local_only=True)
  except (OSError, ImportError):
    return None
  path = os.path.join(base, "config.json")
  return path if os.path.isfile(path) else None


def model_config(cfg, arch: str | None = None) -> ModelConfig:
  """The policy's ModelConfig for a `config.Config` (see the module docstring)."""
  m = cfg.model
  from vapo_jax.run import inputs, networks  # pylint: disable=import-outside-toplevel
  kw = {"param_dtype": m.param_dtype, "dtype": m.dtype, **networks.model_options(cfg)}
  hf = None
  if arch:
    if arch.lower() in KNOWN:
      hf = KNOWN[arch.lower()]
    elif os.path.isfile(arch):
      with open(arch, encoding="utf-8") as f:
        hf = json.load(f)
    else:
      raise ValueError(f"--arch={arch!r}: not a config.json file nor one of {sorted(KNOWN)}")
  elif m.hf_path and _config_json(m.hf_path):
    with open(_config_json(m.hf_path), encoding="utf-8") as f:
      hf = json.load(f)
  elif m.hf_path:
    name = _name_of(m.hf_path)
    if name is None:
      raise ValueError(f"model.hf_path={m.hf_path!r} has no config.json here and is not a "
                       f"known architecture {sorted(KNOWN)}; pass --arch")
    hf = KNOWN[name]
  if hf is not None:
    mcfg = ModelConfig.from_hf(hf, **kw)
    if mcfg.real_vocab_size is None and mcfg.model_type == "qwen2":
      mcfg = mcfg.replace(real_vocab_size=min(QWEN25_TOKENS, mcfg.vocab_size))
    return mcfg
  return networks.fresh_model_config(cfg, inputs.build_text(cfg))


def from_flags(f) -> tuple:
  """A pod command's opening: (config, the policy's ModelConfig, TPU slice) from its
  --config, --arch (`model_config`) and --topology (`slices.parse`) flags."""
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  cfg = config_lib.from_command_line(f.config)
  return cfg, model_config(cfg, f.arch), slices.parse(f.topology)
