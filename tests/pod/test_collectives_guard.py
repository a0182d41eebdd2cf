"""A guard on the train programs' collectives as a v5p compile makes them: a toy-size policy
step (the qwen32b layout: collective matmuls, every block rematerialised and half of them
selectively, packed rows, FSDP × TP2) AOT-compiled for v5p:2x2x2 with libtpu, its
collectives per micro-batch and per call (`pod.train_hlo.split`) compared with the stamped
expectation in `collectives_toy_v5p.json` for this jax and libtpu. A regression like the LM
head's (its gradient all-reduced in every chunk, found a day late on 2026-12-06) fails here
on the day it lands: `test_the_guard_fails_on_the_lm_head_regression` builds that mutant.

A new jax or libtpu compiles other programs: remake the expectation with
`python tests/pod/test_collectives_guard.py` (it keeps the other versions' entries) and read
the diff before committing it.
"""

import json
import os
import sys

import pytest

from vapo_jax import sharding as shd
from vapo_jax.pod import archs
from vapo_jax.pod import slices
from vapo_jax.pod import stamp
from vapo_jax.pod import train_hlo

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]   # run as a script too (conftest does this)
from tpu_aot import NEEDS_LIBTPU  # noqa: E402  pylint: disable=wrong-import-position
from test_step_model import _config  # noqa: E402  pylint: disable=wrong-import-position

EXPECT = os.path.join(_HERE, "collectives_toy_v5p.json")
SLICE = "v5p:2x2x2"
# R = 288 response positions: three LM-head chunks of 128 per row.
TOY = {"model.hidden_size": 64, "model.intermediate_size": 128, "model.num_layers": 2,
       "model.num_heads": 4, "model.num_kv_heads": 2, "model.head_dim": 16,
       "model.remat": True, "model.remat_layers": -1, "model.remat_selective": 1,
       "model.collective_matmul": True, "model.scan_layers": False,
       "data.max_prompt_tokens": 32, "sampling.max_new_tokens": 288,
       "rl.prompts_per_step": 8, "rl.responses_per_prompt": 2, "rl.micro_batch_size": 4,
       "eval.batch_prompts": 4, "eval.samples_per_problem": 2,
       "sampling.prompts_per_call": 4, "mesh.tensor": 2}


def version_key() -> str:
  v = stamp.versions()
  return f"jax {v['jax']}, libtpu {v['libtpu']}"


def compiled(mutant: bool = False) -> dict:
  """The toy policy step's collectives on v5p:2x2x2 (`train_hlo.Split.as_dict`); mutant:
  the LM head's chunk loop left to the partitioner (`policy.chunked_logprobs` without its
  shard_map), which all-reduces the head's gradient in every chunk."""
  from vapo_jax import policy  # pylint: disable=import-outside-toplevel
  cfg = _config(**TOY)
  mcfg = archs.model_config(cfg)
  mesh = shd.make_mesh(1, -1, 2, devices=slices.devices(slices.parse(SLICE)))
  saved = policy.activation_mesh
  if mutant:
    policy.activation_mesh = lambda: None
  try:
    text = train_hlo.compile_texts(cfg, mcfg, mesh, ("policy_step",),
                                   log=lambda *a, **k: None)["policy_step"]
  finally:
    policy.activation_mesh = saved
  out = train_hlo.split(text).as_dict()
  out.pop("probes")
  return {"stamp": stamp.make(cfg, mcfg, SLICE, "train_collectives"), "policy_step": out}


def differences(got: dict, want: dict) -> list[str]:
  """'part.field: got vs want' for every figure that differs (bytes to 1e-6)."""
  out = []
  for part in ("per_trip", "per_call", "kinds"):
    g, w = got[part], want[part]
    for k in sorted(set(g) | set(w)):
      a, b = g.get(k, 0.0), w.get(k, 0.0)
      if abs(a - b) > 1e-6 * max(abs(a), abs(b), 1.0):
        out.append(f"{part}.{k}: {a:g} vs {b:g} expected")
  return out


def _expected() -> dict:
  with open(EXPECT, encoding="utf-8") as f:
    table = json.load(f)
  key = version_key()
  if key not in table:
    pytest.fail(f"no expectation for {key} in {EXPECT} (it has: {', '.join(table)}); make "
                "it with `python tests/pod/test_collectives_guard.py` and read its diff")
  return table[key]


@pytest.mark.floor
@NEEDS_LIBTPU
def test_the_toy_policy_steps_collectives_are_as_stamped():
  want = _expected()
  got = compiled()
  # The expectation was made from the same settings (else it is stale, not a regression).
  assert got["stamp"]["digest"] == want["stamp"]["digest"], stamp.differences(
      want["stamp"]["settings"], got["stamp"]["settings"])
  diff = differences(got["policy_step"], want["policy_step"])
  assert not diff, "the toy policy step's collectives changed: " + "; ".join(diff)


@NEEDS_LIBTPU
def test_the_guard_fails_on_the_lm_head_regression():
  want = _expected()["policy_step"]
  got = compiled(mutant=True)["policy_step"]
  diff = differences(got, want)
  assert diff
  # The regression's own signature: more all-reduces per micro-batch, exposed.
  assert got["kinds"]["all-reduce"] > want["kinds"]["all-reduce"]
  assert got["per_trip"]["exposed_wire"] > want["per_trip"]["exposed_wire"]


if __name__ == "__main__":   # remake this jax and libtpu's expectation
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  table = {}
  if os.path.exists(EXPECT):
    with open(EXPECT, encoding="utf-8") as fh:
      table = json.load(fh)
  table[version_key()] = compiled()
  with open(EXPECT, "w", encoding="utf-8") as fh:
    json.dump(table, fh, indent=1, sort_keys=True)
  print(f"{EXPECT}: {version_key()}: "
        + json.dumps(table[version_key()]["policy_step"]["kinds"]))
