"""Sequence packing: the planner's properties, pack/unpack alignment, and packed forwards and
train steps against the padded path (the oracle) on 1 device and on a 2x2x2 mesh.

Batches mix an empty response, responses at max_new_tokens, left prompts of different
lengths and group sampling (pairs of rows answer one prompt).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vapo_jax import critic as critic_lib
from vapo_jax import packing
from vapo_jax import sharding as shd
from vapo_jax.models import Transformer, init_sharded, positions_from_mask, tiny_config
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import behaviour
from vapo_jax.rl import forward
from vapo_jax.rl import layout as layout_lib
from vapo_jax.rl import train_state
from vapo_jax.rl import update

# ------------------------------------------------------------------------------ planner


def _mix(rng, b, p_max, r_max, group=4):
  """Group-sampled lengths: prompts shared by `group` rows, responses 0..R (both ends in)."""
  p = np.repeat(rng.integers(1, p_max + 1, b // group), group)
  r = rng.integers(0, r_max + 1, b)
  r[0], r[1] = 0, r_max
  return p, r


@pytest.mark.parametrize("seed", range(6))
def test_planner_places_every_sequence_once_within_budget_balanced(seed):
  rng = np.random.default_rng(seed)
  b = int(rng.choice([8, 32, 96]))
  pmax, rmax = int(rng.integers(2, 20)), int(rng.integers(1, 60))
  p, r = _mix(rng, b, pmax, rmax)
  d = int(rng.choice([1, 2, 4]))
  t = pmax + rmax + int(rng.integers(0, 10))
  spec = packing.PackSpec(t, int(rng.integers(1, 5)), d)
  plan = packing.plan(p, r, spec)
  again = packing.plan(p.copy(), r.copy(), spec)                 # a pure function
  assert plan.shape == again.shape
  for f in ("micro_B", "row_B", "offset_B"):
    np.testing.assert_array_equal(getattr(plan, f), getattr(again, f))
  n, k, _ = plan.shape
  assert n % d == 0 and n <= spec.max_rows                        # the per-device budget
  assert (k, n) in spec.shapes(b)                                 # one of the fixed shapes
  occupied = np.zeros((n, k, t), int)
  for i in range(b):
    occupied[plan.row_B[i], plan.micro_B[i], plan.offset_B[i]:plan.offset_B[i] + p[i] + r[i]] += 1
  assert occupied.max() == 1 and occupied.sum() == (p + r).sum()  # once, no overlap, inside T
  # Balance: tokens per (micro-batch, shard) differ by at most one row's worth.
  load = occupied.reshape(d, n // d, k, t).sum(axis=(1, 3))
  assert load.max() - load.min() <= t
  tables = packing.pack_indices(plan, pmax, pmax + rmax)
  assert (tables["segment_ids"] > 0).sum() == (p + r).sum()


def test_rows_per_micro_batch_are_fixed_and_k_is_the_only_thing_that_varies():
  spec = packing.PackSpec(100, 4, 2)
  assert {n for _, n in spec.shapes(512)} == {8}                  # n = D * rows_per_device
  for rows in range(1, 512):
    k, n = spec.shape(rows)
    assert n == 8 and rows <= k * n < rows + n                    # less than a micro-batch spare
  assert spec.micro_cap(512) == 64 and spec.micro_cap(0) == 1


@pytest.mark.parametrize("seed", range(4))
def test_tables_have_one_shape_per_batch_size_whatever_the_lengths(seed):
  # The tables a program compiles for are [n, K_cap, T] for every batch of B sequences;
  # micro-batches K .. K_cap - 1 hold nothing, and micro_B's max is K - 1.
  rng = np.random.default_rng(seed)
  spec = packing.PackSpec(40, 2, 1)
  shapes = set()
  for _ in range(20):
    p, r = _mix(rng, 16, 10, int(rng.integers(1, 30)))
    plan = packing.plan(p, r, spec)
    tables = packing.pack_indices(plan, 10, 40)
    shapes.add(tables["src"].shape)
    n, k, _ = plan.shape
    assert plan.micro_B.max() == k - 1
    assert (tables["src"][:, k:] == -1).all() and (tables["segment_ids"][:, :k] > 0).any()
  assert shapes == {(2, 8, 40)}


def test_row_steps_lengths_counted_by_hand():
  # qwen32b's updates: rows of 21,504, a budget of one row per device, 8 steps of 2,688.
  spec = packing.spec_for(21504, 16, 16, row_steps=8)
  assert (spec.align, spec.tokens_per_device) == (128, 21504)
  assert spec.row_lens() == [2688 * s for s in range(1, 9)]
  assert [spec.at(t).rows_per_device for t in (2688, 8064, 10752, 21504)] == [8, 2, 2, 1]
  # Small rows: a = the largest power of two <= 20 / 2 = 10 -> 8; T_s = 16, 20.
  small = packing.PackSpec.from_budget(40, 20, 1, 2)
  assert (small.align, small.row_lens()) == (8, [16, 20])
  assert packing.PackSpec.from_budget(40, 20, 1).row_lens() == [20]


def test_row_steps_plan_picks_the_fewest_computed_slots():
  # Sequences of 10, 5, 5, 2, 8, 5, 7, 5 tokens (47), 40 tokens per device, one shard.
  # Rows of 20 (2 per micro-batch): FFD fills 10+8+2 | 7+5+5 | 5+5 -> 3 rows -> K 2, n 2:
  # 80 slots. Rows of 16 (2 per micro-batch): 10+5 | 8+7 | 5+5+5 | 2 -> 4 rows -> K 2,
  # n 2: 64 slots, the plan kept.
  one = packing.plan(PROMPTS, RESPS, packing.PackSpec.from_budget(40, 20, 1))
  assert one.shape == (2, 2, 20)
  steps = packing.plan(PROMPTS, RESPS, packing.PackSpec.from_budget(40, 20, 1, 2))
  assert steps.shape == (2, 2, 16) and steps.real_tokens == 47
  assert steps.efficiency == pytest.approx(47 / 64)
  # A 17-token sequence fits only the rows of 20.
  long = packing.plan([9, 1], [8, 1], packing.PackSpec.from_budget(40, 20, 1, 2))
  assert long.row_len == 20
  # n is fixed per row length (2 rows of 16 or of 20 here): two sequences of 8 take a
  # micro-batch of 2 rows of 16 (32 slots) rather than 2 rows of 20 (40).
  assert packing.plan([8, 8], [0, 0], packing.PackSpec.from_budget(40, 20, 1, 2)).shape == (
      2, 1, 16)
  # 60 tokens per device: 3 rows of 20 or 3 of 16. Three sequences of 10 fill rows of 20
  # two to a row (2 rows: one micro-batch, 60 slots) but need 3 rows of 16 (48): 16 wins;
  # four of 10 need 2 rows of 20 (60 slots) or 4 of 16 (2 micro-batches, 96): 20 wins.
  spec = packing.PackSpec.from_budget(60, 20, 1, 2)
  assert packing.plan([5] * 3, [5] * 3, spec).shape == (3, 1, 16)
  assert packing.plan([5] * 4, [5] * 4, spec).shape == (3, 1, 20)


@pytest.mark.parametrize("seed", range(4))
def test_row_steps_plan_is_a_valid_plan_no_larger_than_one_length(seed):
  rng = np.random.default_rng(seed)
  b, d = int(rng.choice([32, 96])), int(rng.choice([1, 2, 4]))
  p, r = _mix(rng, b, 8, int(rng.integers(4, 40)))
  t = int((p + r).max()) * int(rng.integers(1, 4)) + int(rng.integers(0, 9))
  spec = packing.PackSpec.from_budget(t * int(rng.integers(1, 4)), t, d, int(rng.integers(2, 9)))
  plan = packing.plan(p, r, spec)
  n, k, tt = plan.shape
  assert tt in spec.row_lens() and tt >= (p + r).max()
  assert (k, n) in spec.at(tt).shapes(b) and n * tt <= d * spec.tokens_per_device
  single = packing.plan(p, r, packing.PackSpec.from_budget(spec.tokens_per_device, t, d))
  assert n * k * tt <= np.prod(single.shape)
  occupied = np.zeros((n, k, tt), int)
  for i in range(b):
    occupied[plan.row_B[i], plan.micro_B[i], plan.offset_B[i]:plan.offset_B[i] + p[i] + r[i]] += 1
  assert occupied.max() == 1 and occupied.sum() == (p + r).sum()


def test_planner_errors_before_any_compile():
  with pytest.raises(ValueError, match="sequence 1 has 9 tokens"):
    packing.plan([2, 4], [3, 5], packing.PackSpec(8, 1))
  with pytest.raises(ValueError, match="holds no packed row"):
    packing.PackSpec.from_budget(10, 16)


# ----------------------------------------------------------------------- pack / unpack

P, R = 4, 6
PROMPTS = np.array([4, 4, 2, 2, 3, 3, 1, 1])        # group sampling: pairs share a prompt
RESPS = np.array([6, 1, 3, 0, 5, 2, 6, 4])          # an empty response, two at R


def _batch(seed=0, vocab=40):
  rng = np.random.default_rng(seed)
  cols = np.arange(P + R)[None]
  prompt = (cols >= P - PROMPTS[:, None]) & (cols < P)
  resp = (cols >= P) & (cols < P + RESPS[:, None])
  mask = (prompt | resp).astype(np.float32)
  tokens = rng.integers(1, vocab, mask.shape)
  tokens[1::2, :P] = tokens[0::2, :P]               # the same prompt within a group
  tokens = (tokens * mask).astype(np.int32)
  r = resp[:, P:].astype(np.float32)
  return {"tokens_BxL": tokens, "mask_BxL": mask, "response_mask_BxR": r,
          "old_logp_BxR": (rng.normal(size=r.shape) * r - 2 * r).astype(np.float32),
          "advantages_BxR": (rng.normal(size=r.shape) * r).astype(np.float32),
          "returns_BxR": (rng.normal(size=r.shape) * r).astype(np.float32),
          "old_values_BxR": (0.1 * rng.normal(size=r.shape) * r).astype(np.float32),
          "ref_logp_BxR": (rng.normal(size=r.shape) * r - 2 * r).astype(np.float32),
          "scores_B": np.array([1, 0, 1, 1, 0.99, 1, 0, 1], np.float32)}


def _plan(batch, spec):
  p, r = layout_lib.lengths(jnp.asarray(batch["mask_BxL"]), P)
  np.testing.assert_array_equal(p, PROMPTS)
  np.testing.assert_array_equal(r, RESPS)
  arrays, plan = layout_lib.plan_arrays(p, r, spec, P, P + R)
  return {**batch, **arrays}, plan


@pytest.mark.floor
def test_pack_unpack_alignment_and_positions_restart():
  """Unpacking the packed next tokens gives the response tokens; every packed position is the
  padded path's position of the same token, so each segment restarts at 0."""
  batch, plan = _plan(_batch(), packing.PackSpec(12, 2, 1))
  assert plan.micro_batches > 1
  tok = np.asarray(packing.gather(jnp.asarray(batch["tokens_BxL"]), jnp.asarray(batch["src"])))
  nxt = np.concatenate([tok[..., 1:], np.zeros_like(tok[..., :1])], -1)
  slots = {k: jnp.asarray(batch[k]) for k in ("micro_B", "row_B", "start_B")}
  real = jnp.asarray(batch["mask_BxL"][:, P:])
  got = packing.unpack(jnp.asarray(nxt, jnp.float32), slots, real)
  np.testing.assert_array_equal(got, batch["tokens_BxL"][:, P:] * real)
  pos = np.asarray(positions_from_mask(jnp.asarray(batch["mask_BxL"], jnp.int32))).reshape(-1)
  src, seg = batch["src"], batch["segment_ids"]
  np.testing.assert_array_equal(batch["positions"][src >= 0], pos[src[src >= 0]])
  starts = (seg > 0) & np.concatenate([np.ones_like(seg[..., :1], bool),
                                       seg[..., 1:] != seg[..., :-1]], -1)
  assert (batch["positions"][starts] == 0).all() and starts.sum() == len(PROMPTS)
  last = packing.last_token(jnp.asarray(batch["positions"], jnp.float32), slots,
                            jnp.asarray(RESPS))
  np.testing.assert_array_equal(last, PROMPTS + RESPS - 1)


