"""The step model: its FLOPs against XLA's cost analysis of single-trip programs, its floor on a
case counted by hand, its length specs, and the HLO collective counter on known programs."""

import dataclasses
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vapo_jax import config as config_lib
from vapo_jax import sharding as shd
from vapo_jax.pod import archs
from vapo_jax.pod import hlo_stats
from vapo_jax.pod import lengths
from vapo_jax.pod.step import counts as step_counts
from vapo_jax.pod import step as step_model
from vapo_jax.pod import slices
from vapo_jax.pod.step import train as step_train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(**over):
  spec = importlib.util.spec_from_file_location("tiny_cfg", os.path.join(ROOT, "configs/tiny.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  for key, v in over.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return config_lib.from_config_dict(c)


# Every loop of the programs runs one trip, so XLA's count (a loop body once) is the whole
# program: one key block (attention_block >= T), one LM-head chunk (R <= 128), one
# micro-batch (micro_batch_size = mini-batch rows = all rows), one forward chunk. Wide enough
# that elementwise work (norms, softmax, Adam, the sampler's random bits: ~1.6 MFLOP per
# decode step at V = 512) stays under 2% of the matmuls.
ONE_TRIP = {"model.hidden_size": 512, "model.intermediate_size": 2048, "model.num_layers": 2,
            "model.num_heads": 4, "model.num_kv_heads": 2, "model.head_dim": 64,
            "model.attention_impl": "blocked", "model.attention_block": 128,
            "model.remat": True, "data.max_prompt_tokens": 32, "sampling.max_new_tokens": 96,
            "rl.prompts_per_step": 8, "rl.responses_per_prompt": 2, "rl.num_minibatches": 1,
            "rl.micro_batch_size": 16, "sampling.prompts_per_call": 8,
            "eval.batch_prompts": 8, "eval.samples_per_problem": 2,
            "mesh.fsdp": -1, "mesh.tensor": 1, "rl.packing": False,
            # The static sampler's standalone decode step (the engine's: test_kv_pool).
            "sampling.engine": "static"}


@pytest.fixture(scope="module")
def one_trip():
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  cfg = _config(**ONE_TRIP)
  # The layers as a Python loop (the scanned layers' oracle): a scan over 2 layers is a
  # 2-trip loop, which XLA's count would see once.
  mcfg = archs.model_config(cfg).replace(vocab_size=512, real_vocab_size=512, scan_layers=False)
  mesh = shd.make_mesh(1, -1, 1, devices=jax.devices()[:8])
  plan = programs.build(cfg, mcfg, mesh, ("policy_step", "critic_step", "logprobs", "values",
                                          "decode_step"))
  flops = {}
  for prog in plan.programs:
    cost = prog.fn.lower(*prog.args, **prog.kwargs).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops[prog.name] = float(cost["flops"]) * mesh.size  # per device -> whole program
  return cfg, mcfg, plan, flops


def test_flops_equal_xla_cost_analysis_of_single_trip_programs(one_trip):
  cfg, mcfg, plan, xla = one_trip
  a = step_counts.Arch.of(mcfg)
  b, p, r = plan.shapes["rows"], plan.shapes["prompt_len"], plan.shapes["response_len"]
  t = p + r
  assert a.uses_blocked(t, t) and step_counts.query_groups(t, a.block) == [(0, 128)]
  fwd = step_counts.forward_flops(a, b, t, step_counts.padded_head_positions(r))
  crit = step_counts.forward_flops(a, b, t, t, critic=True)
  fac = step_counts.train_factors(True)
  ours = {"logprobs": sum(fwd.values()), "values": sum(crit.values()),
          # The remat recompute's MLP down projection is dead code (its output is unused).
          "policy_step": sum(fac[k] * v for k, v in fwd.items()) - b * t * a.down,
          "critic_step": sum(fac[k] * v for k, v in crit.items()) - b * t * a.down,
          "decode_step": step_counts.decode_step_flops(a, b, plan.shapes["cache_len"])}
  for name, want in ours.items():
    assert xla[name] == pytest.approx(want, rel=0.02), (name, xla[name], want)
  # compile_check's cross-check counts the same, per chip of a slice of 8 chips.
  st = step_model.Setup.of(cfg, mcfg, slices.parse("v5p-16"))
  assert st.chips == 8 and plan.shapes["cache_len"] == t
  for name, want in ours.items():
    assert step_model.program_flops(st, name) * 8 == pytest.approx(want), name


def _policy_step_flops(remat_layers: int, selective: int, **model):
  """(XLA's FLOPs of the compiled policy step on 8 devices, the step model's count, Arch,
  the forward's terms, rows, row length) with model.remat_layers / remat_selective of 2
  blocks: a full block recomputes its forward less its MLP down, a selective one no matmul
  (`train_factors`)."""
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  cfg = _config(**{**ONE_TRIP, "model.remat_layers": remat_layers,
                   "model.remat_selective": selective})
  mcfg = archs.model_config(cfg).replace(vocab_size=512, real_vocab_size=512, **model)
  assert (mcfg.num_remat, mcfg.remat_selective) == (remat_layers, selective)
  mesh = shd.make_mesh(1, -1, 1, devices=jax.devices()[:8])
  plan = programs.build(cfg, mcfg, mesh, ("policy_step",))
  prog, = plan.programs
  cost = prog.fn.lower(*prog.args, **prog.kwargs).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  a = step_counts.Arch.of(mcfg)
  b, t = plan.shapes["rows"], plan.shapes["prompt_len"] + plan.shapes["response_len"]
  fwd = step_counts.forward_flops(a, b, t, step_counts.padded_head_positions(
      plan.shapes["response_len"]))
  fac = step_counts.train_factors(a.remat, selective=a.selective)
  want = sum(fac[k] * v for k, v in fwd.items()) - a.full_remat * b * t * a.down
  return float(cost["flops"]) * mesh.size, want, a, fwd, b, t


def test_partial_remat_flops_equal_xla_cost_analysis():
  # model.remat_layers = 1 of 2: one block recomputes its forward (less its MLP down), the
  # other keeps its activations: train_factors(0.5).
  xla, want, a, _, _, _ = _policy_step_flops(1, 0)
  assert a.remat == 0.5
  assert xla == pytest.approx(want, rel=0.02)
  # Between no remat and remat of every block, by half a forward's matmuls.
  assert step_counts.train_factors(0.5)["matmul"] == 3.5


@pytest.mark.parametrize("remat_layers,selective", [(2, 2), (2, 1)])
def test_selective_remat_flops_equal_xla_cost_analysis(remat_layers, selective):
  # model.remat_selective blocks keep their matmul outputs: no matmul recompute (and no
  # "- down"), the pure-JAX attention forward recomputed; the others as a full remat.
  xla, want, a, fwd, b, t = _policy_step_flops(remat_layers, selective, scan_layers=False)
  assert (a.remat, a.selective) == (1.0, selective / 2)
  assert xla == pytest.approx(want, rel=0.02)
  # a full remat's matmul recompute (less down) is more than the 2% tolerance here
  full = sum(step_counts.train_factors(1.0)[k] * v for k, v in fwd.items()) - b * t * a.down
  assert (full - want) / want > 0.05 * a.selective
  # in the splash kernel the selective blocks keep its residuals: no attention recompute
  assert step_counts.train_factors(1.0, "splash", 1.0) == {
      "matmul": 3.0, "attention": step_counts.splash_bwd() + 1.0, "head": 4.0}
  with pytest.raises(ValueError, match="within the remat"):
    step_counts.train_factors(0.5, "splash", 0.75)


def test_attention_pairs_of_the_kernels():
  from vapo_jax.models import attention  # pylint: disable=import-outside-toplevel
  a = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1.0, 1.0, 512, "blocked", True)
  assert step_counts.query_groups(21504, 512) == attention._query_groups(21504, 512)
  # 42 key blocks in 8 groups: the pairs are ~0.56 T^2, as the kernel's docstring says.
  assert step_counts.attention_pairs(a, 21504) / 21504**2 == pytest.approx(0.56, abs=0.01)
  d = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1.0, 1.0, 512, "dense", True)
  assert attention.causal_query_blocks(256) == 4
  # Four blocks of 64 queries see 64, 128, 192, 256 keys.
  assert step_counts.attention_pairs(d, 256) == 64 * (64 + 128 + 192 + 256)


