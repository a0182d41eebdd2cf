"""Row buckets of the decode chunk (`EngineConfig.decode_buckets`): each chunk decodes the
smallest bucket of rows (S, S/2, ...) that holds every occupied slot.

The oracle is the engine with one bucket (every chunk over all S slots). Tokens do not depend
on the slot (per-response PRNG), so a run over buckets must give the same tokens, log-probs,
and, since every live slot is in its chunk's rows, the same decode steps and chunks: a
bucket that dropped an occupied slot would stall it a chunk and add steps.
"""

import re

from flax import nnx
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vapo_jax import sharding  # noqa: E402
from vapo_jax.models import hf_io  # noqa: E402
from vapo_jax.sampler import continuous  # noqa: E402
from vapo_jax.sampler import slots as slots_lib  # noqa: E402
from vapo_jax.sampler.ops import SamplingConfig  # noqa: E402
import tiny_hf  # noqa: E402

PROMPTS = [[5, 17, 33, 2, 71, 8, 90, 41, 12], [3, 64, 28, 7], [50, 11, 9, 60, 21, 44], [77],
           [8, 8, 31], [60, 2, 19, 4, 4]]
R = 32
# 3 of 96 tokens stop: some responses end after a few tokens, about a third run to R.
CFG = SamplingConfig(max_new_tokens=R, temperature=1.3, stop_token_ids=(40, 7, 22), pad_id=0,
                     n_per_prompt=4, max_prompt_len=16, min_prompt_bucket=16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("qwen2"))
  tiny_hf.make_model("qwen2").save_pretrained(path)
  model, mcfg = hf_io.from_pretrained(path)
  graphdef, state = nnx.split(model)
  return graphdef, state, mcfg


def ecfg(**kw):
  base = dict(slots=8, page_size=4, kv_tokens=1024, chunk_steps=4, pages_per_block=2)
  return continuous.EngineConfig(**{**base, **kw})


def _run(ckpt, key, mesh=None, params=None, prompts=PROMPTS, **kw):
  graphdef, state, mcfg = ckpt
  eng = continuous.Engine(graphdef, mcfg, CFG, ecfg(**kw), mesh=mesh)
  out = jax.tree.map(np.asarray, eng(state if params is None else params, prompts, key))
  return out, dict(eng.last_stats), eng


def _assert_same_rollout(got, want):
  (out, st), (ref, ref_st) = got, want
  np.testing.assert_array_equal(out.response_BxR, ref.response_BxR)
  np.testing.assert_array_equal(out.lengths_B, ref.lengths_B)
  np.testing.assert_array_equal(out.truncated_B, ref.truncated_B)
  np.testing.assert_allclose(out.logp_BxR, ref.logp_BxR, atol=2e-5)
  for k in ("decode_steps", "decode_chunks", "slot_occupancy", "evictions", "prefills"):
    assert st[k] == ref_st[k], (k, st[k], ref_st[k])


def test_buckets_halve_the_rows_per_replica_and_drop_what_does_not_split():
  assert continuous.EngineConfig(slots=48, decode_buckets=4).bucket_rows == (48, 24, 12, 6)
  assert continuous.EngineConfig(slots=48, decode_buckets=9).bucket_rows == (
      48, 24, 12, 6, 3)
  assert continuous.EngineConfig(slots=16, decode_buckets=1).bucket_rows == (16,)
  assert continuous.EngineConfig(slots=3, decode_buckets=4).bucket_rows == (3,)
  assert continuous.EngineConfig(slots=8, replicas=4, decode_buckets=4).bucket_rows == (8, 4)
  assert continuous.EngineConfig(slots=24, replicas=2, decode_buckets=4).bucket_rows == (
      24, 12, 6)
  with pytest.raises(ValueError, match="decode_buckets"):
    continuous.EngineConfig(decode_buckets=0)


