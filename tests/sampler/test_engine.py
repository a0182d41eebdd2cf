"""The continuous-batching rollout engine against the static sampler and transformers."""

import random

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vapo_jax import sharding  # noqa: E402
from vapo_jax.models import hf_io  # noqa: E402
from vapo_jax.sampler import continuous  # noqa: E402
from vapo_jax.sampler import decode_weights  # noqa: E402
from vapo_jax.sampler import static as static_lib  # noqa: E402
from vapo_jax.sampler import paged  # noqa: E402
from vapo_jax.sampler import slots as slots_lib  # noqa: E402
from vapo_jax.sampler import types  # noqa: E402
from vapo_jax.sampler.ops import SamplingConfig  # noqa: E402
import test_sampler_hf as hf  # noqa: E402
import tiny_hf  # noqa: E402

PROMPTS = hf.PROMPTS
R = hf.R


def _load(family, tmp_path_factory):
  path = str(tmp_path_factory.mktemp(family))
  model = tiny_hf.make_model(family)
  model.save_pretrained(path)
  jmodel, mcfg = hf_io.from_pretrained(path)
  graphdef, state = nnx.split(jmodel)
  return model, graphdef, state, mcfg


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return _load("qwen2", tmp_path_factory)


@pytest.fixture(scope="module", params=[pytest.param("qwen2", marks=pytest.mark.floor),
                                        "qwen2_tied", "qwen3"])
def any_ckpt(request, tmp_path_factory):
  return _load(request.param, tmp_path_factory)


def np_tree(x):
  return jax.tree.map(np.asarray, x)


def ecfg(**kw):
  base = dict(slots=3, page_size=4, kv_tokens=64, chunk_steps=4, pages_per_block=2)
  return continuous.EngineConfig(**{**base, **kw})


def test_greedy_equals_static_sampler_and_transformers(any_ckpt):
  hf_model, graphdef, state, mcfg = any_ckpt
  free = hf.hf_greedy(hf_model, PROMPTS, ())
  eos = (int(free[0, 3]), int(free[2, 6]))
  want = hf.hf_greedy(hf_model, PROMPTS, eos)
  cfg = hf.greedy_cfg(eos, n=2)
  static = np_tree(static_lib.Sampler.for_transformer(graphdef, mcfg, cfg)(
      state, PROMPTS, jax.random.key(0)))
  eng = continuous.Engine(graphdef, mcfg, cfg, ecfg())
  assert isinstance(eng, types.RolloutSampler) and eng.continuous
  out = np_tree(eng(state, PROMPTS, jax.random.key(0)))
  for f in ("prompt_BxP", "prompt_mask_BxP", "response_BxR", "response_mask_BxR",
            "lengths_B", "truncated_B", "group_ids_B"):
    np.testing.assert_array_equal(getattr(out, f), getattr(static, f), err_msg=f)
  np.testing.assert_allclose(out.logp_BxR, static.logp_BxR, atol=2e-5)
  np.testing.assert_array_equal(out.response_BxR[::2], want)
  np.testing.assert_array_equal(out.response_BxR[1::2], want)
  assert not out.truncated_B[0] and out.truncated_B[2]  # row 0 stops, prompt 1 runs to R
  assert eng.last_stats["prefills"] == len(PROMPTS)  # once per prompt, not per response
  # A second call (other lengths would do the same) compiles nothing.
  progs = list(next(iter(eng._programs.values())))
  sizes = [f._cache_size() for f in progs]
  again = np_tree(eng(state, PROMPTS[::-1], jax.random.key(0)))
  assert [f._cache_size() for f in progs] == sizes
  np.testing.assert_array_equal(again.response_BxR[:2], out.response_BxR[-2:])


def _sampled_cfg(eos=(), n=4, r=R):
  return SamplingConfig(max_new_tokens=r, temperature=1.3, stop_token_ids=eos, pad_id=0,
                        n_per_prompt=n, max_prompt_len=16, min_prompt_bucket=16)