def test_splash_blocks_counted_by_hand():
  # One segment filling 1,024 slots in blocks of 256: the lower triangle of 4 blocks, 10.
  assert step_counts.splash_blocks([(0, 1024)], 1024, 256) == 10
  # Segments of 300 and 200 tokens: block 0 (segment 1) and block 1 (segments 1 and 2)
  # meet: (0, 0), (1, 0), (1, 1); blocks 2 and 3 are padding and run their diagonal only.
  assert step_counts.splash_blocks([(0, 300), (300, 200)], 1024, 256) == 5
  # Segments ending on a block edge: block 1 holds only segment 2, so (1, 0) is skipped.
  assert step_counts.splash_blocks([(0, 256), (256, 256)], 1024, 256) == 4
  # A row of 1,000 slots is padded to 4 blocks; a left-padded prompt (padded rows): one
  # segment on slots [700, 1000) -> blocks 2, 3 -> (2, 2), (3, 2), (3, 3) + diagonals 0, 1.
  assert step_counts.splash_blocks([(700, 300)], 1000, 256) == 5
  a = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1.0, 1.0, 512, "blocked", True, kernel="splash")
  # attention_block 512 on rows of 1,024: c = 512, one block pair per half: 3 blocks · 512².
  assert step_counts.splash_pairs(a, [(0, 1024)], 1024) == 3 * 512 ** 2
  assert step_counts.splash_block(a, 300) == 384          # rows shorter than C: 128-rounded
  assert step_counts.train_factors(True)["attention"] == 4.5
  # 4 Dh / c bytes per (pair, head): a bf16 key and value block per c² pairs.
  assert a.splash_score_bytes(1024) == 4 * 4 / 512