def test_chunk_rows_are_the_smallest_bucket_holding_each_replicas_occupied_slots():
  rows = slots_lib.chunk_rows
  occ = [False, True, False, False, False, False, False, False]
  assert rows(occ, 1, (8, 4, 2, 1)) == [1]
  assert rows(occ, 1, (8, 4)) == [0, 1, 2, 3]          # padded with the lowest idle slots
  occ = [True, False, True, False, False, True, False, False]
  assert rows(occ, 1, (8, 4, 2, 1)) == [0, 1, 2, 5]
  assert rows(occ, 1, (8,)) == list(range(8))          # one bucket: every slot in order
  assert rows([False] * 8, 1, (8, 4, 2)) == [0, 1]     # nothing occupied: the smallest
  # Two replicas of 4 slots: the busiest replica sets the bucket, each block keeps its own.
  occ = [True, False, False, False, False, False, True, False]
  assert rows(occ, 2, (8, 4, 2)) == [0, 6]
  occ = [True, True, True, False, False, False, False, True]
  assert rows(occ, 2, (8, 4, 2)) == list(range(8))
  occ = [True, True, False, False, False, False, False, True]
  assert rows(occ, 2, (8, 4, 2)) == [0, 1, 4, 7]


@pytest.mark.parametrize("overlap,kv_tokens", [(True, 1024), (False, 1024), (True, 16 + R + 3)],
                         ids=["overlap", "serial", "evicting"])
def test_buckets_sample_what_one_bucket_samples(ckpt, overlap, kv_tokens):
  # kv_tokens 16 + R + 3: one whole response plus a page, so responses are evicted.
  key = jax.random.key(7)
  want = _run(ckpt, key, overlap=overlap, kv_tokens=kv_tokens, decode_buckets=1)
  out, st, eng = _run(ckpt, key, overlap=overlap, kv_tokens=kv_tokens, decode_buckets=4)
  lens = want[0].lengths_B
  assert (lens < 8).any() and (lens == R).any(), lens  # a long tail: short and capped ones
  _assert_same_rollout((out, st), want[:2])
  assert eng.ecfg.bucket_rows == (8, 4, 2, 1)
  used = {n: st[f"decode_chunks_rows_{n}"] for n in (8, 4, 2, 1)}
  assert sum(used.values()) == st["decode_chunks"]
  assert used[2] + used[1] > 0, used  # the tail ran in small buckets
  assert want[1]["decode_chunks_rows_8"] == want[1]["decode_chunks"]
  assert want[1]["row_occupancy"] == pytest.approx(want[1]["slot_occupancy"])
  assert st["row_occupancy"] > st["slot_occupancy"], st  # fewer idle rows decoded
  if kv_tokens < 1024:  # a pool of one response: a few slots hold pages at a time
    assert st["evictions"] > 0
  else:
    assert used[8] > 0, used


def test_buckets_per_replica_on_a_mesh_sample_what_one_bucket_samples(ckpt):
  """4 decode replicas of 4 slots on a 2x2x2 mesh, with a pool that evicts: each replica's
  rows come from its own slots (its own pages), and the tokens are one bucket's."""
  graphdef, state, mcfg = ckpt
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  train = jax.device_put(state, sharding.state_shardings(state, mesh))
  key = jax.random.key(8)
  # 7 pages of 4 tokens per slot hold one whole response (16 + R - 1 = 47 tokens: 12 pages);
  # 16 pages per replica of 4 slots run short.
  kw = dict(slots=16, replicas=4, kv_tokens=4 * 4 * 16)
  want = _run(ckpt, key, mesh, train, decode_buckets=1, **kw)
  out, st, eng = _run(ckpt, key, mesh, train, decode_buckets=3, **kw)
  _assert_same_rollout((out, st), want[:2])
  assert eng.ecfg.bucket_rows == (16, 8, 4)
  assert st["evictions"] > 0
  assert st["decode_chunks_rows_4"] + st["decode_chunks_rows_8"] > 0, st
  del graphdef, mcfg


_COLLECTIVE = re.compile(r"^\s*(%\S+) = .*? (all-reduce|all-gather|collective-permute|all-to-all"
                         r"|reduce-scatter)(?:-start)?\(")