def test_sampling_does_not_depend_on_slots_order_or_pool(ckpt):
  _, graphdef, state, mcfg = ckpt
  cfg = _sampled_cfg(eos=(40, 7, 22))
  key = jax.random.key(3)
  runs = []
  order = list(range(len(PROMPTS) * 4))
  random.Random(0).shuffle(order)
  for kw, perm in (({"slots": 1}, None), ({"slots": 4}, None), ({"slots": 16}, None),
                   ({"slots": 4}, order),
                   # A pool of one whole response plus a page: evictions happen.
                   ({"slots": 4, "kv_tokens": 16 + R + 3}, order)):
    eng = continuous.Engine(graphdef, mcfg, cfg, ecfg(kv_tokens=kw.pop("kv_tokens", 256),
                                                      **kw))
    runs.append((np_tree(eng(state, PROMPTS, key, order=perm)), eng.last_stats))
  base = runs[0][0]
  lens = base.lengths_B
  assert (lens < R).any() and (lens == R).any(), lens  # stops and truncations both seen
  for out, stats in runs[1:]:
    np.testing.assert_array_equal(out.response_BxR, base.response_BxR)
    np.testing.assert_array_equal(out.lengths_B, base.lengths_B)
    np.testing.assert_array_equal(out.truncated_B, base.truncated_B)
    np.testing.assert_allclose(out.logp_BxR, base.logp_BxR, atol=2e-5)
  assert runs[-1][1]["evictions"] > 0  # the small pool really evicted and restarted
  assert runs[2][1]["slot_occupancy"] <= 1.0
  # Group rows differ (their own keys), and the key matters.
  assert not np.array_equal(base.response_BxR[0], base.response_BxR[1])
  other = continuous.Engine(graphdef, mcfg, cfg, ecfg())(state, PROMPTS, jax.random.key(4))
  assert not np.array_equal(np.asarray(other.response_BxR), base.response_BxR)


def test_lengths_truncation_and_logprobs_are_the_teacher_forced_ones(ckpt):
  _, graphdef, state, mcfg = ckpt
  cfg = _sampled_cfg(eos=(40, 7, 22, 19), n=3)
  out = np_tree(continuous.Engine(graphdef, mcfg, cfg, ecfg())(state, PROMPTS,
                                                               jax.random.key(1)))
  for row in range(out.lengths_B.shape[0]):
    n = out.lengths_B[row]
    resp = out.response_BxR[row]
    np.testing.assert_array_equal(out.response_mask_BxR[row], np.arange(R) < n)
    assert np.all(resp[n:] == 0) and np.all(out.logp_BxR[row, n:] == 0)
    stops = np.isin(resp[:n], cfg.stop_token_ids)
    if out.truncated_B[row]:
      assert n == R and not stops.any()
    else:
      assert stops[-1] and not stops[:-1].any()
  model = nnx.merge(graphdef, state)
  ref = hf._teacher_forced(model, out, cfg.temperature)
  np.testing.assert_allclose(np.asarray(ref) * out.response_mask_BxR, out.logp_BxR,
                             atol=2e-5)


def _drain(pool, lens, max_rounds):
  """Runs a Scheduler over `pool` until every response (prompt 3, max_new 13, chunks of 2)
  has generated lens[b] tokens; the responses in the order they finished."""
  sched = slots_lib.Scheduler(pool, range(len(lens)))
  done, rounds = [], 0
  while not sched.done():
    rounds += 1
    assert rounds < max_rounds
    sched.admit(lambda b: 3, 13, 2)
    sched.reserve(2)
    for s, run in enumerate(sched.running):
      if run is None:
        continue
      gen = run.kv_tokens - 3
      step = min(2, lens[run.response] - gen)
      fin = gen + step >= lens[run.response]
      sched.advance(s, step, fin)
      if fin:
        done.append(run.response)
      assert pool.used <= pool.num_pages
  return done