@pytest.mark.parametrize("fused", [True, False])
def test_splash_backward_fused_or_split_counted_by_hand(fused, monkeypatch):
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(splash_attention, "FUSED_BWD", fused)
  # fused: qk, pᵀ do, do vᵀ, dsᵀ q, ds k = 2.5 a; split: the dq kernel's qk again, 3.5 a
  bwd = 2.5 if fused else 3.5
  assert step_counts.train_factors(True, "splash")["attention"] == bwd + 2.0
  assert step_counts.train_factors(False, "splash")["attention"] == bwd + 1.0
  a = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1.0, 1.0, 512, "blocked", True, kernel="splash")
  # a row of 1,000 slots: c = 512, n = 2 key blocks, each a bf16 [1024, Dh] dq partial per
  # head and layer, written and read back: 2 · 2 · 1024 · 4 · 2 bytes · 2 heads · 2 layers
  assert step_counts.splash_dq_bytes(a, 1000) == (2 * 2 * 1024 * 4 * 2 * 2 * 2
                                                  if fused else 0.0)


@pytest.mark.parametrize("seed", range(3))
def test_splash_blocks_are_the_kernels_tables(seed):
  """`splash_blocks` on a packed plan's rows = the live entries of the kernel's own
  `splash_attention.live_blocks` on the plan's segment ids."""
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  p, r = rng.integers(1, 200, 64), rng.integers(0, 900, 64)
  plan = packing.plan(p, r, packing.PackSpec(1536, 8, 2, 1))
  n, k, t = plan.shape
  segs = packing.row_segments(plan)
  seg = packing.pack_indices(plan, 200, 1100)["segment_ids"]
  for c in (128, 256, 512):
    for mk in range(k):
      live = splash_attention.live_blocks(jnp.asarray(seg[:, mk, :]), c)     # [n, i, j]
      want = np.asarray(live).reshape(n, -1).sum(-1)
      got = [step_counts.splash_blocks(segs.get((mk, row), []), t, c) for row in range(n)]
      np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fused", [True, False])
