"""`pod.train_hlo`: the train programs' collectives from compiled HLO, per micro-batch trip
and per call, exposed or overlapped as scheduled; on a hand-written HLO module and on a tiny
model's real old-log-prob pass compiled on 8 CPU devices."""

import importlib.util
import os

import jax
import pytest

from vapo_jax import config as config_lib
from vapo_jax import sharding as shd
from vapo_jax.pod import archs
from vapo_jax.pod import hlo_stats
from vapo_jax.pod import train_hlo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The micro-batch loop's body: an async all-gather with a fusion scheduled between its start
# and done (overlapped), a synchronous all-reduce over groups of 4 (exposed), and a nested
# loop of 4 trips (its condition compares its counter with 4, as XLA's TPU scans and windowed
# einsums do) with one f32[4] all-reduce over pairs each. Outside the loop: one
# reduce-scatter of f32[2] over groups of 4 (per call).
HLO = """HloModule m, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%cond4 (q: (s32[], f32[4])) -> pred[] {
  %q = (s32[], f32[4]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

%inner (q: (s32[], f32[4])) -> (s32[], f32[4]) {
  %q = (s32[], f32[4]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %y = f32[4] get-tuple-element(%q), index=1
  %r = f32[4] all-reduce(%y), replica_groups={{0,1},{2,3}}, to_apply=%add
  ROOT %o = (s32[], f32[4]) tuple(%j, %r)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8] get-tuple-element(%p), index=1
  %ags = (f32[2], f32[8]) all-gather-start(%x), replica_groups=[2,4]<=[8], dimensions={0}
  %f = f32[8] fusion(%x), kind=kLoop, calls=%add
  %agd = f32[8] all-gather-done(%ags)
  %ar = f32[8] all-reduce(%f), replica_groups=[2,4]<=[8], to_apply=%add
  %t = (s32[], f32[4]) tuple(%i, %x)
  %w = (s32[], f32[4]) while(%t), condition=%cond4, body=%inner
  ROOT %out = (s32[], f32[8]) tuple(%i, %agd)
}

ENTRY %main (z: f32[8]) -> f32[2] {
  %z = f32[8] parameter(0)
  %c = s32[] constant(0)
  %init = (s32[], f32[8]) tuple(%c, %z)
  %loop = (s32[], f32[8]) while(%init), condition=%add, body=%body, TRIPS3
  %v = f32[8] get-tuple-element(%loop), index=1
  ROOT %rs = f32[2] reduce-scatter(%v), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
}
""".replace("TRIPS3", 'backend_config={"known_trip_count":{"n":"3"}}')


def test_split_of_a_hand_written_module():
  sp = train_hlo.split(HLO)
  t, c = sp.per_trip, sp.per_call
  # Per trip: the overlapped all-gather (32 bytes, sends 3/4 of them); the exposed all-reduce
  # (32 bytes, sends 2 · 3/4) and 4 nested all-reduces of 16 bytes over pairs (2 · 1/2 each).
  assert (t.overlapped, t.overlapped_bytes, t.overlapped_wire) == (1, 32, 24)
  assert (t.exposed, t.exposed_bytes, t.exposed_wire) == (5, 32 + 4 * 16, 48 + 4 * 16)
  # Per call: the reduce-scatter's 8-byte shard, 3 × 8 bytes sent; the micro-batch loop's own
  # trip count (3) is not applied: the step model multiplies by its micro-batches.
  assert (c.exposed, c.exposed_bytes, c.exposed_wire, c.overlapped) == (1, 8, 24, 0)
  assert sp.kinds == {"all-gather": 1, "all-reduce": 5, "reduce-scatter": 1}


def test_group_sizes_and_wire_bytes():
  assert train_hlo.group_size("replica_groups={{0,1,2,3},{4,5,6,7}}, x") == 4
  assert train_hlo.group_size("replica_groups=[16,4]<=[64]") == 4
  assert train_hlo.group_size("replica_groups=mesh['a'=4,'b'=2,'c'=8] {'a','c'}, d={0}") == 32
  assert train_hlo.group_size("dimensions={0}") == 1
  assert train_hlo.wire_bytes("all-reduce", 100, 4) == 150
  assert train_hlo.wire_bytes("all-gather", 100, 4) == 75
  assert train_hlo.wire_bytes("reduce-scatter", 25, 4) == 75
  assert train_hlo.wire_bytes("collective-permute", 100, 1) == 100


def test_extrapolate_is_linear_in_layers():
  a = train_hlo.Split(train_hlo.Side(exposed=10, exposed_wire=100), train_hlo.Side(exposed=2))
  b = train_hlo.Split(train_hlo.Side(exposed=16, exposed_wire=160), train_hlo.Side(exposed=2))
  x = train_hlo.extrapolate(a, b, 2, 4, 64)
  # 3 collectives and 30 bytes per layer on top of 4 and 40: at 64 layers 196 and 1,960.
  assert (x.per_trip.exposed, x.per_trip.exposed_wire, x.per_call.exposed) == (196, 1960, 2)