def test_scheduler_never_starves_with_a_one_response_pool():
  pool = paged.PagePool(num_pages=4, page_size=4, slots=3, max_pages=4)
  done = _drain(pool, {b: 5 + b for b in range(6)}, 200)  # tokens each will generate
  assert sorted(done) == list(range(6)) and pool.used == 0


def test_page_pool_groups_keep_each_slot_in_its_replica():
  pool = paged.PagePool(num_pages=6, page_size=4, slots=4, max_pages=3, groups=2)
  assert [pool.group(s) for s in range(4)] == [0, 0, 1, 1]
  assert pool.grow(0, 12) and not pool.grow(1, 4)  # group 0's 3 pages are slot 0's
  assert pool.grow(2, 8) and pool.grow(3, 4)       # group 1 is untouched by group 0
  t = pool.table()
  np.testing.assert_array_equal(t[0], [0, 1, 2])   # ids local to the group
  np.testing.assert_array_equal(t[1], [3, 3, 3])   # NO_PAGE = N / groups
  np.testing.assert_array_equal(t[2], [0, 1, 3])
  np.testing.assert_array_equal(pool.global_row(2, t[2]), [3, 4, 6])  # NO_PAGE = N
  for s in range(4):
    np.testing.assert_array_equal(pool.row(s), t[s])
  pool.release(0)
  assert pool.grow(1, 4) and pool.table()[1, 0] == 0 and pool.used == 4
  with pytest.raises(ValueError, match="groups=4 must divide"):
    paged.PagePool(num_pages=6, page_size=4, slots=4, max_pages=3, groups=4)


def _table_from_owned(pool):
  """The page table rebuilt from each slot's pages, as `PagePool.table()` did until it was
  kept incrementally: the oracle of the kept table and of its changes."""
  out = np.full((pool.slots, pool.max_pages), pool.group_pages, np.int32)
  for s, pages in enumerate(pool._owned):  # pylint: disable=protected-access
    out[s, :len(pages)] = pages
  return out


@pytest.mark.parametrize("groups", [1, 2])
def test_page_table_changes_replay_the_table(groups):
  # Random grows and releases (schedulers' and evictions' patterns: a release and a regrow
  # of one slot between two reads); the kept table equals the rebuilt one, and the changes
  # set into the previous copy give it, each entry once.
  rng = np.random.default_rng(groups)
  pool = paged.PagePool(num_pages=24, page_size=4, slots=6, max_pages=5, groups=groups)
  copy = pool.table()
  assert pool.changes()[0].size == 0
  for _ in range(300):
    for _ in range(int(rng.integers(0, 4))):
      slot = int(rng.integers(0, 6))
      if rng.random() < 0.3:
        pool.release(slot)
      else:
        pool.grow(slot, pool.held(slot) * 4 + int(rng.integers(1, 9)))
    want = _table_from_owned(pool)
    np.testing.assert_array_equal(pool.table(), want)
    rows, cols, vals = pool.changes()
    assert len(set(zip(rows.tolist(), cols.tolist()))) == len(rows)  # each entry once
    copy[rows, cols] = vals
    np.testing.assert_array_equal(copy, want)
    assert pool.changes()[0].size == 0  # handed out once
  idx, col, val = paged.padded_changes(np.array([1, 2, 2]), np.array([0, 0, 1]),
                                       np.array([5, 6, 7]), 6, min_width=2)
  np.testing.assert_array_equal(idx, [1, 2, 2, 6])  # W = 4; slot 6 = S: dropped
  np.testing.assert_array_equal(val, [5, 6, 7, 0])
  assert len(paged.padded_changes(*pool.changes(), 6)[0]) == 64  # min_width