def test_splash_train_pass_counted_by_hand(fused, monkeypatch):
  """A train pass on the splash kernel: FLOPs = live blocks · c² · 4 L H Dh × (1 + 1 + 3.5,
  or 2.5 fused) with remat, time compute-bound (its key / value reads are 4 Dh / c bytes per
  pair and head, the fused dq partials 4 n² c Dh per row and head); the pure-JAX path on the
  same rows pays the f32 score traffic."""
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(splash_attention, "FUSED_BWD", fused)
  arch = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1000.0, 900.0, 512, "blocked", True,
                         untied=False, kernel="splash")
  st = dataclasses.replace(_hand_setup(attn_score_bytes=16.0), arch=arch, peak=1e11)
  # One row of 2,048 slots holding a 1,024-token sequence at slot 0: key blocks of 512,
  # 3 live pairs in the segment's 2 blocks + 2 padding diagonals = 5 blocks.
  pairs = step_counts.splash_pairs(arch, [(0, 1024)], 2048)
  assert pairs == 5 * 512 ** 2
  prog = step_train._train_program(st, "policy_step", [(1, 2048, pairs, 128)], False, True,
                                   False)
  fl = (4.5 if fused else 5.5) * pairs * arch.pair
  assert prog.terms["attention"] == pytest.approx(fl / st.chips / (1e11 * 0.4))
  dq = 4 * 4 * 4 * 512 * arch.dh * arch.h * arch.layers if fused else 0.0   # n = 4 blocks
  assert prog.hbm_bytes == pytest.approx(
      (pairs * arch.splash_score_bytes(2048) * arch.layers * arch.h * fl / pairs / arch.pair
       + dq) / st.chips + arch.params * 2.0 / st.train_tp)
  jax_arch = dataclasses.replace(arch, kernel="jax")
  old = step_train._train_program(dataclasses.replace(st, arch=jax_arch), "policy_step",
                                  [(1, 2048, pairs, 128)], False, True, False)
  score = 4.5 * pairs * arch.layers * arch.h * 16.0 / st.chips
  assert old.terms["attention"] == pytest.approx(score / (st.bw * 0.7))
  assert "score traffic" in old.note and not prog.note


def test_setup_picks_the_train_kernel_as_the_config_does():
  cfg = config_lib.from_config_dict(_qwen32b())
  mcfg = archs.model_config(cfg, "qwen2.5-32b")
  s = slices.parse("v5p-128")
  assert cfg.model.attention_kernel == "auto"
  st = step_model.Setup.of(cfg, mcfg, s, step_model.Knobs(host_chunk_ms=20.0))
  assert st.arch.kernel == "splash" and st.knobs.train_attention == "splash"
  assert step_model.Setup.of(cfg, mcfg.replace(attention_kernel="jax"), s).arch.kernel == "jax"
  # 40 q heads split over tensor 4 but 10 kv heads do not: the layer would refuse.
  assert step_model.train_kernel(mcfg.replace(num_kv_heads=10), 4) == "jax"
  forced = step_model.Setup.of(cfg, mcfg, s, step_model.Knobs(train_attention="jax"))
  assert forced.arch.kernel == "jax"
  # The packed passes' specs carry rl.packing_row_steps (8 in configs/qwen32b.py).
  assert st.pack_steps.row_steps == st.pack_forward.row_steps == cfg.rl.packing_row_steps == 8


def _hand_setup(**knobs):
  arch = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1000.0, 900.0, 512, "blocked", False,
                         untied=False)
  return step_model.Setup(arch, chips=4, tensor=4, peak=1e30, bw=1e9, hbm=1e12, ici=1e9,
                          rows=2, n=1, prompt_len=4, max_new=8, per_call=2,
                          windows=((1, 8, 11),), epochs=1, use_critic=True, param_bytes=4,
                          eval_rows=0, eval_per_call=2, eval_every=1,
                          knobs=step_model.Knobs(engine_tp=4, **knobs))


def test_floor_rollout_counted_by_hand():
  st = _hand_setup(bw_ceiling=1.0)   # the floor's HBM at full bandwidth
  # Two sequences on one TP4 replica: prompts 2 and 2, responses 3 and 1 tokens.
  # Live KV read per step: step 0: 2 + 2 = 4 tokens, step 1: 3 (the short one has ended),
  # step 2: 4. Three steps of bf16 weights 2·1000/4 bytes, 11 tokens of KV at kv_bytes / 4.
  prog = step_model.continuous_rollout(st, np.array([3, 1]), np.array([2, 2]), floor=True)
  kvb = st.arch.kv_bytes() / 4
  assert prog.terms["decode weights"] == pytest.approx(3 * 500 / 1e9)
  assert prog.terms["decode KV"] == pytest.approx(11 * kvb / 1e9)
  assert prog.terms["decode latency"] == 0
  assert prog.time == pytest.approx((3 * 500 + 11 * kvb) / 1e9, rel=1e-6)
  # By default the floor reads HBM at the estimate's efficiency (equal efficiency).
  same = step_model.continuous_rollout(_hand_setup(), np.array([3, 1]), np.array([2, 2]),
                                       floor=True)
  assert same.time == pytest.approx(prog.time / step_model.Knobs().bw_efficiency)


