"""Tiny random HF checkpoints (made with transformers) for parity tests."""

import numpy as np

FAMILIES = ("qwen2", "qwen2_tied", "qwen3", "llama3")


def hf_config(family: str):
  import transformers as tr  # pylint: disable=g-import-not-at-top
  base = dict(vocab_size=96, hidden_size=32, intermediate_size=64,
              num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-5)
  if family in ("qwen2", "qwen2_tied"):
    return tr.Qwen2Config(tie_word_embeddings=family == "qwen2_tied", **base)
  if family == "qwen3":
    return tr.Qwen3Config(head_dim=16, **base)
  if family == "llama3":
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=256)
    return tr.LlamaConfig(rope_parameters=rope, **base)
  raise ValueError(family)


def make_model(family: str, seq_cls: bool = False, seed: int = 0):
  """A random float32 transformers model; every weight perturbed."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers as tr  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  cfg = hf_config(family)
  if seq_cls:
    cfg.num_labels = 1
    cfg.pad_token_id = 0
    model = tr.AutoModelForSequenceClassification.from_config(cfg)
  else:
    model = tr.AutoModelForCausalLM.from_config(cfg)
  model = model.float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.add_(0.1 * torch.randn_like(p))
  return model


def batch(seed: int = 0, b: int = 3, t: int = 9, vocab: int = 96):
  """Tokens, a left-padded mask and positions (numpy)."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(0, vocab, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, :3] = 0
  mask[2, :5] = 0
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
  return tokens, mask, positions


def torch_logits(model, tokens, mask, positions):
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.numpy()