# ------------------------------------------------------------------ packed vs padded

MODEL = tiny_config(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
CFGS = {"dense": dataclasses.replace(MODEL, attention_impl="dense"),
        # One layer: the blocked kernels' unrolled query groups compile slowly on CPU.
        "blocked": dataclasses.replace(MODEL, attention_impl="blocked", attention_block=4,
                                       num_layers=1)}
HP = update.PolicyHParams(temperature=0.9, eps_low=0.2, eps_high=0.28, dual_clip=3.0,
                          loss_mode="token", nll_coef=0.1, nll_threshold=1.0,
                          kl_coef=0.05, policy_loss="ppo", old_logprobs="recompute",
                          correction=behaviour.Correction("none", 2.0, (0.5, 2.0)))
CHP = update.CriticHParams(value_clip=0.2, loss_mode="token")
MODES = ("token", "seq_mean_token_mean", "seq_mean_token_sum")  # every rl.loss_mode


def _models(cfg, mesh):
  policy = init_sharded(lambda r: Transformer(cfg, rngs=r), mesh, seed=3)

  def build(r):
    c = critic_lib.Critic(cfg, rngs=r)
    c.score[...] = jax.random.normal(jax.random.key(5), c.score.shape) * 0.5
    return c
  return policy, init_sharded(build, mesh, seed=4)


def _split(model):
  from flax import nnx
  return nnx.split(model)


def _compare_tree(a, b, rtol):
  """|a - b| / |b| <= rtol, in the global norm over the whole tree (a gradient's norm)."""
  x = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(a)])
  y = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(b)])
  assert np.linalg.norm(y) > 0
  rel = np.linalg.norm(x - y) / np.linalg.norm(y)
  assert rel <= rtol, rel