def test_floor_train_counted_by_hand():
  st = _hand_setup()
  resp, prompts = np.array([6]), np.array([3])
  t, a = 9, st.arch
  progs = {p.name: p for p in step_model.train_side(st, resp, prompts, floor=True)}
  # Old log-probs: 9 tokens of matmuls, 9·10/2 causal pairs, the head on the 6 response tokens.
  want = t * a.matmul + 45 * a.pair + 6 * a.head
  assert progs["logprobs"].flops * st.chips == pytest.approx(want)
  # A policy update: fwd + bwd = 3× matmuls and head, 3.5× attention (no remat in the floor).
  want = 3 * t * a.matmul + 3.5 * 45 * a.pair + 3 * 6 * a.head
  assert progs["policy_step"].flops * st.chips == pytest.approx(want)


def test_static_rollout_runs_each_call_to_its_longest_row():
  st = _hand_setup()
  prog = step_model.static_rollout(st, np.array([5, 2]))
  # Loop steps t = 1 .. max ℓ - 1 = 4, each over the 11-slot window for both rows.
  assert "4 decode steps" in prog.note
  fl = 4 * step_counts.decode_step_flops(st.arch, 2, 11) / st.chips
  pre = sum(step_counts.forward_flops(st.arch, 2, 4, 1).values()) / st.chips
  assert prog.flops == pytest.approx(fl + pre)


def test_qwen32b_today_in_the_reviews_range():
  cfg = config_lib.from_config_dict(_qwen32b())
  mcfg = archs.model_config(cfg, "qwen2.5-32b")
  st = step_model.Setup.of(cfg, mcfg, slices.parse("v5p-128"),
                           step_model.Knobs(train="padded", rollout="static", bw_ceiling=1.0))
  r = step_model.run(st, "late", "uniform:80,400")
  # The review's floor (2,682 s late; HBM at 100%) from the same counting rules, within 5%.
  assert r["floor_s"] == pytest.approx(2682, rel=0.05)
  assert 5 < r["ratio"] < 40
  packed = step_model.run(step_model.Setup.of(cfg, mcfg, slices.parse("v5p-128"),
                                               step_model.Knobs(host_chunk_ms=20.0)),
                          "early", "uniform:80,400")
  assert packed["estimate_s"] < r["estimate_s"] / 3


def _qwen32b():
  spec = importlib.util.spec_from_file_location("q", os.path.join(ROOT, "configs/qwen32b.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def test_length_specs(tmp_path):
  x = lengths.sample("lognormal:900,0.7", 8192, 20480)
  assert np.median(x) == pytest.approx(900, abs=2)
  assert x.mean() == pytest.approx(900 * np.exp(0.7**2 / 2), rel=0.01)
  late = lengths.sample("late", 8192, 20480)
  assert (late == 20480).mean() == pytest.approx(0.041, abs=0.004)   # the review's 4.1 %
  u = lengths.sample("uniform:80,400", 1000, 1024)
  assert (u.min(), u.max(), u.mean()) == (80, 400, pytest.approx(240, abs=1))
  assert [k for k, _ in lengths.phases("review")] == ["early", "mid", "late"]
  path = tmp_path / "metrics.jsonl"
  rows = [{"stage": "rl", "step": 1, "response/length_p10": 1, "response/length_p50": 2},
          {"stage": "value_pretrain", "step": 1, "response/length_p50": 7000},
          {"stage": "rl", "step": 2, "response/length_min": 10, "response/length_p10": 100,
           "response/length_p50": 500, "response/length_p90": 900,
           "response/length_p99": 990, "response/length_max": 1000}]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  y = lengths.sample(str(path), 1000, 20480)
  assert np.median(y) == pytest.approx(500, abs=3) and y.max() <= 1000 and y.min() >= 10
  assert np.median(lengths.sample(f"{path}@1", 100, 20480)) <= 2
  for bad in ("lognormal:900", "gauss:1,2", "uniform:5,1"):
    with pytest.raises(ValueError):
      lengths.sample(bad, 10, 100)


# ---------------------------------------------------------------------------- HLO counter
def _mesh8():
  return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))


def test_collective_counter_on_known_program():
  mesh = _mesh8()

  def known(x):
    def g(a):
      s = jnp.tanh(jax.lax.psum(a, "x")) * a
      return jax.lax.all_gather(jax.lax.psum(s, "x"), "x", tiled=True)
    return jax.shard_map(g, mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False)(x)

  arg = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  c = hlo_stats.collectives(jax.jit(known).lower(arg).compile().as_text())
  # Two dependent all-reduces of f32[1,16] (64 B) and one all-gather to f32[8,16] (512 B).
  assert c.count == {"all-reduce": 2, "all-gather": 1}
  assert c.bytes == {"all-reduce": 128, "all-gather": 512}


