"""Parity of vapo_jax.models with transformers (PyTorch, CPU), HF I/O."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vapo_jax.models import forward_logits  # noqa: E402
from vapo_jax.models import hf_io  # noqa: E402
from vapo_jax.models import safetensors_io  # noqa: E402
import tiny_hf  # noqa: E402


def _ours(model, tokens, mask):
  return np.asarray(forward_logits(model, jnp.asarray(tokens),
                                   jnp.asarray(mask)))


@pytest.fixture(scope="module", params=tiny_hf.FAMILIES)
def ckpt(request, tmp_path_factory):
  path = str(tmp_path_factory.mktemp(request.param))
  model = tiny_hf.make_model(request.param)
  model.save_pretrained(path)
  return request.param, path, model


@pytest.mark.parametrize("padded,attention,t", [
    (False, "auto", 9), (True, "auto", 9), (True, "blocked", 9),
    # T = 200: the dense path in 3 causal query blocks (attention.causal_dense_attention).
    (True, "dense", 200)])
def test_logits_match_transformers(ckpt, padded, attention, t):
  _, path, ref_model = ckpt
  tokens, mask, positions = tiny_hf.batch(t=t)
  if not padded:
    mask = np.ones_like(mask)
    positions = np.broadcast_to(np.arange(mask.shape[1]), mask.shape)
  ref = tiny_hf.torch_logits(ref_model, tokens, mask, positions)
  # attention="blocked": the memory-efficient path, in blocks of 3 keys.
  model, _ = hf_io.from_pretrained(path, attention_impl=attention, attention_block=3)
  ours = _ours(model, tokens, mask)
  err = np.abs(ours - ref)[mask == 1].max()
  assert err <= 1e-4, err
  assert np.all(np.isfinite(ours))


def test_save_then_transformers_reload(ckpt, tmp_path):
  family, path, ref_model = ckpt
  model, cfg = hf_io.from_pretrained(path)
  out = str(tmp_path / "saved")
  hf_io.save_pretrained(model, cfg, out)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  tokens, mask, positions = tiny_hf.batch(seed=1)
  a = tiny_hf.torch_logits(ref_model, tokens, mask, positions)
  b = tiny_hf.torch_logits(reloaded, tokens, mask, positions)
  np.testing.assert_array_equal(a, b)
  if family == "qwen2_tied":
    assert not os.path.exists(os.path.join(out, "model.safetensors")) or (
        "lm_head.weight" not in safetensors_io.SafetensorsFile(
            os.path.join(out, "model.safetensors")).keys())


def test_sharded_save_and_load_roundtrip(tmp_path):
  model, cfg = hf_io.from_pretrained(_make(tmp_path, "qwen3"))
  out = str(tmp_path / "sharded")
  hf_io.save_pretrained(model, cfg, out, max_shard_bytes=20_000)
  index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
  assert len(set(index["weight_map"].values())) > 1
  again, _ = hf_io.from_pretrained(out)
  tokens, mask, _ = tiny_hf.batch()
  np.testing.assert_array_equal(_ours(model, tokens, mask),
                                _ours(again, tokens, mask))
  # transformers reads the sharded directory too.
  hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  _, _, positions = tiny_hf.batch()
  ref = tiny_hf.torch_logits(hf, tokens, mask, positions)
  assert np.abs(_ours(again, tokens, mask) - ref)[mask == 1].max() <= 1e-4


def test_bfloat16_checkpoint_loads(tmp_path):
  ref_model = tiny_hf.make_model("qwen2")
  path = str(tmp_path / "bf16")
  ref_model.to(torch.bfloat16).save_pretrained(path)
  model, cfg = hf_io.from_pretrained(path, param_dtype=jnp.bfloat16)
  assert model.embed[...].dtype == jnp.bfloat16
  # A fresh float32 reference (casting back would keep a bf16-rounded RoPE
  # inv_freq buffer in the torch model).
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval()
  tokens, mask, positions = tiny_hf.batch()
  ref = tiny_hf.torch_logits(ref_model, tokens, mask, positions)
  f32, _ = hf_io.from_pretrained(path)  # bf16 weights upcast exactly
  assert np.abs(_ours(f32, tokens, mask) - ref)[mask == 1].max() <= 1e-4
  ours = _ours(model, tokens, mask)
  assert np.abs(ours - ref)[mask == 1].max() < 0.1
  del cfg


def _make(tmp_path, family):
  path = str(tmp_path / family)
  tiny_hf.make_model(family).save_pretrained(path)
  return path


def test_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    hf_io.from_pretrained(str(tmp_path / "nope"))
  path = _make(tmp_path, "qwen2")
  cfg = json.load(open(os.path.join(path, "config.json")))

  bad = tmp_path / "arch"
  bad.mkdir()
  json.dump({**cfg, "model_type": "gpt2"}, open(bad / "config.json", "w"))
  with pytest.raises(ValueError, match="Unsupported architecture"):
    hf_io.from_pretrained(str(bad))

  empty = tmp_path / "empty"
  empty.mkdir()
  json.dump(cfg, open(empty / "config.json", "w"))
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf_io.from_pretrained(str(empty))

  f = safetensors_io.SafetensorsFile(os.path.join(path, "model.safetensors"))
  tensors = {k: np.array(f.array(k)) for k in f.keys()}

  def write(name, tensors, config=cfg):
    d = tmp_path / name
    d.mkdir()
    json.dump(config, open(d / "config.json", "w"))
    safetensors_io.write(str(d / "model.safetensors"), tensors)
    return str(d)

  gone = dict(tensors)
  del gone["model.layers.1.self_attn.k_proj.bias"]
  with pytest.raises(ValueError, match="(?s)missing tensors:.*k_proj.bias"):
    hf_io.from_pretrained(write("missing", gone))
  extra = {**tensors, "model.layers.9.mlp.up_proj.weight": np.zeros(3)}
  with pytest.raises(ValueError, match="(?s)unexpected tensors.*layers.9"):
    hf_io.from_pretrained(write("extra", extra))
  with pytest.raises(ValueError, match="(?s)shape mismatches:.*gate_proj"):
    hf_io.from_pretrained(write("shape", tensors,
                                {**cfg, "intermediate_size": 48}))


def test_load_tokenizer_with_chat_template(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  vocab = {"<pad>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "user": 3,
           "hello": 4, "assistant": 5, "[UNK]": 6}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.add_special_tokens(["<pad>", "<|im_start|>", "<|im_end|>"])
  tok.save(str(tmp_path / "tokenizer.json"))
  template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} "
              "{{ m['content'] }} <|im_end|> {% endfor %}")
  json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
             "chat_template": template, "pad_token": "<pad>"},
            open(tmp_path / "tokenizer_config.json", "w"))
  loaded = hf_io.load_tokenizer(str(tmp_path))
  text = loaded.apply_chat_template([{"role": "user", "content": "hello"}],
                                    tokenize=False)
  assert text == "<|im_start|> user hello <|im_end|> "
  assert loaded(text)["input_ids"] == [1, 3, 4, 2]
  assert hf_io.read_chat_template(str(tmp_path)) == template
  with pytest.raises(FileNotFoundError):
    hf_io.load_tokenizer(str(tmp_path / "missing"))