def _tiny_config():
  spec = importlib.util.spec_from_file_location("t", os.path.join(ROOT, "configs/tiny.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.model.update(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                 head_dim=16, attention_impl="dense")
  c.mesh.update(fsdp=4, tensor=2)
  # Padded rows in two micro-batches: a micro-batch loop XLA keeps.
  c.rl.update(packing=False, prompts_per_step=8, responses_per_prompt=2, num_minibatches=1,
              micro_batch_size=8)
  c.eval.batch_prompts = 8
  return config_lib.from_config_dict(c)


@pytest.mark.parametrize("name", ["logprobs"])
def test_tiny_model_collectives_grow_per_layer(name):
  cfg = _tiny_config()
  mcfg = archs.model_config(cfg)
  mesh = shd.make_mesh(1, 4, 2, devices=jax.devices()[:8])
  # (Probes of >= 2 layers: XLA inlines the blocks' scan of one trip.)
  texts = {n: train_hlo.compile_texts(cfg, mcfg.replace(num_layers=n), mesh, (name,),
                                      log=lambda *a, **k: None)[name] for n in (2, 4)}
  sp = {n: train_hlo.split(t) for n, t in texts.items()}
  # The fsdp weight gathers and tensor-parallel all-reduces sit in the micro-batch loop,
  # and a layer adds some.
  assert sp[2].per_trip.count > 0
  assert sp[4].per_trip.count > sp[2].per_trip.count
  assert sp[4].per_trip.nbytes > sp[2].per_trip.nbytes
  # The blocks' scan is a loop of known trips (L) nested in the micro-batch loop: its
  # collectives count L times, the program's text holds them once, at every depth.
  total = hlo_stats.collectives(texts[4]).total
  assert total == hlo_stats.collectives(texts[2]).total
  assert sp[4].per_trip.count + sp[4].per_call.count > total
  x = train_hlo.extrapolate(sp[2], sp[4], 2, 4, 4)
  assert x.per_trip.count == pytest.approx(sp[4].per_trip.count)
  # Per-layer blocks (a Python loop): no nested loop, trip + call = every collective.
  text = train_hlo.compile_texts(cfg, mcfg.replace(num_layers=2, scan_layers=False), mesh,
                                 (name,), log=lambda *a, **k: None)[name]
  loop = train_hlo.split(text)
  assert loop.per_trip.count + loop.per_call.count == hlo_stats.collectives(text).total


def test_from_saved_takes_the_two_largest_probes(tmp_path):
  import gzip  # pylint: disable=import-outside-toplevel
  one = HLO.replace("f32[2] reduce-scatter", "f32[2] all-gather")   # L1: a different module
  for layers, text in ((1, one), (2, HLO), (4, HLO)):
    with gzip.open(tmp_path / f"policy_step_L{layers}.hlo.gz", "wt") as f:
      f.write(text)
  got = train_hlo.from_saved(str(tmp_path), 64, ("policy_step", "values"))
  assert list(got) == ["policy_step"] and got["policy_step"].probes == (2, 4)
  # Equal probes: flat in the layers.
  assert got["policy_step"].per_trip.exposed == train_hlo.split(HLO).per_trip.exposed
  assert got["policy_step"].kinds["reduce-scatter"] == 1


@pytest.mark.parametrize("remat_layers, selective, want", [
    (48, 0, {4: (3, 0), 8: (6, 0)}),      # 3 of 4 and 6 of 8 rematerialised, as 48 of 64
    (-1, 32, {4: (4, 2), 8: (8, 4)}),     # every block, half of them selective
])
def test_probes_hold_the_models_remat_mix(monkeypatch, remat_layers, selective, want):
  """Each probe compiles the model's mix of kept, rematerialised and selective blocks in
  proportion (`fitting.probe_model`). `replace(num_layers=n)` alone rematerialised every
  block of a 4-layer probe of remat_layers=48 and raised on remat_selective=32."""
  mcfg = archs.model_config(_tiny_config()).replace(
      num_layers=64, remat=True, remat_layers=remat_layers, remat_selective=selective)
  seen = {}

  def fake(cfg, m, mesh, names, lengths=None, log=print):
    seen[m.num_layers] = (m.num_remat, m.remat_selective)
    return {}
  monkeypatch.setattr(train_hlo, "compile_texts", fake)
  assert train_hlo.probe(None, mcfg, None, (4, 8), ("policy_step",)) == {}
  assert seen == want