def _loop_program(gather_weights: bool):
  """A loop over 6 steps with layer-stacked weights sharded over 8 devices: either each step
  all-gathers layer i's weights (an FSDP weight gather per step), or the weights stay sharded
  and each step all-reduces the activations (tensor parallel)."""
  mesh = _mesh8()

  def step(ws, xs):
    if gather_weights:
      return xs @ jax.lax.all_gather(ws, "x", axis=0, tiled=True)
    return jax.lax.psum(xs[:, :8] @ ws, "x")  # xs's slice of the contraction, summed

  def prog(w, x):
    spec = (P("x", None), P()) if gather_weights else (P("x", None), P())
    f = jax.shard_map(step, mesh=mesh, in_specs=spec, out_specs=P(), check_vma=False)
    return jax.lax.fori_loop(0, 6, lambda i, x: jnp.tanh(f(w[i % 3], x)), x)

  w = jax.ShapeDtypeStruct((3, 64, 64), jnp.float32,
                           sharding=NamedSharding(mesh, P(None, "x", None)))
  x = jax.ShapeDtypeStruct((4, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
  return jax.jit(prog).lower(w, x).compile().as_text()


def test_invariant_gather_found_in_a_loop_that_gathers_weights():
  text = _loop_program(gather_weights=True)
  bad = hlo_stats.invariant_gathers(text)
  assert len(bad) == 1 and bad[0].nbytes == 64 * 64 * 4
  loops = hlo_stats.while_bodies(text)
  assert [lp.collectives.count for lp in loops] == [{"all-gather": 1}]


def test_no_invariant_gather_in_a_tensor_parallel_loop():
  text = _loop_program(gather_weights=False)
  assert hlo_stats.invariant_gathers(text) == []
  assert [lp.collectives.count.get("all-reduce") for lp in hlo_stats.while_bodies(text)] == [1]


def test_compile_check_no_compile_prints_the_model():
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  out = subprocess.run(
      [sys.executable, "-m", "vapo_jax.pod.compile_check", "--config=configs/qwen32b.py",
       "--topology=v5p-128", "--arch=qwen2.5-32b", "--no_compile", "--lengths=early",
       "--decode_collectives=1362", "--train=packed", "--rollout=static",
       # No stamped train collectives in the tree: the layout's arithmetic, allowed only
       # without the rings (with them the command refuses and names train_hlo: below).
       "--config.model.collective_matmul=False"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-2000:]
  assert "early (lognormal:900,0.7" in out.stdout and "ratio" in out.stdout
  assert "train=packed" in out.stdout and "1362 collectives/step" in out.stdout
  rings = subprocess.run(
      [sys.executable, "-m", "vapo_jax.pod.compile_check", "--config=configs/qwen32b.py",
       "--topology=v5p-128", "--arch=qwen2.5-32b", "--no_compile", "--lengths=early",
       "--train_collectives=layout"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert rings.returncode == 2 and "python -m vapo_jax.pod.train_hlo" in rings.stderr
  bad = subprocess.run(
      [sys.executable, "-m", "vapo_jax.pod.compile_check", "--config=configs/qwen32b.py",
       "--topology=v5p-128", "--no_compile", "--lengths=gauss:1"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert bad.returncode != 0 and "unknown length spec" in bad.stdout + bad.stderr


def test_collective_counter_reads_async_pairs_once():
  text = """HloModule m

%body (p: (s32[], bf16[16,2,128])) -> (s32[], bf16[16,2,128]) {
  %p = (s32[], bf16[16,2,128]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[16,2,128]{2,1,0} get-tuple-element(%p), index=1
  %cp = (bf16[16,2,128], bf16[16,2,128], u32[], u32[]) collective-permute-start(%x), channel_id=1
  %cd = bf16[16,2,128]{2,1,0} collective-permute-done(%cp)
  %ag = (bf16[16,2,128]{2,1,0}, bf16[64,2,128]{2,1,0}) all-gather-start(%cd), dimensions={0}
  %agd = bf16[64,2,128]{2,1,0} all-gather-done(%ag)
  ROOT %t = (s32[], bf16[16,2,128]) tuple(%i, %cd)
}

ENTRY %main (a: bf16[16,2,128]) -> bf16[16,2,128] {
  %a = bf16[16,2,128]{2,1,0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], bf16[16,2,128]) tuple(%z, %a)
  %w = (s32[], bf16[16,2,128]) while(%init), condition=%cond, body=%body
  ROOT %r = bf16[16,2,128]{2,1,0} get-tuple-element(%w), index=1
}
"""
  (loop,) = hlo_stats.while_bodies(text)
  assert loop.collectives.count == {"collective-permute": 1, "all-gather": 1}
  assert loop.collectives.bytes == {"collective-permute": 16 * 2 * 128 * 2,
                                    "all-gather": 64 * 2 * 128 * 2}
  # The gathered array is derived from carry 1, which the body changes: not invariant.
  assert hlo_stats.invariant_gathers(text) == []


def _brute_force_engine(st, resp, prompts, floor):
  """Continuous batching one step at a time (the oracle of the event-driven simulation)."""
  a, k = st.arch, st.knobs
  tp = k.engine_tp
  reps = max(1, st.chips // tp)
  kvb = a.kv_bytes()
  bw = st.bw * (k.floor_bw if floor else k.bw_efficiency)
  rate = st.peak * (1.0 if floor else k.mfu)
  w = 2.0 * a.decode_weights / tp
  lat = 0.0 if floor else (2.0 * a.layers + 2) * k.collective_latency_us * 1e-6
  # The TP all-reduces' bytes of each live row (no slot limit: the step holds the live rows).
  row_ar = 0.0 if floor else 2 * a.layers * a.d * 2 * 2 * (tp - 1) / tp / (st.ici / 3)
  cap = k.engine_admit * step_model.kv_budget(st, tp) * tp / kvb
  worst = 0.0
  for r in range(reps):
    lens, ps = list(resp[r::reps]), list(prompts[r::reps])
    live, q, total = [], 0, 0.0   # live: [tokens held, steps left]
    while q < len(lens) or live:
      while q < len(lens) and (sum(x for x, _ in live) + ps[q] < cap or not live):
        live.append([ps[q], lens[q]])
        total += ps[q] * (a.matmul / tp) / (st.peak * (k.mfu_ceiling if floor else k.mfu)) / st.n
        q += 1
      x = sum(t for t, _ in live)
      total += (max((w + x * kvb / tp) / bw, len(live) * (a.matmul + a.head) / tp / rate)
                + lat + len(live) * row_ar)
      live = [[t + 1, s - 1] for t, s in live if s > 1]
    worst = max(worst, total)
  return worst


@pytest.mark.parametrize("floor", [True, False])
def test_engine_simulation_equals_step_by_step(floor):
  rng = np.random.default_rng(0)
  arch = step_counts.Arch(4, 64, 128, 4, 2, 16, 100, 5e5, 4e5, 512, "blocked", True)
  for trial in range(3):
    # A KV budget of ~150 tokens: admissions wait for finishes; compute sometimes
    # binds (peak low enough that n · FLOPs per token beats the bytes at high concurrency).
    st = step_model.Setup(arch, chips=8, tensor=4, peak=3e9 if trial == 0 else 1e12, bw=1e10,
                          hbm=1.0214e6, ici=1e9, rows=40, n=4, prompt_len=16, max_new=64,
                          per_call=4, windows=((1, 64, 79),), epochs=1, use_critic=False,
                          param_bytes=4, eval_rows=0, eval_per_call=8, eval_every=1,
                          knobs=step_model.Knobs(engine_tp=4, workspace_gb=0.0, headroom=0.0))
    resp = rng.integers(1, 65, 40)
    prompts = rng.integers(1, 17, 40)
    prog = step_model.continuous_rollout(st, resp, prompts, floor=floor)
    assert prog.time - prog.terms.get("bf16 reshard", 0.0) == pytest.approx(
        _brute_force_engine(st, resp, prompts, floor), rel=1e-9)
    assert "≈150 live tokens" in prog.note          # admission waits: prompts hold ~170
    if trial == 0:
      assert prog.terms["decode compute"] > 0      # compute bound some of the time
    else:
      # Bandwidth bound: without the budget every sequence starts at once, sharing the
      # weight reads of more steps.
      roomy = dataclasses.replace(st, hbm=1e9)
      assert step_model.continuous_rollout(roomy, resp, prompts, floor).time < prog.time