def test_the_engine_uploads_changed_entries_not_the_table(ckpt, monkeypatch):
  # The full table is built once per rollout (all NO_PAGE); after that the device copy,
  # updated from the changes alone, equals the pool's table before every chunk, evictions
  # included; the samples are the same as with the whole table sent each chunk.
  _, graphdef, state, mcfg = ckpt
  cfg = _sampled_cfg(eos=(40, 7, 22))
  pools, tables, checked = [], [], []
  table, changes = paged.PagePool.table, paged.PagePool.changes
  update = continuous.Engine._update_table  # pylint: disable=protected-access

  def counted_table(self):
    tables.append(1)
    return table(self)

  def kept_changes(self):
    pools.append(self)
    return changes(self)

  def checked_update(self, *args):
    out = update(self, *args)
    np.testing.assert_array_equal(np.asarray(out), table(pools[-1]))
    checked.append(1)
    return out

  monkeypatch.setattr(paged.PagePool, "table", counted_table)
  monkeypatch.setattr(paged.PagePool, "changes", kept_changes)
  monkeypatch.setattr(continuous.Engine, "_update_table", checked_update)
  eng = continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=4, kv_tokens=16 + R + 3))
  got = np_tree(eng(state, PROMPTS, jax.random.key(3)))
  assert tables == [1] and len(checked) == eng.last_stats["decode_chunks"] > 2
  assert eng.last_stats["evictions"] > 0
  monkeypatch.undo()

  class WholeTable(continuous.Engine):  # the old path: the whole table every chunk
    def _update_table(self, table_SxM, *changes_):
      del table_SxM, changes_
      return self._replicated(pools[-1].table())

  monkeypatch.setattr(paged.PagePool, "changes", kept_changes)
  want = np_tree(WholeTable(graphdef, mcfg, cfg, ecfg(slots=4, kv_tokens=16 + R + 3))(
      state, PROMPTS, jax.random.key(3)))
  np.testing.assert_array_equal(got.response_BxR, want.response_BxR)
  np.testing.assert_array_equal(got.logp_BxR, want.logp_BxR)


def test_overlap_keeps_one_chunk_in_flight_and_samples_the_same(ckpt):
  # With overlap, chunk i+1 is dispatched before chunk i is read back (the host reads,
  # admits and reserves while the device decodes); without it each chunk is read before the
  # next one is dispatched (the oracle). Tokens and log-probs are the same, also through
  # evictions in a pool of one whole response plus a page.
  _, graphdef, state, mcfg = ckpt
  cfg = _sampled_cfg(eos=(40, 7, 22))
  runs = {}
  for overlap in (False, True):
    eng = continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=4, kv_tokens=16 + R + 3,
                                                      overlap=overlap))
    runs[overlap] = (np_tree(eng(state, PROMPTS, jax.random.key(3))), eng.last_stats,
                     list(eng.last_trace))
  (want, s0, t0), (got, s1, t1) = runs[False], runs[True]
  np.testing.assert_array_equal(got.response_BxR, want.response_BxR)
  np.testing.assert_array_equal(got.lengths_B, want.lengths_B)
  np.testing.assert_allclose(got.logp_BxR, want.logp_BxR, atol=2e-5)
  assert s0["evictions"] > 0 and s1["evictions"] > 0
  chunks = int(s1["decode_chunks"])
  assert chunks > 3 and len(t1) == 2 * chunks
  assert t0 == [(e, i) for i in range(int(s0["decode_chunks"]))
                for e in ("dispatch", "read")]
  # Overlapped: dispatch 0, then (dispatch i+1, read i) for every chunk but the last.
  assert t1 == ([("dispatch", 0)] + [x for i in range(chunks - 1)
                                     for x in (("dispatch", i + 1), ("read", i))]
                + [("read", chunks - 1)]), t1


def test_scheduler_with_replicas_never_starves_and_admits_past_a_full_replica():
  # 2 replicas of 2 slots, 4 pages each (one whole response of 13 + 3 - 1 = 15 tokens).
  pool = paged.PagePool(num_pages=8, page_size=4, slots=4, max_pages=4, groups=2)
  done = _drain(pool, {b: 4 + 2 * b for b in range(9)}, 400)
  assert sorted(done) == list(range(9)) and pool.used == 0
  # Replica 0 full: the queue's head goes to replica 1's free slot, in queue order.
  pool = paged.PagePool(num_pages=4, page_size=4, slots=4, max_pages=2, groups=2)
  sched = slots_lib.Scheduler(pool, range(4))
  assert sched.admit(lambda b: 8, 1, 0) == [(0, 0), (2, 1)]