def _run(cfg, mesh, spec, which=("policy", "critic", "rm", "sft"), hp=HP):
  """The forwards and one step of each of `which`, written once (`rl.forward`, `rl.update`),
  on the padded layout (in 2 micro-batches) and on the packed one (`spec`)."""
  batch_axes = shd.batch_axes(mesh, shd.DEFAULT_RULES)
  host, plan = _plan(_batch(), spec)
  rb = batch_lib.shard_batch(batch_lib.RolloutBatch(
      **{k: host[k] for k in batch_lib.ROLLOUT + batch_lib.REFERENCE}), mesh, batch_axes)
  plan_dev = batch_lib.shard_batch({k: host[k] for k in layout_lib.PLAN_KEYS}, mesh,
                                   batch_axes)
  layouts = {"padded": layout_lib.Padded(2), "packed": layout_lib.Packed(spec)}
  policy, critic = _models(cfg, mesh)
  (pg, pp), (cg, cp) = _split(policy), _split(critic)
  tok, mask = rb.tokens_BxL, rb.mask_BxL
  fwd = {}
  for kind, layout in layouts.items():
    logp = layout.forward("logprobs", functools.partial(forward.policy_logprobs, pg), mesh,
                          batch_axes, static=("temperature",))
    values = layout.forward("values", functools.partial(forward.critic_values, cg), mesh,
                            batch_axes)
    fwd[f"{kind}_logp"] = logp(pp, tok, mask, prompt_len=P, temperature=hp.temperature)
    fwd[f"{kind}_v"] = values(cp, tok, mask, prompt_len=P)
  steps = {}
  tx = optax.sgd(1.0)   # params after = params before - grad: the gradient, read off exactly
  table = {"policy": (pg, pp, (hp,), update.policy_step),
           "critic": (cg, cp, (CHP,), update.critic_step),
           "rm": (cg, cp, (CHP,), update.reward_model_step),
           "sft": (pg, pp, (), update.sft_step)}
  for name in which:
    g, p, hps, fn = table[name]
    for kind, layout in layouts.items():
      state = train_state.init_state(p, tx)
      step = train_state.compile_step(functools.partial(fn, g, tx, *hps, layout), state, mesh,
                                      batch_axes)
      arg = rb if kind == "padded" else layout_lib.PackedBatch(rb, plan_dev)
      new, metrics, skipped = step(state, arg)
      assert float(skipped) == 0
      delta = jax.tree.map(lambda a, b: a - b, state.params, new.params)
      steps[(name, kind)] = (delta, jax.device_get(metrics))
  return fwd, steps, plan


