"""The commands around a run: evaluate a checkpoint (avg@k, pass@k), export it to HF and
reload it in transformers with the same logits, plot one or several runs."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.run import eval_records
from vapo_jax.run import trainer as trainer_lib
from vapo_jax.models import forward_logits
from vapo_jax.tools import evaluate as evaluate_tool
from vapo_jax.tools import export as export_tool
from checkpoint_runs import compile_cache, small  # noqa: F401 (fixture)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("run"))
  cfg = small(**{"sft.enabled": False, "rl.steps": 2, "metrics.plot": True})
  t = trainer_lib.Trainer(cfg, workdir, progress=False)
  try:
    summary = t.run()
  finally:
    t.close()
  return cfg, workdir, summary


def test_evaluate_any_checkpoint(finished_run):
  cfg, workdir, summary = finished_run
  out = evaluate_tool.evaluate_checkpoint(cfg, workdir, "latest")
  assert out["stage"] == "done" and out["k"] == 2
  # The same sampler, checker, key and parameters as the run's own final evaluation.
  assert out["avg@2"] == summary["eval_after_rl"]["avg@2"]
  assert out["pass@2"] == summary["eval_after_rl"]["pass@2"]
  assert 0 <= out["avg@2"] <= out["pass@2"] <= 1
  assert json.load(open(os.path.join(workdir, "eval", f"step_{out['step']}.json")))["k"] == 2
  # Per-problem records: the run's own (RL steps 0 and 2) and the tool's, beside its JSON.
  run_recs = eval_records.read(eval_records.run_path(workdir, cfg.rl.steps))
  assert len(eval_records.read(eval_records.run_path(workdir, 0))) == out["num_problems"]
  assert np.mean([np.mean(r["correct"]) for r in run_recs]) == pytest.approx(out["avg@2"])
  assert out["records"] == os.path.join(workdir, "eval", f"step_{out['step']}.jsonl")
  assert eval_records.read(out["records"]) == run_recs
  assert out["shortcut/best"] >= out["shortcut/sum"] >= 0
  best = evaluate_tool.evaluate_checkpoint(cfg, workdir, "best")
  assert best["step"] == out["step"]  # the only checkpoint with a score


def test_export_policy_and_critic_reload_in_transformers(finished_run, tmp_path):
  cfg, workdir, _ = finished_run
  export_tool.export(cfg, workdir, str(tmp_path / "policy"))
  export_tool.export(cfg, workdir, str(tmp_path / "critic"), what="critic")
  t = trainer_lib.Trainer(cfg, workdir, progress=False, read_only=True)
  try:
    t.resume()
    policy = t.policy_model()
    critic = t.critic_model()
  finally:
    t.close()
  tokens = np.random.default_rng(0).integers(3, t.parts.text.vocab_size, (2, 12)).astype(np.int32)
  mask = np.ones_like(tokens, np.float32)
  ours = np.asarray(forward_logits(policy, jnp.asarray(tokens), jnp.asarray(mask)))
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "policy",
                                                          dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = hf(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)

  hf_critic = transformers.AutoModelForSequenceClassification.from_pretrained(
      tmp_path / "critic", dtype=torch.float32).eval()
  values = np.asarray(critic(jnp.asarray(tokens), jnp.asarray(mask)))  # V of every prefix
  with torch.no_grad():  # HF scores the whole sequence (its last token)
    score = hf_critic(torch.tensor(tokens, dtype=torch.long)).logits.numpy()[:, 0]
  np.testing.assert_allclose(values[:, -1], score, atol=2e-5, rtol=1e-4)
  head = t.state.train_state("critic").params["score"][...]
  assert np.abs(np.asarray(head)).max() > 0  # trained head


def test_plot_command_draws_runs_side_by_side(finished_run, tmp_path):
  pytest.importorskip("matplotlib")
  _, workdir, _ = finished_run
  assert os.path.getsize(os.path.join(workdir, trainer_lib.CURVES_PNG)) > 10_000
  out = tmp_path / "compare.png"
  proc = subprocess.run([sys.executable, "-m", "vapo_jax.tools.plot", workdir, workdir,
                         "--labels=a,b", f"--out={out}"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert out.stat().st_size > 10_000


def test_checkpoint_restores_onto_another_mesh(finished_run):
  """A run saved on one device restores, bit for bit, onto a 2 x 2 x 2 mesh."""
  cfg, workdir, _ = finished_run
  trees = []
  for mesh in ((1, 1, 1), (2, 2, 2)):
    c = small(**{"sft.enabled": False, "rl.steps": 2, "mesh.data": mesh[0],
                 "mesh.fsdp": mesh[1], "mesh.tensor": mesh[2]})
    t = trainer_lib.Trainer(c, workdir, progress=False, read_only=True)
    try:
      t.resume()
      trees.append(jax.device_get((t.state.train_state("policy"), t.state.train_state("critic"))))
      assert jax.tree.leaves(t.state.train_state("policy").params)[0].sharding.mesh.shape == dict(
          zip(("data", "fsdp", "tensor"), mesh))
    finally:
      t.close()
  for a, b in zip(jax.tree.leaves(trees[0]), jax.tree.leaves(trees[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