def test_decode_replicas_split_the_work_and_the_pool_and_sample_the_same(ckpt):
  """On a 2x2x2 mesh: 4 decode replicas (data x fsdp) give the tokens and log-probs of
  one replica, with a pool small enough to evict; each chip then computes a quarter of
  the decode chunk, holds a quarter of the pool, and gathers no pool page."""
  _, graphdef, state, mcfg = ckpt
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  train = jax.device_put(state, sharding.state_shardings(state, mesh))
  cfg = _sampled_cfg(eos=(40, 7, 22))
  key = jax.random.key(5)
  # Each replica gets one whole response's pages (16 + R - 1 tokens: 7 pages of 4), so
  # its two slots run short and evict.
  SMALL = 4 * 4 * 7  # noqa: N806
  outs, costs = {}, {}
  for reps, kv in ((1, 256), (4, 256), (4, SMALL)):
    eng = continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=8, kv_tokens=kv, replicas=reps),
                            mesh=mesh)
    outs[reps, kv] = (np_tree(eng(train, PROMPTS, key)), eng.last_stats)
    if kv == 256:
      progs = eng.lowerable(train)
      c = progs["decode_chunk"].lower(*progs["decode_chunk_args"]).compile()
      cost = c.cost_analysis()
      cost = cost[0] if isinstance(cost, list) else cost
      pool = progs["decode_chunk_args"][1][0]
      shard = pool.sharding.shard_shape(pool.shape)
      gathers = [l for l in c.as_text().splitlines() if "all-gather" in l
                 and f"[{','.join(map(str, shard[1:]))}]" in l]
      costs[reps] = (cost["flops"], shard[0], gathers)
  base = outs[1, 256][0]
  for k in ((4, 256), (4, SMALL)):
    out = outs[k][0]
    np.testing.assert_array_equal(out.response_BxR, base.response_BxR)
    np.testing.assert_array_equal(out.lengths_B, base.lengths_B)
    np.testing.assert_allclose(out.logp_BxR, base.logp_BxR, atol=2e-5)
  assert outs[4, SMALL][1]["evictions"] > 0
  assert costs[1][1] == 4 * costs[4][1]               # a quarter of the pages per chip
  assert costs[1][0] > 3.0 * costs[4][0], costs        # about a quarter of the work
  assert costs[4][2] == [], costs[4][2]                # no page of the pool gathered
  with pytest.raises(ValueError, match="replicas=2: must be 1 or the mesh's batch"):
    continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=8, replicas=2), mesh=mesh)
  with pytest.raises(ValueError, match="multiple of replicas"):
    ecfg(slots=6, replicas=4)


def test_a_cpu_mesh_waits_for_each_insert_and_one_device_does_not(ckpt, monkeypatch):
  """On a CPU mesh of several devices every insert of a burst of admissions is waited on
  before the next one (`Engine._paced`: unpaced, XLA's CPU client deadlocked resumed runs on
  1 x 4 and 2 x 2 devices); evicted responses are inserted again and waited on again. One
  device and no mesh dispatch without waiting."""
  _, graphdef, state, mcfg = ckpt
  waits = []
  real = jax.block_until_ready
  monkeypatch.setattr(jax, "block_until_ready", lambda x: (waits.append(1), real(x))[1])
  cfg = _sampled_cfg(eos=(40, 7, 22))
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  train = jax.device_put(state, sharding.state_shardings(state, mesh))
  eng = continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=8, kv_tokens=4 * 4 * 7, replicas=4),
                          mesh=mesh)
  out = eng(train, PROMPTS, jax.random.key(5))
  inserts = len(out.lengths_B) + eng.last_stats["evictions"]
  assert eng.last_stats["evictions"] > 0 and len(waits) == inserts, (len(waits), inserts)
  waits.clear()
  one = continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=8))
  one(state, PROMPTS, jax.random.key(5))
  assert waits == []


