"""Hub ids for checkpoints, critics and tokenizers, offline, from a Hub cache built on disk.

Two commits of one repo (different weights): `main` points at the second, tag `v1` at the
first. The loader must pick the snapshot the id names, and its weights must give the
logits transformers gives for that commit's model.
"""

import hashlib
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

from vapo_jax import critic as critic_lib  # noqa: E402
from vapo_jax import hub  # noqa: E402
from vapo_jax.models import forward_logits  # noqa: E402
from vapo_jax.models import hf_io  # noqa: E402
import hub_cache  # noqa: E402
import tiny_hf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = "tiny-org/tiny-qwen2"
SHA_V1 = hashlib.sha1(b"v1").hexdigest()
SHA_V2 = hashlib.sha1(b"v2").hexdigest()
@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  root = tmp_path_factory.mktemp("hub")
  models = {}
  for sha, seed, refs in ((SHA_V1, 1, ("v1",)), (SHA_V2, 2, ("main",))):
    src = root / f"src_{seed}"
    models[sha] = hub_cache.tiny_checkpoint(src, seed)
    hub_cache.add_snapshot(root / "cache", REPO, hub_cache.dir_files(src), sha, refs=refs,
                           not_downloaded=("pytorch_model.bin",))
  return root / "cache", models


@pytest.fixture
def offline(cache, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache[0]))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  return cache


def test_the_cache_is_one_huggingface_hub_reads(cache):
  info = huggingface_hub.scan_cache_dir(cache[0])
  assert not info.warnings, info.warnings
  (repo,) = info.repos
  assert repo.repo_id == REPO and repo.repo_type == "model"
  revisions = {r.commit_hash: set(r.refs) for r in repo.revisions}
  assert revisions == {SHA_V1: {"v1"}, SHA_V2: {"main"}}


def test_ids_resolve_offline_to_the_named_snapshot(offline, tmp_path):
  snapshots = os.path.join(offline[0], "models--tiny-org--tiny-qwen2", "snapshots")
  assert hub.resolve(REPO) == os.path.join(snapshots, SHA_V2)          # refs/main
  assert hub.resolve(f"{REPO}@v1") == os.path.join(snapshots, SHA_V1)  # a tag
  assert hub.resolve(f"{REPO}@{SHA_V1}") == os.path.join(snapshots, SHA_V1)  # a commit
  assert hub.resolve(str(tmp_path)) == str(tmp_path)                   # local dirs win
  assert hub.parse("Qwen/Qwen2.5-0.5B-Instruct@main") == ("Qwen/Qwen2.5-0.5B-Instruct", "main")
  assert hub.parse("/abs/dir") is None and hub.parse("./rel/dir") is None
  assert hub.parse("a/b/c") is None


def test_unknown_ids_offline_fail_with_one_line(offline):
  for spec in ("nobody/nothing", f"{REPO}@no-such-tag"):
    with pytest.raises(hub.HubError) as e:
      hub.resolve(spec)
    msg = str(e.value)
    assert "\n" not in msg and spec in msg and "HF_HUB_OFFLINE=1" in msg, msg
    assert "not (fully) in the Hub cache" in msg
  with pytest.raises(FileNotFoundError, match="does not exist"):
    hub.resolve("/no/such/checkpoint")


def test_checkpoint_critic_and_tokenizer_load_by_hub_id(offline):
  _, models = offline
  tokens, mask, positions = tiny_hf.batch(vocab=128)
  logits = {}
  for spec, sha in ((f"{REPO}@v1", SHA_V1), (REPO, SHA_V2)):
    model, cfg = hf_io.from_pretrained(spec)
    assert cfg.vocab_size == 128
    ours = np.asarray(forward_logits(model, jnp.asarray(tokens), jnp.asarray(mask)))
    ref = tiny_hf.torch_logits(models[sha], tokens, mask, positions)
    np.testing.assert_allclose(ours[mask == 1], ref[mask == 1], atol=2e-5, rtol=1e-4)
    logits[sha] = ours
  assert np.abs(logits[SHA_V1] - logits[SHA_V2]).max() > 1e-2  # the pin picked other weights

  critic, _ = critic_lib.Critic.from_pretrained(f"{REPO}@v1")
  assert float(jnp.abs(critic.score[...]).max()) == 0.0  # a causal LM: a fresh value head

  tok = hf_io.load_tokenizer(REPO)  # the same as from main's source directory
  local = hf_io.load_tokenizer(str(os.path.join(os.path.dirname(offline[0]), "src_2")))
  text = "what is two plus three ?"
  assert tok.encode(text, add_special_tokens=False) == local.encode(text,
                                                                   add_special_tokens=False)
  assert (len(tok), tok.eos_token_id, tok.pad_token_id) == (len(local), 2, 0)
  assert tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False) == text


def test_only_the_files_a_model_needs_are_asked_for(offline):
  """The repo also has pytorch_model.bin, which the snapshot lacks (as after a download with
  our allow_patterns): asking for the whole repo offline fails, asking for MODEL_FILES works."""
  with pytest.raises(hub.HubError, match="not \\(fully\\) in the Hub cache"):
    hub.resolve(REPO, allow_patterns=None)
  assert os.path.isfile(os.path.join(hub.resolve(REPO), "model.safetensors"))


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as a user's shell
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", **extra)
  return env


LIBTPU_LINES = ("host bounds", "TPU worker hostname", "unexpected worker hostname", "libtpu",
                "TPU backend")


def test_main_trains_from_hub_ids_offline(offline, tmp_path):
  """The whole pipeline with the policy and the critic named by Hub id, offline."""
  cache_dir, _ = offline
  cmd = [sys.executable, "-m", "vapo_jax.main", "--config=configs/tiny.py", "--noprogress",
         f"--workdir={tmp_path}", f"--config.model.hf_path={REPO}@v1",
         "--config.model.critic_start=path", f"--config.model.critic_path={REPO}",
         "--config.sft.steps=2",
         "--config.sft.batch_size=8", "--config.value_pretrain.max_steps=1",
         "--config.value_pretrain.min_steps=1", "--config.rl.steps=1",
         "--config.rl.prompts_per_step=4", "--config.rl.responses_per_prompt=2",
         "--config.rl.num_minibatches=1", "--config.sampling.max_new_tokens=16",
         "--config.eval.num_examples=4", "--config.eval.batch_prompts=4",
         "--config.data.num_train=32", "--config.data.num_eval=4",
         "--config.metrics.tensorboard=False", "--config.metrics.plot=False",
         "--config.checkpoint.save_critic=False"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache_dir)))
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads(out.stdout[out.stdout.index("{"):])
  assert {"eval_before_rl", "eval_after_rl"} <= set(summary)
  assert not [l for l in out.stderr.splitlines() if any(s in l for s in LIBTPU_LINES)], (
      out.stderr[-3000:])
