"""The engine's KV pool sized by a token budget, and the compile check's engine programs.

Oracles: the sizing rule counted by hand; the run's resident-memory count against the
compile check's (built independently from its own abstract TrainStates); the step model's
engine against the engines `run.sampling` builds (slots, pages, chunk steps, decode steps).
"""

import importlib.util
import os

import jax
import numpy as np
import pytest

from vapo_jax import config as config_lib
from vapo_jax import sharding as shd
from vapo_jax.run import inputs, meshes, sampling
from vapo_jax.run import memory as run_memory
from vapo_jax.sampler import kv_pool
from vapo_jax.pod import archs
from vapo_jax.pod import programs
from vapo_jax.pod import step as step_model
from vapo_jax.pod import slices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = {"model.hidden_size": 32, "model.intermediate_size": 64, "model.num_layers": 1,
         "model.num_heads": 2, "model.num_kv_heads": 2, "model.head_dim": 16,
         "data.max_prompt_tokens": 16, "sampling.max_new_tokens": 8,
         "rl.prompts_per_step": 8, "rl.responses_per_prompt": 2, "rl.micro_batch_size": 4,
         "eval.batch_prompts": 4, "eval.samples_per_problem": 2,
         "sampling.engine": "continuous", "sampling.slots": 4}


def _config(**over):
  spec = importlib.util.spec_from_file_location("tiny_cfg", os.path.join(ROOT, "configs/tiny.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  for key, v in {**SMALL, **over}.items():
    section, name = key.split(".")
    setattr(getattr(c, section), name, v)
  return config_lib.from_config_dict(c)


def _mesh():
  return shd.make_mesh(1, 2, 2, devices=jax.devices()[:4])


def test_sizing_rule_by_hand():
  # W = 16 + 8 - 1 = 23 tokens: 2 pages of 16 per slot; 4 slots: cap 8 pages = 128 tokens.
  size = lambda **kw: kv_pool.size(slots=4, page_size=16, whole_tokens=23,  # noqa: E731
                                   token_bytes_=100.0, **kw)
  assert (size().tokens, size().limited_by) == (128, "no HBM figure")
  # free = 0.9 * 10000 - 3000 = 6000 bytes = 60 tokens: 3 whole pages.
  p = size(memory=kv_pool.Memory(10_000, 3_000, 0.1))
  assert (p.num_pages, p.tokens, p.limited_by, p.free_bytes) == (3, 48, "memory", 6000)
  assert p.bytes_per_chip == 4800
  # Room for more than every slot could use: the cap.
  assert size(memory=kv_pool.Memory(1e9, 0.0, 0.1)).limited_by == "slots"
  assert size(memory=kv_pool.Memory(1e9, 0.0, 0.1)).tokens == 128
  # An explicit size wins, in whole pages.
  assert size(memory=kv_pool.Memory(10_000, 3_000), explicit=40).tokens == 48
  with pytest.raises(ValueError, match="fewer than one whole response"):
    size(memory=kv_pool.Memory(10_000, 6_000, 0.1))   # 1 page < 2
  with pytest.raises(ValueError, match="sampling.kv_tokens=16"):
    size(explicit=16)


def test_sizing_rule_per_replica():
  """With R decode replicas a chip holds one replica's part: the per-chip figures size
  each part, the cap counts S / R slots, and the pool has R times the pages."""
  size = lambda **kw: kv_pool.size(slots=4, page_size=16, whole_tokens=23,  # noqa: E731
                                   token_bytes_=100.0, replicas=2, **kw)
  # Cap: 2 slots x 2 pages per replica, 8 pages in all: as many as one replica of 4 slots.
  assert (size().num_pages, size().tokens, size().replicas) == (8, 128, 2)
  # free 6000 bytes per chip = 3 pages per replica, 6 in all; a chip holds 3 of them.
  p = size(memory=kv_pool.Memory(10_000, 3_000, 0.1))
  assert (p.num_pages, p.tokens, p.limited_by) == (6, 96, "memory")
  assert p.bytes_per_chip == 4800 and "2 replicas of 3 pages" in p.describe()
  # Explicit: the whole pool's tokens, whole pages split evenly (3 pages -> 2 per replica).
  assert size(explicit=40).num_pages == 4
  with pytest.raises(ValueError, match="per replica of 2"):
    size(explicit=20)  # 2 pages: 1 per replica < the 2 a response needs
  with pytest.raises(ValueError, match="must divide slots"):
    kv_pool.size(slots=3, page_size=16, whole_tokens=23, token_bytes_=1.0, replicas=2)


def test_token_bytes_follow_the_pool_sharding():
  cfg = _config()
  mcfg = archs.model_config(cfg)
  # One layer x 2K = 4 combined heads x Dh 16 x float32, heads split over tensor = 2.
  assert kv_pool.token_bytes(mcfg, "float32") == 256
  assert kv_pool.token_bytes(mcfg, "float32", _mesh(), meshes.rules_of(cfg)) == 128


@pytest.mark.parametrize("train_tensor", [0, 1])
def test_run_memory_counts_what_the_compile_check_counts(train_tensor):
  # train_tensor 1: the train states and the rollout batch on the (1, 4, 1) train mesh.
  cfg = _config(**{"rl.kl_coef": 0.1, "mesh.train_tensor": train_tensor})
  mcfg = archs.model_config(cfg)
  mesh = _mesh()
  plan = programs.build(cfg, mcfg, mesh, ("decode_chunk",))
  got = run_memory.resident(cfg, mcfg, mesh, meshes.rules_of(cfg))
  want = {**plan.resident_parts, "decode_copy": plan.rollout_parts["decode_copy"]}
  assert got == want and got["reference"] > 0 and got["critic_state"] > 0
  # The run and the compile check size the pool from the same memory: same engine.
  # Room for 3.5 pages per chip after the headroom; the mesh's 2 batch shards are 2 decode
  # replicas, each with 3 pages (2 slots x 2 pages would be its cap).
  hbm = (sum(got.values()) + 3.5 * 16 * 128) / 0.9
  run_built = sampling.samplers(cfg, None, mcfg, mesh, meshes.rules_of(cfg),
                                inputs.build_text(cfg),
                                memory=run_memory.engine_memory(cfg, mcfg, mesh,
                                                                meshes.rules_of(cfg), hbm=hbm))
  checked = programs.build(cfg, mcfg, mesh, ("decode_chunk",), hbm=hbm)
  assert run_built.rollout.ecfg == checked.engines["rollout"].ecfg
  assert run_built.rollout.ecfg.replicas == 2
  assert run_built.rollout.ecfg.num_pages == 6 and run_built.rollout.pool.limited_by == "memory"


def test_pool_too_small_is_a_config_error_before_any_compile():
  cfg = _config()
  mcfg = archs.model_config(cfg)
  mesh = _mesh()
  text = inputs.build_text(cfg)
  with pytest.raises(ValueError, match="fewer than one whole response"):
    sampling.build_sampler(cfg, None, mcfg, mesh, meshes.rules_of(cfg), text, n=2, rows=16,
                           memory=kv_pool.Memory(1e5, 1e5 * 0.9 - 16 * 128))
  eng = sampling.build_sampler(cfg, None, mcfg, mesh, meshes.rules_of(cfg), text, n=2, rows=16,
                               memory=kv_pool.Memory(1e5, 1e5 * 0.9 - 16 * 128),
                               kv_tokens=40)   # an explicit size wins: 3 pages, 2 per replica
  assert eng.ecfg.num_pages == 4 and eng.pool.limited_by == "explicit"
  # On CPU (no HBM figure): every slot can hold one whole response.
  eng = sampling.build_sampler(cfg, None, mcfg, mesh, meshes.rules_of(cfg), text, n=2, rows=16)
  assert (eng.ecfg.slots, eng.ecfg.num_pages, eng.pool.limited_by) == (4, 8, "no HBM figure")


def test_compile_check_lowers_the_engine_programs():
  cfg = _config()
  mcfg = archs.model_config(cfg)
  mesh = _mesh()
  plan = programs.build(cfg, mcfg, mesh)
  # Packed train programs (the default) carry their shape: policy_step[rows=nxT].
  names = [p.name.split("[")[0] for p in plan.programs]
  assert names == ["policy_step", "critic_step", "logprobs", "values", "decode_copy",
                   "prefill", "insert", "decode_chunk", "eval_insert", "eval_decode_chunk"]
  progs = {p.name.split("[")[0]: p for p in plan.programs}
  e = plan.engines["rollout"]
  assert progs["decode_chunk"].trips == e.ecfg.chunk_steps == cfg.sampling.chunk_steps
  assert "kv_pool" in progs["decode_chunk"].resident and "decode_copy" in progs["insert"].resident
  assert "kv_pool" not in progs["policy_step"].resident
  assert "eval_kv_pool" in progs["eval_decode_chunk"].resident
  # The pool as resident: pages x Ps x 2K x Dh x 4 bytes / the 2 tensor shards / the 2
  # decode replicas (a chip holds its replica's pages).
  assert e.ecfg.replicas == 2
  assert plan.rollout_parts["kv_pool"] == e.ecfg.num_pages * 16 * 4 * 16 * 4 // 2 // 2
  # The decode copy: the policy's parameters, FSDP dropped (here float32, as model.dtype).
  assert plan.rollout_parts["decode_copy"] > kv_pool.per_device_bytes(
      progs["decode_copy"].args[0])
  # 16 responses, 4 slots, all to max_new_tokens = 8: four waves of 8 steps, in one chunk each.
  assert plan.shapes["engine_decode_steps"] == 32 and plan.shapes["engine_chunks"] == 2
  for p in plan.programs[4:]:
    p.fn.lower(*p.args, **p.kwargs).compile()   # exactly what a rollout runs


def test_step_model_describes_the_built_engine():
  cfg = _config(**{"mesh.tensor": 2})   # as _mesh(): 2 batch shards = 2 decode replicas
  mcfg = archs.model_config(cfg)
  plan = programs.build(cfg, mcfg, _mesh())
  shapes = {k: step_model.EngineShape.of(plan.engines[k].ecfg) for k in ("rollout", "eval")}
  s = slices.parse("v5e-4")
  st = step_model.Setup.of(cfg, mcfg, s, step_model.Knobs(rollout="continuous"), shapes)
  assert st.engine == shapes["rollout"] and st.eval_engine == shapes["eval"]
  # The step model's prompt buckets are the built engine's (`run.sampling.build_sampler`): its
  # prefill as it runs pads every prompt to them.
  assert plan.engines["rollout"].cfg.prompt_buckets == st.prompt_buckets
  # Without the plan, the step model sizes the same engines itself (here: slot-bound).
  assert step_model.Setup.of(cfg, mcfg, s).engine == shapes["rollout"]
  # Every response to max_new_tokens: the compile check's decode steps.
  resp = np.full(st.rows, cfg.sampling.max_new_tokens)
  prog = step_model.continuous_rollout(st, resp, np.full(st.rows, 16), False, engine=st.engine)
  assert prog.steps == plan.shapes["engine_decode_steps"]
  assert st.engine.replicas == 2 and "as built: 2 replicas × TP2 of 2 slots" in prog.note


def test_the_engine_samples_rollout_and_evaluation_by_default():
  c = importlib.util.spec_from_file_location("tiny_cfg", os.path.join(ROOT, "configs/tiny.py"))
  mod = importlib.util.module_from_spec(c)
  c.loader.exec_module(mod)
  cfg = config_lib.from_config_dict(mod.get_config())
  assert cfg.sampling.engine == config_lib.SamplingSection().engine == "continuous"
  mcfg = archs.model_config(cfg)
  mesh = meshes.build_mesh(cfg)
  built = sampling.samplers(cfg, None, mcfg, mesh, meshes.rules_of(cfg), inputs.build_text(cfg))
  for s in (built.rollout, built.eval, built.greedy):
    assert getattr(s, "continuous", False), s
  assert built.eval.cfg.n_per_prompt == cfg.eval.samples_per_problem
  assert built.greedy.cfg.greedy and built.rollout.ecfg.slots == cfg.rl.rollout_prompts * (
      cfg.rl.group_size)
