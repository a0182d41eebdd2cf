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


def save_base(path, family: str = "qwen2", seed: int = 0) -> str:
  """A tiny HF base model directory as users download one: weights, config, a byte-level BPE
  tokenizer with one token per character and no merges (so transformers' Qwen2 tokenizer class
  rebuilds it exactly), `<|endoftext|>` as eos and pad, and a chat template.

  The vocabulary covers the synthetic task's alphabet, so `configs/tiny.py` runs on it with
  `model.tokenizer="hf"`.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers as tr  # pylint: disable=g-import-not-at-top
  from vapo_jax.data.tokenizer import DEFAULT_ALPHABET  # pylint: disable=g-import-not-at-top
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  byte_char = _bytes_to_unicode()
  vocab = {t: i for i, t in enumerate(specials + [byte_char[ord(c)] for c in DEFAULT_ALPHABET])}
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.add_special_tokens(specials)
  fast = tr.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                    pad_token="<|endoftext|>")
  fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                        "<|im_start|>assistant\n{% endif %}")
  fast.save_pretrained(str(path))
  cfg = hf_config(family)
  cfg.vocab_size = -(-len(vocab) // 16) * 16
  cfg.eos_token_id = cfg.pad_token_id = 0
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  model = tr.AutoModelForCausalLM.from_config(cfg).float().eval()
  model.save_pretrained(str(path))
  return str(path)


def _bytes_to_unicode() -> list[str]:
  """GPT-2's byte -> printable character table, in byte order (byte-level BPE vocabularies)."""
  bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1)))
  cs, n = bs[:], 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  table = dict(zip(bs, cs))
  return [chr(table[b]) for b in range(256)]
