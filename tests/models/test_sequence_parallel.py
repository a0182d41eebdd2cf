"""models/sequence_parallel.py: blocks run per shard with a sequence-parallel residual and
ring collective matmuls (`ModelConfig.collective_matmul`) give the loss and gradients of one
device, on 8 CPU devices: scanned or looped, packed or padded, dense or blocked attention,
with LoRA or without, every remat kind; they lower the blocks' tensor-parallel traffic to
collective-permutes; a call that does not divide over the mesh runs partitioned, with one
line saying why."""

import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import sharding as shd
from vapo_jax.models import lora, sequence_parallel, stacked, transformer
from vapo_jax.models.config import tiny_config

import model_batches  # pylint: disable=wrong-import-order

B, T, V = 4, 16, 40


def _model(cfg, mesh=None):
  if mesh is None:
    m = transformer.Transformer(cfg, rngs=nnx.Rngs(3))
  else:
    m = transformer.init_sharded(lambda r: transformer.Transformer(cfg, rngs=r), mesh, seed=3)
  if cfg.lora_rank:  # fresh B is zero: random, so the adapters' gradients all flow
    for _, var in nnx.iter_graph(m):
      if isinstance(var, lora.LoraParam) and not np.any(np.asarray(var.get_value())):
        var.set_value(0.3 * jax.random.normal(jax.random.key(7), var.get_value().shape))
  return m if cfg.scan_layers else stacked.unstack(m)