@pytest.mark.parametrize("impl,which", [("dense", ("policy", "critic", "rm", "sft")),
                                        ("blocked", ("policy", "critic"))])
def test_packed_equals_padded_one_device(impl, which):
  mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  fwd, steps, plan = _run(CFGS[impl], mesh, packing.PackSpec(12, 2, 1), which)
  assert plan.micro_batches > 1
  _check(fwd, steps, which)


def test_packed_with_row_steps_equals_padded_one_device():
  """rl.packing_row_steps: the plan runs the batch in rows of 16 of the spec's 20 (its
  shape and the compiled step follow the plan), and equals the padded path."""
  mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  fwd, steps, plan = _run(CFGS["dense"], mesh, packing.PackSpec.from_budget(40, 20, 1, 2),
                          ("policy", "critic"))
  assert plan.shape == (2, 2, 16)
  _check(fwd, steps, ("policy", "critic"))


@pytest.mark.parametrize("mode", MODES)
def test_packed_policy_step_equals_padded_in_every_loss_mode(mode):
  """Every rl.loss_mode with the KL and NLL terms on: the normalisers and aggregation of the
  packed (default) path are the padded path's."""
  hp = dataclasses.replace(HP, loss_mode=mode)
  assert hp.kl_coef > 0 and hp.nll_coef > 0
  mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  fwd, steps, plan = _run(CFGS["dense"], mesh, packing.PackSpec(12, 2, 1), ("policy",), hp)
  assert plan.micro_batches > 1
  _check(fwd, steps, ("policy",))
  assert steps[("policy", "packed")][1]["kl_ref"] > 0