def test_clear_errors(ckpt):
  _, graphdef, _, mcfg = ckpt
  with pytest.raises(ValueError, match="kv_tokens"):
    continuous.Engine(graphdef, mcfg, _sampled_cfg(), ecfg(kv_tokens=8))
  with pytest.raises(ValueError, match="decode_dtype"):
    ecfg(decode_dtype="int8")


def test_decode_copy_layout_and_no_weight_all_gather_in_the_decode_loop(ckpt):
  _, graphdef, state, mcfg = ckpt
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  train = jax.device_put(state, sharding.state_shardings(state, mesh))
  g, dec = decode_weights.decode_copy(graphdef, train, jnp.bfloat16, mesh)
  flat = nnx.to_flat_state(dec)
  for path, v in flat:
    x = v.get_value()
    assert x.dtype == jnp.bfloat16, path
    assert "fsdp" not in str(x.sharding.spec), (path, x.sharding.spec)
  q = nnx.merge(g, dec).blocks[0].attn.q[...]
  assert "tensor" in str(q.sharding.spec)  # heads stay tensor-parallel
  cfg = _sampled_cfg()
  eng = continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=8, decode_dtype="bfloat16"),
                          mesh=mesh)
  progs = eng.lowerable(train)
  text = progs["decode_chunk"].lower(*progs["decode_chunk_args"]).compile().as_text()
  gathers = decode_weights.param_all_gathers(text)
  assert gathers == [], gathers
  # and the engine runs on the mesh, equal to one device (bf16 weights both times).
  on_mesh = np_tree(eng(train, PROMPTS, jax.random.key(2)))
  one = np_tree(continuous.Engine(graphdef, mcfg, cfg, ecfg(decode_dtype="bfloat16"))(
      state, PROMPTS, jax.random.key(2)))
  np.testing.assert_array_equal(on_mesh.response_BxR, one.response_BxR)


def test_the_all_gather_check_finds_a_per_step_weight_gather():
  """The check above can fail: a loop that gathers a layer's fsdp-sharded weight per step."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  w = jax.ShapeDtypeStruct((5, 64, 64), jnp.float32,
                           sharding=NamedSharding(mesh, P(None, "fsdp", "tensor")))
  x = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P()))

  def f(w, x):
    def body(i, x):
      wi = jax.lax.with_sharding_constraint(w[i], NamedSharding(mesh, P(None, "tensor")))
      return jnp.tanh(x @ wi)
    return jax.lax.fori_loop(0, 5, body, x)

  text = jax.jit(f).lower(w, x).compile().as_text()
  assert len(decode_weights.param_all_gathers(text)) >= 1


def test_engine_bench_runs(tmp_path):
  """benchmarks/engine_bench.py end to end on its tiny preset (forced lengths checked)."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "engine.json"
  res = subprocess.run(
      [sys.executable, os.path.join(root, "benchmarks", "engine_bench.py"), "--preset=tiny",
       "--repeats=1", "--json", str(out)], cwd=root, capture_output=True, text=True,
      timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu", "BENCH_SETTLE_S": "0"})
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
  got = json.loads(out.read_text())["results"]["tiny"]
  assert got["useful_tokens"] > 0 and got["ratios"]["continuous/static"]["median"] > 0, got


def test_trainer_rl_step_with_the_engine_on_8_devices_equals_one():
  """The wiring (`sampling.engine="continuous"`): one RL step through the trainer, on one
  device and on a 2x2x2 mesh, with the engine's metrics logged."""
  import tiny_trainer as tt
  eng = {"sampling.engine": "continuous", "sampling.slots": 4}
  one = tt.run_rl_step(tt.tiny(**eng, **{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1}))
  eight = tt.run_rl_step(tt.tiny(**eng, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}))
  assert one[2]["rollout/rollout_tokens"] > 0 and 0 < one[2]["rollout/slot_occupancy"] <= 1
  assert one[2]["reward/mean"] == eight[2]["reward/mean"]
  assert one[2]["rollout/rollout_tokens"] == eight[2]["rollout/rollout_tokens"]
  tt.assert_trees_close(one[0], eight[0], atol=2e-5)
  tt.assert_trees_close(one[1], eight[1], atol=2e-5)