def _batch(packed: bool):
  """tokens, positions, key mask, segment ids (or None): [B, T]."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, V, (B, T)).astype(np.int32)
  if not packed:
    mask = np.ones((B, T), np.int32)
    mask[1, :5] = 0
    mask[3, :11] = 0
    return tokens, np.asarray(transformer.positions_from_mask(mask)), mask, None
  lens = [[5, 7, 4], [16], [3, 3, 3, 3], [9, 2]]
  seg, pos = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
  for r, row in enumerate(lens):
    at = 0
    for s, n in enumerate(row):
      seg[r, at:at + n], pos[r, at:at + n] = s + 1, np.arange(n)
      at += n
  return tokens, pos, (seg > 0).astype(np.int32), seg


def loss_and_grads(cfg, mesh, packed):
  """(loss, gradients of the trainable parameters) of Σ tanh(logits) · w, jitted; on `mesh`
  (with its activation sharding) or on one device (mesh None)."""
  model = _model(cfg, mesh)
  tokens, pos, mask, seg = _batch(packed)
  w = np.asarray(jax.random.normal(jax.random.key(1), (B, T, V)))
  graphdef, params = nnx.split(model)
  train, frozen = lora.split_trainable(params)

  def loss(tr):
    m = nnx.merge(graphdef, lora.join(tr, frozen))
    hidden, _ = m(tokens, pos, mask, segment_ids_BxT=seg)
    return jnp.sum(jnp.tanh(m.logits(hidden)) * w)

  fn = jax.jit(jax.value_and_grad(shd.traced_under(loss, mesh)))
  value, grads = fn(train)
  return float(value), jax.device_get(nnx.to_pure_dict(grads)), (fn, train)


def _cfg(**kw):
  base = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
              num_kv_heads=4, head_dim=16, qkv_bias=True, remat=True, remat_layers=2,
              remat_selective=1)  # one block of each kind: full, selective, plain
  base.update(kw)
  return tiny_config(**base)


def _assert_close(got, want, name):
  loss, grads = got
  loss0, grads0 = want
  assert loss == pytest.approx(loss0, rel=1e-5, abs=1e-4), name
  assert jax.tree.structure(grads) == jax.tree.structure(grads0), name
  for g, g0 in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0)):
    scale = max(1.0, float(np.abs(g0).max()))
    np.testing.assert_allclose(np.asarray(g), np.asarray(g0), atol=2e-5 * scale, rtol=0,
                               err_msg=name)


CASES = {  # name: (config overrides, mesh axes, packed)
    "scan, padded, dense": (dict(), dict(data=1, fsdp=2, tensor=4), False),
    "scan, packed, blocked, lora": (dict(attention_impl="blocked", attention_block=8,
                                         lora_rank=2, lora_targets=("q", "v", "o", "up",
                                                                    "down")),
                                    dict(data=2, fsdp=2, tensor=2), True),
    "loop, packed, gqa, qk-norm, biases": (dict(scan_layers=False, num_kv_heads=2,
                                                qk_norm=True, o_bias=True, mlp_bias=True),
                                           dict(data=1, fsdp=4, tensor=2), True),
    "loop, padded, blocked, lora": (dict(scan_layers=False, attention_impl="blocked",
                                         attention_block=8, lora_rank=3,
                                         lora_targets=("k", "gate", "down")),
                                    dict(data=2, fsdp=1, tensor=4), False),
}


@pytest.mark.floor
@pytest.mark.parametrize("name", list(CASES))
def test_sequence_parallel_blocks_equal_one_device(name, monkeypatch):
  kw, axes, packed = CASES[name]
  calls = []
  real = sequence_parallel.finish
  monkeypatch.setattr(sequence_parallel, "finish",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  one = loss_and_grads(_cfg(**kw), None, packed)[:2]
  mesh = shd.make_mesh(**axes)
  got = loss_and_grads(_cfg(collective_matmul=True, **kw), mesh, packed)[:2]
  assert calls, "the blocks did not run sequence-parallel"
  _assert_close(got, one, name)


def _groups(attrs: str) -> list[tuple[int, ...]]:
  """An HLO collective's replica groups: {{0,1},{2,3}} or the iota form [2,2]<=[4] (with
  an optional T(perm))."""
  m = re.search(r"replica_groups=\{(\{[\d,{} ]*\})\}", attrs)
  if m:
    return [tuple(int(d) for d in g.split(",") if d) for g in re.findall(r"\{([\d,]*)\}",
                                                                        m.group(1))]
  m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
  if not m:
    return []
  shape, dims = [int(d) for d in m.group(1).split(",")], [int(d) for d in m.group(2).split(",")]
  ids = np.arange(int(np.prod(dims))).reshape(dims)
  if m.group(3):
    ids = ids.transpose([int(d) for d in m.group(3).split(",")])
  return [tuple(g) for g in ids.reshape(shape)]


def _tensor_all_reduce(cfg, mesh):
  """(all-reduces over the mesh's tensor groups, their elements) in the grad program."""
  fn, train = loss_and_grads(cfg, mesh, True)[2]
  text = fn.lower(train).compile().as_text()
  ids = np.vectorize(lambda d: d.id)(mesh.devices)
  tensor = {tuple(sorted(g)) for g in ids.reshape(-1, mesh.shape["tensor"])}
  count = size = 0
  for line in text.splitlines():
    m = re.search(r"= (.*?) all-reduce(?:-start)?\(", line)
    if m and {tuple(sorted(g)) for g in _groups(line)} == tensor:
      count += 1
      size += sum(int(np.prod([int(d) for d in dims.split(",") if d]))
                  for dims in re.findall(r"\[([\d,]*)\]", m.group(1)))
  return count, size


def test_the_blocks_all_reduce_nothing_over_the_tensor_axis():
  mesh = shd.make_mesh(data=1, fsdp=2, tensor=4)
  plain = _tensor_all_reduce(_cfg(), mesh)
  ring = _tensor_all_reduce(_cfg(collective_matmul=True), mesh)
  # The partitioned blocks all-reduce their [rows, T, D] activations over `tensor` (forward,
  # recompute, backward: dozens of elements per position); with the rings only the weights
  # `tensor` does not split (norm scales, biases) and the head's own traffic are left.
  assert plain[1] > 10 * ring[1], (plain, ring)


@pytest.mark.parametrize("kw,axes,why", [
    (dict(num_heads=2, num_kv_heads=2, head_dim=32), dict(data=1, fsdp=2, tensor=4),
     "heads axis is not split over tensor"),
    (dict(), dict(data=1, fsdp=8, tensor=1), "tensor axis has 1 shard"),
])
def test_what_cannot_split_runs_partitioned_with_one_line(kw, axes, why, capsys):
  sequence_parallel._SAID.clear()  # pylint: disable=protected-access
  one = loss_and_grads(_cfg(**kw), None, True)[:2]
  got = loss_and_grads(_cfg(collective_matmul=True, **kw), shd.make_mesh(**axes), True)[:2]
  _assert_close(got, one, why)
  out = capsys.readouterr().out
  assert out.count("collective_matmul") == 1 and why in out, out


def test_positions_that_do_not_split_run_partitioned():
  mesh = shd.make_mesh(data=1, fsdp=2, tensor=4)
  cfg = _cfg(collective_matmul=True)
  graphdef, state = nnx.split(_model(cfg, mesh).blocks)
  said = []
  with shd.activation_sharding(mesh):
    assert sequence_parallel.runner(graphdef, state, cfg, 18,
                                    log=lambda *a, **k: said.append(a[0])) is None
    assert sequence_parallel.runner(graphdef, state, cfg, T) is not None
    with shd.activation_sharding(mesh, shd.fsdp_only()):  # rows over every axis
      assert sequence_parallel.runner(graphdef, state, cfg, T,
                                      log=lambda *a, **k: said.append(a[0])) is None
  assert sequence_parallel.runner(graphdef, state, cfg, T) is None  # no activation mesh
  assert any("18 positions" in s for s in said), said
  assert any("FSDP-only" in s for s in said), said


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_one_rl_step_with_collective_matmuls_on_8_devices_equals_one_device(layout,
                                                                           monkeypatch):
  calls = []
  real = sequence_parallel.finish
  monkeypatch.setattr(sequence_parallel, "finish",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  base = tiny_config(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=3,
                     num_heads=2, num_kv_heads=2, head_dim=16)
  m0, g0 = model_batches.rl_step(base, shd.make_mesh(1, 1, 1, devices=jax.devices()[:1]),
                                 layout)
  assert not calls
  # one block of each kind (full, selective, plain), per shard with the rings
  m, g = model_batches.rl_step(
      base.replace(remat=True, remat_layers=2, remat_selective=1, collective_matmul=True),
      shd.make_mesh(data=2, fsdp=2, tensor=2), layout)
  assert calls, "the blocks did not run sequence-parallel"
  assert m0["policy_grad_norm"] > 0
  for key in ("policy_loss", "pg_loss", "nll_loss", "policy_grad_norm"):
    np.testing.assert_allclose(m[key], m0[key], rtol=1e-5, atol=1e-7, err_msg=key)
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(g0))
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=0)