@pytest.mark.floor
def test_packed_equals_padded_on_a_2x2x2_mesh():
  mesh = shd.make_mesh(2, 2, 2)
  fwd, steps, plan = _run(CFGS["blocked"], mesh, packing.PackSpec(12, 1, 4),
                          ("policy", "critic"))
  assert plan.micro_batches > 1 and plan.rows == 4
  _check(fwd, steps, ("policy", "critic"))


def test_packed_with_row_steps_equals_padded_on_a_2x2x2_mesh():
  # Rows of 12 in 6 steps of 2: the plan keeps rows of 10 (5 rows either way, K 2, n 4).
  mesh = shd.make_mesh(2, 2, 2)
  fwd, steps, plan = _run(CFGS["blocked"], mesh, packing.PackSpec.from_budget(12, 12, 4, 6),
                          ("policy", "critic"))
  assert plan.shape == (4, 2, 10)
  _check(fwd, steps, ("policy", "critic"))


def _check(fwd, steps, which):
  for a, b in zip(jax.tree.leaves(fwd["packed_logp"]), jax.tree.leaves(fwd["padded_logp"])):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(fwd["packed_v"], fwd["padded_v"], atol=1e-5, rtol=1e-5)
  for name in which:
    (d_pack, m_pack), (d_pad, m_pad) = steps[(name, "packed")], steps[(name, "padded")]
    _compare_tree(d_pack, d_pad, 1e-5)
    for key, val in m_pad.items():
      np.testing.assert_allclose(m_pack[key], val, rtol=1e-5, atol=1e-6, err_msg=key)


