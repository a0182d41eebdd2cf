"""An HF base model in, trained, and out again, as users run it: `python -m vapo_jax.main`
with `model.hf_path` and the HF tokenizer, then `python -m vapo_jax.tools.export`."""

import json
import os
import subprocess
import sys

import numpy as np

import tiny_hf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
SHORT = ["--config=configs/tiny.py", "--noprogress", "--config.sft.steps=3",
         "--config.sft.batch_size=8", "--config.value_pretrain.max_steps=1",
         "--config.value_pretrain.min_steps=1", "--config.rl.steps=2",
         "--config.rl.prompts_per_step=4", "--config.rl.responses_per_prompt=2",
         "--config.eval.num_examples=4", "--config.eval.batch_prompts=4",
         "--config.data.num_train=64", "--config.data.num_eval=4",
         "--config.metrics.tensorboard=False", "--config.metrics.plot=False"]


def _run(*args):
  out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  return out


def test_hf_base_trains_and_exports_with_its_tokenizer(tmp_path):
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  base = tiny_hf.save_base(tmp_path / "base")
  model_flags = ["--config.model.tokenizer=hf", f"--config.model.hf_path={base}",
                 "--config.data.max_prompt_tokens=64",
                 "--config.data.chat_template=True"]
  workdir = tmp_path / "run"
  _run("vapo_jax.main", *SHORT, *model_flags, f"--workdir={workdir}")
  out = tmp_path / "exported"
  _run("vapo_jax.tools.export", *[f for f in SHORT if f != "--noprogress"], *model_flags,
       f"--workdir={workdir}", f"--out={out}")

  # The base's tokenizer files came along, and transformers reads them back.
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert os.path.exists(out / name), name
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  text = "What is 12 + 7?\n\\boxed{19}"
  assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
  want = transformers.AutoTokenizer.from_pretrained(base).apply_chat_template(
      [{"role": "user", "content": "1+1"}], tokenize=False, add_generation_prompt=True)
  assert tok.apply_chat_template([{"role": "user", "content": "1+1"}], tokenize=False,
                                 add_generation_prompt=True) == want

  # The exported weights are the trained ones: same architecture as the base, not equal to it,
  # and transformers runs them.
  with open(out / "config.json", encoding="utf-8") as f:
    assert json.load(f)["model_type"] == "qwen2"
  trained = transformers.AutoModelForCausalLM.from_pretrained(str(out)).float().eval()
  start = transformers.AutoModelForCausalLM.from_pretrained(base).float().eval()
  ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
  with torch.no_grad():
    a, b = trained(input_ids=ids).logits.numpy(), start(input_ids=ids).logits.numpy()
  assert np.all(np.isfinite(a)) and a.shape == b.shape
  assert np.max(np.abs(a - b)) > 1e-3
