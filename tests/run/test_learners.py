"""A new trained network is one row in `run.learners.LEARNERS`, whatever rl.packing says.

A toy network (a value-regression head on the critic) is added through the table alone: its
step is written once over the row layout (`rl.layout`), and `learners.learner` builds it padded
and packed; one update gives the same parameters and loss both ways.
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vapo_jax import config as config_lib
from vapo_jax import critic as critic_lib
from vapo_jax import sharding as shd
from vapo_jax.models import init_sharded, tiny_config
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import train_state
from vapo_jax.run import learners
from vapo_jax.run import meshes

P, R = 12, 6
PROMPTS = np.array([12, 3, 7, 1, 12, 5, 2, 9])
RESPS = np.array([6, 0, 2, 6, 1, 4, 5, 3])


def toy_step(graphdef, tx, layout, state, rows):
  """Mean squared error of the values against the returns, token-level: written once."""
  batch = getattr(rows, "batch", rows)
  count = jnp.sum(batch.response_mask_BxR)

  def loss_fn(params, mb, view):
    v = view.pick(view.values(nnx.merge(graphdef, params)), mb.returns_BxR)
    m = view.mine(mb.response_mask_BxR)
    return jnp.sum(m * (v - mb.returns_BxR) ** 2) / count, {}

  loss, grads, _ = layout.accumulate(loss_fn, state.params, rows)
  state, grad_norm, skipped = train_state.apply_update(tx, state, grads, loss)
  return state, {"toy_loss": loss, "toy_grad_norm": grad_norm}, skipped


TOY = learners.LearnerRow(
    schedule=lambda cfg: (1e-2, 0),
    step=lambda cfg, graphdef, tx, layout: functools.partial(toy_step, graphdef, tx, layout),
    batch_rows=lambda cfg: len(PROMPTS), micro_batches=lambda cfg: 2)


def config(packing: bool):
  c = config_lib.default_config_dict()
  c.data.max_prompt_tokens = P
  c.sampling.max_new_tokens = R
  # One device, two packed rows of P + R slots per micro-batch: the 8 sequences need K > 1.
  c.rl.update(packing=packing, packing_tokens_per_device=2 * (P + R))
  c.mesh.update(data=1, fsdp=1, tensor=1)
  return config_lib.from_config_dict(c)


def batch():
  rng = np.random.default_rng(0)
  cols = np.arange(P + R)[None]
  mask = (((cols >= P - PROMPTS[:, None]) & (cols < P))
          | ((cols >= P) & (cols < P + RESPS[:, None]))).astype(np.float32)
  resp = mask[:, P:]
  return batch_lib.RolloutBatch(
      tokens_BxL=(rng.integers(1, 40, mask.shape) * mask).astype(np.int32), mask_BxL=mask,
      response_mask_BxR=resp, returns_BxR=(rng.normal(size=resp.shape) * resp).astype(
          np.float32), scores_B=np.ones(len(PROMPTS), np.float32))


@pytest.fixture
def toy_row(monkeypatch):
  monkeypatch.setitem(learners.LEARNERS, "toy", TOY)


def one_update(packing: bool):
  cfg = config(packing)
  mesh, rules = meshes.build_mesh(cfg), meshes.rules_of(cfg)
  model = init_sharded(lambda r: critic_lib.Critic(
      tiny_config(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=2, num_kv_heads=1, head_dim=16), rngs=r), mesh, seed=4)
  model.score[...] = jax.random.normal(jax.random.key(5), model.score.shape)
  graphdef, params = nnx.split(model)
  learner = learners.learner(cfg, "toy", graphdef, params, mesh, rules)
  rows = batch_lib.shard_batch(batch(), mesh, shd.batch_axes(mesh, rules))
  state, metrics, skipped = learner.step(learner.state, rows)
  if packing:
    assert learner.step.compiled is not None and learner.step.spec.rows_per_device == 2
  assert float(skipped) == 0
  return jax.device_get(state.params), jax.device_get(metrics)


def test_a_network_added_to_the_table_alone_trains_packed_and_padded(toy_row, capsys):
  del toy_row
  padded, m_pad = one_update(packing=False)
  packed, m_pack = one_update(packing=True)
  assert re.search(r"\[compile\] toy: 1 program \(rows=\d+x\d+\)", capsys.readouterr().out)
  assert m_pack["perf/toy_micro_batches"] > 1  # K > 1 packed micro-batches were summed
  assert m_pack["perf/toy_token_efficiency"] < 1  # it really ran on packed rows
  assert "perf/toy_token_efficiency" not in m_pad
  assert m_pad["toy_grad_norm"] > 0
  np.testing.assert_allclose(m_pack["toy_loss"], m_pad["toy_loss"], rtol=1e-5)
  np.testing.assert_allclose(m_pack["toy_grad_norm"], m_pad["toy_grad_norm"], rtol=1e-4)
  # AdamW's first step is lr · g / (|g| + eps): a float-noise difference of a near-zero
  # gradient moves a parameter by up to a few 1e-6 (as in tests/run/test_trainer.py).
  for a, b in zip(jax.tree.leaves(packed), jax.tree.leaves(padded)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


def test_forward_passes_take_a_larger_share_of_the_pass_within_the_same_budget():
  """The default token budget caps an update's micro-batch at 1/16 of the pass's tokens (at
  P + R each) and a forward-only pass's at 1/4 (`packing.FORWARD_SHARE`), both within the
  padded micro-batch's tokens; an explicit rl.packing_tokens_per_device overrides both."""
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  cfg = config_lib.from_config_dict(config_lib.default_config_dict())  # 256 rows, P + R = 80
  rows = learners.rows_of(cfg).rollout
  seq = cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens
  for shards in (1, 2, 4):
    fwd = learners.spec_of(cfg, "logprobs", shards)
    upd = learners.spec_of(cfg, "policy", shards)
    assert fwd.row_len == upd.row_len == seq
    assert fwd.rows_per_device == -(-rows // (packing.FORWARD_SHARE * shards))
    assert upd.rows_per_device == -(-learners.rows_of(cfg).minibatch
                                   // (packing.DEFAULT_SHARE * shards))
    assert learners.spec_of(cfg, "values", shards) == fwd
  # The padded micro-batch bounds the share: 8 rows per micro-batch -> 8 rows, not 64.
  small = config_lib.from_config_dict(config_lib.default_config_dict())
  small = dataclasses.replace(small, rl=dataclasses.replace(small.rl, micro_batch_size=8))
  assert learners.spec_of(small, "logprobs", 1).rows_per_device == 8
  fixed = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl,
                                                          packing_tokens_per_device=4 * seq))
  assert learners.spec_of(fixed, "logprobs", 1).rows_per_device == 4
  assert learners.spec_of(fixed, "policy", 1).rows_per_device == 4
  # Rows longer than P + R hold several sequences: the share counts the pass's tokens, so
  # rows of 4 (P + R) hold a quarter of them in one row, not in a row per sequence.
  long = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, packing_row_tokens=4 * seq))
  assert learners.spec_of(long, "logprobs", 1).rows_per_device == -(-rows // (4 * 4))
  assert learners.spec_of(long, "policy", 1).rows_per_device == -(-learners.rows_of(
      cfg).minibatch // (16 * 4))
