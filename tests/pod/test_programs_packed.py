"""The compile check's train-side programs with rl.packing: the packed programs the trainer
runs, one per packed micro-batch shape, lowered and compiled on the 2x2x2 fake mesh, and a
step estimate that follows the lengths (the padded programs' does not)."""

import importlib.util
import os

import jax
import numpy as np
import pytest

from vapo_jax import config as config_lib
from vapo_jax import packing
from vapo_jax import sharding as shd
from vapo_jax.run import learners
from vapo_jax.run import meshes
from vapo_jax.pod import archs
from vapo_jax.pod import fitting
from vapo_jax.pod import slices
from tpu_aot import NEEDS_LIBTPU  # pylint: disable=wrong-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny trainer-test model; P + R = 24; 32 rollout rows, mini-batches of 16 in micro-batches
# of 4 rows (4 batch shards on 2x2x2: one padded row of 24 tokens per shard and micro-batch).
SMALL = {"model.hidden_size": 32, "model.intermediate_size": 64, "model.num_layers": 1,
         "model.num_heads": 2, "model.num_kv_heads": 2, "model.head_dim": 16,
         "data.max_prompt_tokens": 16, "sampling.max_new_tokens": 8,
         "rl.prompts_per_step": 16, "rl.responses_per_prompt": 2, "rl.micro_batch_size": 4,
         "rl.num_minibatches": 2, "eval.batch_prompts": 4, "eval.samples_per_problem": 2,
         "sampling.prompts_per_call": 4, "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}
TRAIN = ("policy_step", "critic_step", "logprobs", "values")


def _config(**over):
  spec = importlib.util.spec_from_file_location("tiny_cfg", os.path.join(ROOT, "configs/tiny.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  for key, v in {**SMALL, **over}.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return config_lib.from_config_dict(c)


def _short_lengths(b=32, seed=0):
  """Real prompt lengths in [1, 8] and responses in [0, 4] (an empty one and one at 4)."""
  rng = np.random.default_rng(seed)
  p, r = rng.integers(1, 9, b), rng.integers(0, 5, b)
  r[0], r[1] = 0, 4
  return p, r


def _mid_lengths(b=32, seed=0):
  """Real prompt lengths in [9, 12] and responses of 4 (one empty): 9 to 16 tokens, one per
  row of 16 or of 24 (two rarely fit 24), so rows of 16 compute the fewest slots."""
  rng = np.random.default_rng(seed)
  p, r = rng.integers(9, 13, b), np.full(b, 4)
  r[0] = 0
  return p, r


def _compiled(plan):
  """{name: fitting.Result} from XLA's cost of each program × its trips (CPU)."""
  out = {}
  for prog in plan.programs:
    compiled = prog.fn.lower(*prog.args, **prog.kwargs).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    out[prog.name] = fitting.Result(
        prog.name, True, flops=prog.trips * float(cost["flops"]),
        bytes_accessed=prog.trips * float(cost["bytes accessed"]))
  return out


@pytest.fixture(scope="module")
def built():
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  mesh = shd.make_mesh(2, 2, 2)
  out = {}
  for label, packed, lengths, steps in (("padded", False, None, 1),
                                        ("packed_full", True, None, 1),
                                        ("packed_short", True, _short_lengths(), 1),
                                        ("packed_steps", True, _mid_lengths(), 3)):
    cfg = _config(**{"rl.packing": packed, "rl.packing_row_steps": steps})
    mcfg = archs.model_config(cfg).replace(vocab_size=128, real_vocab_size=97)
    plan = programs.build(cfg, mcfg, mesh, TRAIN, lengths=lengths)
    out[label] = (cfg, plan, _compiled(plan))
  return mesh, out


def test_packed_programs_are_the_trainers_at_the_planners_shapes(built):
  mesh, out = built
  cfg, plan, _ = out["packed_short"]
  names = [p.name for p in plan.programs]
  assert all("[rows=" in n for n in names), names
  assert {n.split("[")[0] for n in names} == set(TRAIN)
  p_B, l_B = _short_lengths()
  rules = meshes.rules_of(cfg)
  spec = learners.pass_spec(cfg, "policy", mesh, rules)
  assert (spec.row_len, spec.rows_per_device, spec.shards) == (24, 1, 4)
  # The trips are the planner's K on the same lengths: mini-batches of 16 for the steps
  # (the mean over the two), the whole rollout for the forwards.
  mini = [packing.plan(p_B[i:i + 16], l_B[i:i + 16], spec).shape for i in (0, 16)]
  whole = packing.plan(p_B, l_B, learners.pass_spec(cfg, "logprobs", mesh, rules)).shape
  by_name = {p.name: p for p in plan.programs}
  for name in ("policy_step", "critic_step"):
    used = [p for p in plan.programs if p.name.startswith(name) and p.trips]
    assert sum(p.trips for p in used) == pytest.approx(sum(s[1] for s in mini) / 2)
    assert all(f"{name}[rows={s[0]}x24]" in by_name for s in mini)
  for name in ("logprobs", "values"):
    assert by_name[f"{name}[rows={whole[0]}x24]"].trips == whole[1]
  # n is fixed (4 rows of 24 per micro-batch): one program per pass.
  assert {n for _, n in spec.shapes(16)} == {4}
  assert [p.name for p in plan.programs if p.name.startswith("policy_step")] == [
      "policy_step[rows=4x24]"]
  # Its plan tables hold K_cap = ceil(B / n) micro-batches whatever the lengths.
  prog = by_name["logprobs[rows=4x24]"]
  assert prog.args[3]["src"].shape == (4, 8, 24) == (4, spec.micro_cap(32), 24)


def test_row_steps_compile_the_planners_shorter_rows(built):
  """rl.packing_row_steps = 3 on rows of P + R = 24: lengths 8, 16, 24; sequences of 9 to 16
  tokens plan into rows of 16, shorter than P + R, and those programs compile (the fixture
  compiled every one) with the planner's K as trips; rows of 24 are compiled for the fit
  only."""
  mesh, out = built
  cfg, plan, res = out["packed_steps"]
  p_B, l_B = _mid_lengths()
  rules = meshes.rules_of(cfg)
  spec = learners.pass_spec(cfg, "policy", mesh, rules)
  assert (spec.row_len, spec.row_steps, spec.row_lens()) == (24, 3, [8, 16, 24])
  mini = [packing.plan(p_B[i:i + 16], l_B[i:i + 16], spec).shape for i in (0, 16)]
  assert {s[2] for s in mini} == {16}
  by_name = {p.name: p for p in plan.programs}
  for name in ("policy_step", "critic_step"):
    used = [p for p in plan.programs if p.name.startswith(name) and p.trips]
    assert all(p.name.endswith("x16]") for p in used), [p.name for p in used]
    assert sum(p.trips for p in used) == pytest.approx(sum(s[1] for s in mini) / 2)
    assert by_name[f"{name}[rows=4x24]"].trips == 0                     # the fit
  whole = packing.plan(p_B, l_B, learners.pass_spec(cfg, "logprobs", mesh, rules)).shape
  assert whole[2] == 16 and by_name[f"logprobs[rows={whole[0]}x16]"].trips == whole[1]
  assert res and not any(r.error for r in res.values())
  assert all(res[p.name].flops > 0 for p in plan.programs if p.trips)
  # Two thirds of the one-length plan's slots: 16 rows of 16 against 16 of 24.
  one = packing.plan(p_B[:16], l_B[:16], spec.at(24))
  assert mini[0] == (4, 4, 16) and one.shape == (4, 4, 24)


def test_step_estimate_follows_the_lengths_with_packing(built):
  _, out = built
  s = slices.parse("v5p-16")
  est = {k: fitting.step_time(res, plan, cfg, s, 0.4, 0.7)
         for k, (cfg, plan, res) in out.items() if k != "packed_steps"}
  # Sequences at full length: each fills its own row, the packed micro-batches hold the
  # padded ones' rows; within the few-% difference of the programs' bodies.
  assert est["packed_full"] == pytest.approx(est["padded"], rel=0.3)
  # Short sequences: ~4 to a row, a quarter of the micro-batches or fewer.
  assert est["packed_short"] < 0.6 * est["packed_full"], est
  trips = {k: sum(p.trips for p in plan.programs if p.name.startswith("logprobs"))
           for k, (_, plan, _) in out.items() if k != "packed_steps"}
  assert trips["padded"] == trips["packed_full"] == 8 and trips["packed_short"] <= 3


def test_step_model_packed_is_the_codes_planner_and_kernel():
  """`step_model --train=packed` plans with the trainer's PackSpecs and counts the key blocks
  the blocked kernel's own `_live_blocks` keeps on the planner's layout (model.attention_kernel
  jax), or the splash kernel's own block tables per row (auto on a TPU slice)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import attention  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import step as step_model  # pylint: disable=import-outside-toplevel
  cfg = _config(**{"rl.packing": True, "model.attention_impl": "blocked",
                   "model.attention_block": 8})
  mcfg = archs.model_config(cfg).replace(vocab_size=128, real_vocab_size=97)
  mesh = shd.make_mesh(2, 2, 2)
  rules = meshes.rules_of(cfg)
  st = step_model.Setup.of(cfg, mcfg, slices.parse("v5p-16"),
                           step_model.Knobs(train="packed", train_attention="jax"))
  assert st.arch.kernel == "jax"
  assert st.pack_steps == learners.pass_spec(cfg, "policy", mesh, rules)
  assert st.pack_forward == learners.pass_spec(cfg, "logprobs", mesh, rules)
  p_B, l_B = _short_lengths()
  plan = packing.plan(p_B, l_B, st.pack_forward)
  groups = step_model.packed_groups(st, st.pack_forward, p_B, l_B)
  n, k, t = plan.shape
  assert sum(c * tt for c, tt, _, _ in groups) == n * k * t      # every packed slot computed
  seg = packing.pack_indices(plan, 16, 24)["segment_ids"]
  c = st.arch.block
  for mk, (_, _, pairs, _) in enumerate(groups):
    s_BxT = jnp.asarray(seg[:, mk, :])
    want = 0.0
    for a, e in attention._query_groups(t, c):
      keys = s_BxT.reshape(n, t // c, c).transpose(1, 0, 2)        # [blocks, rows, C]
      slot = jnp.arange(t).reshape(t // c, c)
      live = attention._live_blocks(keys > 0, slot, keys, jnp.arange(a, e), s_BxT[:, a:e])
      want += float(jnp.sum(live)) * (e - a) * c
    assert pairs == want, (mk, pairs, want)
  # The splash kernel (what model.attention_kernel=auto runs on TPU): Σ_rows of its live
  # (query block, key block) pairs × c², c = 128 (attention_block 8 rounded up to a lane).
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  sp = step_model.Setup.of(cfg, mcfg, slices.parse("v5p-16"),
                           step_model.Knobs(train="packed"))
  assert sp.arch.kernel == "splash"
  c = splash_attention.block_for(t, sp.arch.block)
  assert c == 128
  tp = -(-t // c) * c
  for mk, (_, _, pairs, _) in enumerate(step_model.packed_groups(sp, sp.pack_forward, p_B,
                                                                 l_B)):
    s_BxTp = jnp.pad(jnp.asarray(seg[:, mk, :]), ((0, 0), (0, tp - t)))
    assert pairs * n == float(jnp.sum(splash_attention.live_blocks(s_BxTp, c))) * c * c
  # And the estimate falls with the lengths, as the compiled programs' does.
  short = step_model.train_side(st, l_B, p_B)
  full = step_model.train_side(st, np.full(32, 8), np.full(32, 16))
  assert sum(p.time for p in short) < 0.6 * sum(p.time for p in full)


def test_learner_programs_are_built_on_the_train_mesh():
  """mesh.train_tensor=1 on the (2, 2, 2) mesh: the learners' programs take their states,
  parameters and rows on the train mesh (2, 4, 1) over the same devices in the same order,
  and compile there; the engine's decode from the (2, 2, 2) mesh (its decode copy is made
  from the train mesh's parameters); the step model plans the passes on the train mesh."""
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import step as step_model  # pylint: disable=import-outside-toplevel
  cfg = _config(**{"rl.packing": True, "mesh.train_tensor": 1})
  mcfg = archs.model_config(cfg).replace(vocab_size=128, real_vocab_size=97)
  mesh = shd.make_mesh(2, 2, 2)
  train = meshes.build_train_mesh(cfg, mesh)
  assert dict(train.shape) == {"data": 2, "fsdp": 4, "tensor": 1}
  assert list(train.devices.flat) == list(mesh.devices.flat)
  plan = programs.build(cfg, mcfg, mesh, TRAIN + ("decode_copy", "prefill"))
  by_name = {p.name.split("[")[0]: p for p in plan.programs}
  for name in TRAIN:
    for leaf in jax.tree.leaves(by_name[name].args):
      assert leaf.sharding.mesh == train, (name, leaf.sharding)
  for leaf in jax.tree.leaves(by_name["decode_copy"].args):   # the policy's train params
    assert leaf.sharding.mesh == train
  for leaf in jax.tree.leaves(by_name["prefill"].args):       # the decode copy, the prompt
    assert leaf.sharding.mesh == mesh
  assert plan.shapes["train_mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
  step = by_name["policy_step"]
  step.fn.lower(*step.args, **step.kwargs).compile()
  st = step_model.Setup.of(cfg, mcfg, slices.parse("v5p-16"), step_model.Knobs(train="packed"))
  assert st.train_tp == 1 and st.tensor == 2
  assert st.pack_steps == learners.pass_spec(cfg, "policy", train, meshes.train_rules_of(cfg))
  # The default keeps one mesh; a train mesh that does not split the devices is refused.
  assert meshes.build_train_mesh(_config(), mesh) is mesh
  with pytest.raises(ValueError, match="data x train_tensor = 6 does not divide 8"):
    meshes.build_train_mesh(_config(**{"mesh.train_tensor": 3}), mesh)


@NEEDS_LIBTPU
def test_train_tensor_2_compiles_the_learners_tp2_programs_for_v5p_8():
  """A (1, 1, 4) mesh on a v5p-8 slice (4 chips, AOT from this CPU host): with
  mesh.train_tensor=2 the old-log-prob pass compiles on the (1, 2, 2) train mesh, every
  collective over pairs of chips; without, on the decode mesh, over all 4."""
  from vapo_jax.pod import train_hlo  # pylint: disable=import-outside-toplevel
  mesh = shd.make_mesh(1, 1, 4, devices=slices.devices(slices.parse("v5p-8")))
  groups = {}
  for train_tensor in (2, 0):
    cfg = _config(**{"rl.packing": False, "mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 4,
                     "mesh.train_tensor": train_tensor, "model.num_heads": 4,
                     "model.num_kv_heads": 4})
    mcfg = archs.model_config(cfg).replace(vocab_size=128, real_vocab_size=97)
    text = train_hlo.compile_texts(cfg, mcfg, mesh, ("logprobs",),
                                   log=lambda *a, **k: None)["logprobs"]
    groups[train_tensor] = {train_hlo.group_size(line) for line in text.splitlines()
                            if "all-reduce" in line and "replica_groups" in line}
  assert groups == {2: {2}, 0: {4}}, groups