def _entry_graph(hlo: str) -> dict[str, set[str]]:
  """The compiled program's entry computation: instruction -> the instructions it reads."""
  body = hlo[hlo.index("\nENTRY"):]
  body = body[:body.index("\n}")]
  graph = {}
  for line in body.splitlines()[1:]:
    m = re.match(r"\s*(?:ROOT )?(%\S+) = (.*)", line)
    if m:
      graph[m.group(1)] = set(re.findall(r"%[\w.\-]+", m.group(2))) - {m.group(1)}
  return graph


def _reach(graph, start, forward):
  edges = graph if not forward else {
      n: {m for m, ins in graph.items() if n in ins} for n in graph}
  seen, todo = set(), [start]
  while todo:
    for nxt in edges.get(todo.pop(), ()):
      if nxt not in seen:
        seen.add(nxt)
        todo.append(nxt)
  return seen


def test_the_chunks_collectives_are_all_ordered_by_its_loop(ckpt):
  """In the compiled decode chunk on a mesh with replicas, every collective outside the
  decode loop is an input of the loop or reads its output. XLA's CPU runtime may run a
  collective that is neither before the loop's own collectives on one device and after
  them on another; across processes (gloo) that deadlocks. The row scatter once gathered
  its indices and the keys over the replicas apart from the loop, and 2-process runs hung
  (tests/cli/test_multihost.py)."""
  graphdef, state, mcfg = ckpt
  mesh = sharding.make_mesh(data=1, fsdp=2, tensor=2, devices=jax.devices()[:4])
  train = jax.device_put(state, sharding.state_shardings(state, mesh))
  eng = continuous.Engine(graphdef, mcfg, CFG, ecfg(slots=8, replicas=2, decode_buckets=2),
                          mesh=mesh)
  low = eng.lowerable(train)
  hlo = low["decode_chunk"].lower(*low["decode_chunk_args"]).compile().as_text()
  graph = _entry_graph(hlo)
  loops = [n for n in graph if re.search(rf"^\s*(?:ROOT )?{re.escape(n)} = .*? while\(",
                                         hlo, re.M)]
  assert len(loops) == 1, loops
  ordered = _reach(graph, loops[0], False) | _reach(graph, loops[0], True)
  entry = hlo[hlo.index("\nENTRY"):]
  entry = entry[:entry.index("\n}")]
  collectives = [m.group(1) for m in map(_COLLECTIVE.match, entry.splitlines()) if m]
  assert collectives, "no collective outside the loop: the mesh split nothing"
  loose = [c for c in collectives if c not in ordered]
  assert not loose, f"collectives apart from the decode loop: {loose}"


def test_every_bucket_is_compiled_before_the_first_chunk(ckpt):
  # The first call never fills 8 slots (4 responses), the second does: it compiles nothing.
  compiles = []

  def listener(event, _, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(1)

  key = jax.random.key(9)
  graphdef, state, mcfg = ckpt
  eng = continuous.Engine(graphdef, mcfg, CFG, ecfg(decode_buckets=3))
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    eng(state, PROMPTS[:1], key)
    first = dict(eng.last_stats)
    n = len(compiles)
    eng(state, PROMPTS, key)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert first["decode_chunks_rows_8"] == 0 and eng.last_stats["decode_chunks_rows_8"] > 0
  assert len(compiles) == n, len(compiles) - n


def test_decode_buckets_bench_runs(tmp_path):
  """benchmarks/decode_buckets.py end to end on its tiny preset (forced lengths checked)."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "buckets.json"
  res = subprocess.run(
      [sys.executable, os.path.join(root, "benchmarks", "decode_buckets.py"), "--preset=tiny",
       "--repeats=1", "--buckets=3", "--json", str(out)], cwd=root, capture_output=True,
      text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0"})
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
  got = json.loads(out.read_text())["results"]["tiny"]
  one, three = got["sides"]["1"], got["sides"]["3"]
  assert one["stats"]["decode_steps"] == three["stats"]["decode_steps"]
  assert one["chunks_per_bucket"] == {"8": one["stats"]["decode_chunks"]}
  assert three["chunks_per_bucket"]["2"] > 0, three
  assert got["ratios"]["b=3/b=1"]["median"] > 0
