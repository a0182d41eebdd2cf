"""A selective remat (`transformer.selective_block`: matmul outputs kept, the rest recomputed)
gives the loss and gradients of a full remat and of none, scanned or looped, packed or padded,
with LoRA or without; and it keeps what it says it keeps."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax.models import lora, stacked, transformer
from vapo_jax.models.config import tiny_config

import model_batches  # pylint: disable=wrong-import-order

L = 3


def model(scan: bool, lora_rank: int, **kw):
  cfg = tiny_config(vocab_size=40, hidden_size=64, intermediate_size=96, num_layers=L,
                    qkv_bias=True, lora_rank=lora_rank,
                    lora_targets=("q", "o", "down") if lora_rank else (), **kw)
  m = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
  if lora_rank:  # fresh B is zero: random, so the adapters' gradients all flow
    for mod in (m.blocks.attn, m.blocks.mlp):
      for name in cfg.lora_targets:
        var = getattr(mod, name + "_lora_b", None)
        if var is not None:
          var.set_value(0.3 * jax.random.normal(jax.random.key(len(name)),
                                                var.get_value().shape))
  return m if scan else stacked.unstack(m)


def loss_and_grads(m, packed):
  value, _, grads = model_batches.loss_and_grads(m, packed, squash=jnp.tanh)
  return value, grads


# (a full remat of every block equals none in test_scan_layers; "mixed" has a full block)
POLICIES = {"none": dict(remat=False), "selective": dict(remat=True, remat_selective=L),
            # one block of each kind: full, selective, plain (three scans when scanned)
            "mixed": dict(remat=True, remat_layers=2, remat_selective=1)}


@pytest.mark.parametrize("scan,packed,lora_rank", [
    (True, False, 0), (True, True, 2), (False, True, 0), (False, False, 2)])
def test_selective_and_mixed_remat_equal_no_remat(scan, packed, lora_rank):
  out = {k: loss_and_grads(model(scan, lora_rank, **kw), packed)
         for k, kw in POLICIES.items()}
  loss0, grads0 = out["none"]
  for name, (loss, grads) in out.items():
    assert loss == pytest.approx(loss0, abs=1e-5), name
    assert jax.tree.structure(grads) == jax.tree.structure(grads0), name
    for g, g0 in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0)):
      # float32 summation order: 1e-5 of the leaf's scale (|g| up to ~10 here)
      scale = max(1.0, float(np.abs(g0).max()))
      np.testing.assert_allclose(np.asarray(g), np.asarray(g0), atol=1e-5 * scale, rtol=0,
                                 err_msg=name)
  if lora_rank:
    paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(out["selective"][1])]
    assert paths and all(str(p[-1].key).endswith(lora.SUFFIXES) for p in paths)


def test_splash_residuals_are_kept_not_recomputed():
  # Traced only (Pallas interpret mode): with the residuals' name saved, the backward of a
  # checkpointed splash call runs no second forward kernel (fwd, then dq and dk/dv or the
  # fused backward).
  from jax._src.interpreters import partial_eval as pe  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import splash_attention as spa  # pylint: disable=import-outside-toplevel
  ones = lambda *s: jnp.ones(s, jnp.float32)  # noqa: E731
  q, k, v, seg = ones(1, 256, 2, 128), ones(1, 256, 1, 128), ones(1, 256, 1, 128), jnp.ones(
      (1, 256), jnp.int32)

  def kernels(names):
    fn = jax.checkpoint(
        lambda q, k, v: jnp.sum(jnp.sin(spa.splash_attention(q, k, v, seg, 128, True))),
        policy=jax.checkpoint_policies.save_only_these_names(*names))
    closed = jax.make_jaxpr(jax.value_and_grad(fn, (0, 1, 2)))(q, k, v)
    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    return str(jaxpr).count("pallas_call[")

  calls = 2 if spa.FUSED_BWD else 3
  assert kernels(transformer.SAVED) == calls
  assert kernels(()) == calls + 1


# ------------------------------------------------------- 8 devices equal one (one RL step)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_selective_remat_on_8_devices_equals_one_device(layout):
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  base = tiny_config(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=3,
                     num_heads=2, num_kv_heads=2, head_dim=16, scan_layers=False)
  one = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  eight = shd.make_mesh(data=2, fsdp=2, tensor=2)
  runs = {"none, 1 device": model_batches.rl_step(base, one, layout),
          # one block of each kind (full, selective, plain) on 8 devices
          "mixed, 8 devices": model_batches.rl_step(
              base.replace(remat=True, remat_layers=2, remat_selective=1), eight, layout)}
  m0, g0 = runs["none, 1 device"]
  assert m0["policy_grad_norm"] > 0
  for name, (m, g) in runs.items():
    for key in ("policy_loss", "pg_loss", "nll_loss", "policy_grad_norm"):
      np.testing.assert_allclose(m[key], m0[key], rtol=1e-5, atol=1e-7, err_msg=name + key)
    scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(g0))
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
      np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=0, err_msg=name)


def test_remat_selective_is_checked_with_clear_errors():
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  cfg = tiny_config(num_layers=4, remat=True, remat_layers=3, remat_selective=2)
  assert [cfg.remat_kind(i) for i in range(4)] == ["full", "selective", "selective", None]
  with pytest.raises(ValueError, match="remat_selective=4.*3 rematerialised"):
    tiny_config(num_layers=4, remat=True, remat_layers=3, remat_selective=4)
  with pytest.raises(ValueError, match="remat_selective=1"):
    tiny_config(num_layers=4, remat=False, remat_selective=1)
  for over, match in (({"remat_selective": 1}, "0 unless model.remat"),
                      ({"remat": True, "remat_layers": 2, "remat_selective": 3},
                       "at most model.remat_layers=2")):
    c = config_lib.default_config_dict()
    for k, v in over.items():
      c.model[k] = v
    with pytest.raises(config_lib.ConfigError, match=match):
      config_lib.from_config_dict(c)