def test_config_switch_is_validated_before_any_compile():
  from vapo_jax import config as config_lib
  c = config_lib.default_config_dict()
  c.rl.packing = True
  assert config_lib.from_config_dict(c).rl.packing
  c.rl.packing_row_tokens = 10
  with pytest.raises(config_lib.ConfigError, match="rl.packing_row_tokens"):
    config_lib.from_config_dict(c)
  c.rl.packing_row_tokens = 0
  c.rl.packing_tokens_per_device = 5
  with pytest.raises(config_lib.ConfigError, match="rl.packing_tokens_per_device"):
    config_lib.from_config_dict(c)
  c.rl.packing_tokens_per_device = 0
  c.rl.packing_row_steps = 0
  with pytest.raises(config_lib.ConfigError, match="rl.packing_row_steps"):
    config_lib.from_config_dict(c)


@pytest.mark.parametrize("shards", [1, 2])
def test_head_table_lists_exactly_the_response_slots_per_shard(shards):
  rng = np.random.default_rng(shards)
  p, r = _mix(rng, 32, 9, 20)
  spec = packing.PackSpec(40, 2, shards)
  plan = packing.plan(p, r, spec)
  tab = packing.pack_indices(plan, 9, 29)
  n, kc, t = plan.table_shape
  want = np.zeros((n, kc, t), bool)
  for b in range(len(p)):
    s = plan.offset_B[b] + p[b] - 1
    want[plan.row_B[b], plan.micro_B[b], s:s + r[b]] = True
  head = tab["head"].reshape(shards, n // shards, kc, t).transpose(0, 2, 1, 3).reshape(
      shards, kc, -1)
  block = want.reshape(shards, n // shards, kc, t).transpose(0, 2, 1, 3).reshape(shards, kc, -1)
  for s in range(shards):
    for k in range(kc):
      listed = head[s, k][head[s, k] >= 0]
      np.testing.assert_array_equal(listed, np.flatnonzero(block[s, k]))  # ascending, all
      assert (head[s, k][len(listed):] == -1).all()                       # compacted
  assert (tab["head"] >= 0).sum() == r.sum()


@pytest.mark.parametrize("remat", [True, False])
def test_chunked_head_with_a_count_skips_only_the_chunks_past_it(remat):
  from vapo_jax import policy  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(size=(2, 40, 8)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 24, (2, 40)), jnp.int32)
  w = jnp.asarray(rng.normal(size=(8, 24)), jnp.float32)

  def loss(h, w, count):
    lp, ent = policy.chunked_logprobs(h, y, w, chunk=8, count=count, remat=remat, vocab_size=20)
    return jnp.sum(lp * jnp.arange(40)[None, :] + ent), (lp, ent)

  (_, (lp_all, ent_all)), g_all = jax.value_and_grad(loss, (0, 1), has_aux=True)(h, w, None)
  (_, (lp, ent)), g = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(
      h, w, jnp.int32(19))
  # Chunks of 8: positions < 24 (3 chunks) computed, the rest 0.
  np.testing.assert_allclose(lp[:, :24], lp_all[:, :24], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ent[:, :24], ent_all[:, :24], rtol=1e-6, atol=1e-6)
  assert not np.asarray(lp[:, 24:]).any() and not np.asarray(ent[:, 24:]).any()
  # Gradients: those of the loss over the first 24 positions only.
  (_, _), g_ref = jax.value_and_grad(
      lambda h, w: (lambda o: (jnp.sum((o[0] * jnp.arange(40)[None, :] + o[1])[:, :24]), o))(
          policy.chunked_logprobs(h, y, w, chunk=8, vocab_size=20)), (0, 1), has_aux=True)(h, w)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
