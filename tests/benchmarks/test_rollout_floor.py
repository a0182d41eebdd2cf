"""benchmarks/rollout_floor.py: the floor's arithmetic on a hand-worked case and against a
token-by-token recount, and a smoke run on the tiny config (that it runs and what it writes,
not its figures)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import rollout_floor
from vapo_jax.models import config as model_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SMOLLM2 = model_config.ModelConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, qkv_bias=False, tie_word_embeddings=True)


def test_model_terms_of_smollm2():
  t = rollout_floor.model_terms(SMOLLM2, 4)
  # every parameter but the norms' gains is a matmul weight; the tied embedding is the head
  assert t["matmul_params"] == SMOLLM2.num_params - 2 * 576 * 30 - 576
  assert t["weights_bytes"] == 4 * SMOLLM2.num_params
  assert t["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
  assert t["attn_flops_per_ctx"] == 4 * 30 * 9 * 64
  assert rollout_floor.model_terms(SMOLLM2, 2)["weights_bytes"] == 2 * SMOLLM2.num_params


def test_a_hand_worked_floor():
  terms = {"weights_bytes": 100.0, "matmul_params": 10.0, "kv_bytes_per_token": 2.0,
           "attn_flops_per_ctx": 1.0}
  # one prompt of 3 tokens, two responses of 2 and 1 tokens; bandwidth 10 B/s, 1 FLOP/s
  f = rollout_floor.floor_seconds(terms, [3], [3, 3], [2, 1], flops_peak=1.0, bw_peak=10.0)
  # prefill: max(100 / 10, 2·10·3 + 0.5·1·9) = 64.5
  # step 0: both live, context 3 + 3: max((100 + 2·6) / 10, 2·10·2 + 6) = 46
  # step 1: the first only, context 3 + 1: max((100 + 2·4) / 10, 2·10·1 + 4) = 24
  assert f == pytest.approx({"prefill_s": 64.5, "decode_s": 70.0, "floor_s": 134.5,
                             "decode_steps": 2})
  # bytes-bound: a fast matmul peak leaves the weights' and caches' bytes
  g = rollout_floor.floor_seconds(terms, [3], [3, 3], [2, 1], flops_peak=1e9, bw_peak=10.0)
  assert g["decode_s"] == pytest.approx(11.2 + 10.8)


def test_the_floor_equals_a_token_by_token_recount():
  terms = rollout_floor.model_terms(SMOLLM2, 4)
  prompts, lengths = [70, 90, 81], [5, 64, 1, 33, 64, 12]
  rp = [prompts[b // 2] for b in range(len(lengths))]
  f = rollout_floor.floor_seconds(terms, prompts, rp, lengths, 3e11, 2.5e10)
  dec = 0.0
  for step in range(max(lengths)):
    nbytes, flops = terms["weights_bytes"], 0.0
    for p, n in zip(rp, lengths):
      if step < n:  # this response computes its token `step`
        nbytes += (p + step) * terms["kv_bytes_per_token"]
        flops += 2 * terms["matmul_params"] + terms["attn_flops_per_ctx"] * (p + step)
    dec += max(nbytes / 2.5e10, flops / 3e11)
  assert f["decode_s"] == pytest.approx(dec, rel=1e-12)
  assert f["decode_steps"] == 64


def test_tiny_run_writes_each_engine_and_its_share(tmp_path):
  path = tmp_path / "floor.json"
  # one CPU device, as a user's run (the suite's 8 fake devices would shard the tiny config)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0", "XLA_FLAGS": ""}
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "rollout_floor.py"),
                        "--tiny", "--rounds=1", f"--json={path}"], env=env, check=True,
                       capture_output=True, text=True, timeout=600).stdout
  assert "engine, float32 decode copy" in out and "of the floor" in out
  res = json.loads(path.read_text())["results"]
  assert set(res["engines"]) == {"float32", "bfloat16"}
  for e in res["engines"].values():
    assert len(e["seconds"]) == len(e["floors"]) == 1
    assert 0.0 < e["share"][0] < 1.0
    assert e["floors"][0]["decode_steps"] == max(e["lengths"][0])