def test_engine_compiles_nothing_after_its_first_rollout_and_allocates_the_pool_sharded(ckpt):
  # rl.experience frees the pool and the decode copy after every rollout (clear_cache); the
  # next rollout must reuse the compiled copy and allocator, and the pool must be made on its
  # sharding (at pod scale a whole pool on one device does not fit).
  _, graphdef, state, mcfg = ckpt
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  train = jax.device_put(state, sharding.state_shardings(state, mesh))
  eng = continuous.Engine(graphdef, mcfg, _sampled_cfg(), ecfg(slots=4), mesh=mesh)
  compiles = []

  def listener(event, _, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(1)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    first = np_tree(eng(train, PROMPTS, jax.random.key(0)))
    eng.clear_cache()
    n = len(compiles)
    for i in range(2):
      again = np_tree(eng(train, PROMPTS, jax.random.key(0)))
      eng.clear_cache()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert len(compiles) == n, len(compiles) - n
  np.testing.assert_array_equal(first.response_BxR, again.response_BxR)
  pages = eng._pool(jnp.dtype(mcfg.dtype))  # pylint: disable=protected-access
  want = eng._pool_sharding(pages)  # pylint: disable=protected-access
  assert "tensor" in str(want.spec)  # kv heads split over mesh.tensor
  for p in pages:
    assert p.sharding.is_equivalent_to(want, p.ndim)
    assert p.addressable_shards[0].data.shape == want.shard_shape(p.shape)


def test_slot_groups_sample_exactly_what_one_attention_call_samples(ckpt):
  """The decode attention in forced slot groups (`EngineConfig.slot_group`; on TPU the
  kernel's scalar-memory limit sets it): greedy tokens equal the static sampler's, and
  sampled tokens and log-probs equal one call's bit for bit, on one device and per
  decode replica on a 2x2x2 mesh (4 replicas of 2 slots, groups of 1), with evictions."""
  _, graphdef, state, mcfg = ckpt
  cfg = hf.greedy_cfg((), n=2)
  static = np_tree(static_lib.Sampler.for_transformer(graphdef, mcfg, cfg)(
      state, PROMPTS, jax.random.key(0)))
  out = np_tree(continuous.Engine(graphdef, mcfg, cfg, ecfg(slot_group=2))(
      state, PROMPTS, jax.random.key(0)))
  np.testing.assert_array_equal(out.response_BxR, static.response_BxR)
  cfg = _sampled_cfg(eos=(40, 7, 22))
  key = jax.random.key(6)
  one = np_tree(continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=4))(state, PROMPTS, key))
  for group in (3,):   # groups of 3 and 1
    got = np_tree(continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=4, slot_group=group))(
        state, PROMPTS, key))
    np.testing.assert_array_equal(got.response_BxR, one.response_BxR)
    np.testing.assert_array_equal(got.logp_BxR, one.logp_BxR)
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  train = jax.device_put(state, sharding.state_shardings(state, mesh))
  outs = []
  for group in (0, 1):
    eng = continuous.Engine(graphdef, mcfg, cfg, ecfg(slots=8, kv_tokens=4 * 4 * 7,
                                                      replicas=4, slot_group=group),
                            mesh=mesh)
    outs.append((np_tree(eng(train, PROMPTS, key)), eng.last_stats))
  np.testing.assert_array_equal(outs[1][0].response_BxR, outs[0][0].response_BxR)
  np.testing.assert_array_equal(outs[1][0].logp_BxR, outs[0][0].logp_BxR)
  assert outs[1][1]["evictions"] > 0
  with pytest.raises(ValueError, match="slot_group"):
    ecfg(slot_group=-1)
