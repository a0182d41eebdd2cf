"""The step model's terms beyond FLOPs and bytes (`pod.step.terms`), on cases counted by hand:
the engine's prefill as it runs, the host gap per decode chunk, the Pallas kernel's KV blocks,
the train programs' HLO collectives, and code paths that follow the config."""

import dataclasses
import functools
import importlib.util
import json
import os

import numpy as np
import pytest

from vapo_jax import config as config_lib
from vapo_jax.sampler import ops
from vapo_jax.pod import archs
from vapo_jax.pod import host_gap
from vapo_jax.pod.step import counts as step_counts
from vapo_jax.pod import step as step_model
from vapo_jax.pod.step import terms as step_terms
from vapo_jax.pod import slices
from vapo_jax.pod import train_hlo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# L 2, D 8, F 8, H 2, K 1, Dh 4, V 16: matmul 1,536 FLOPs per token, 64 per pair, head 256.
ARCH = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1000.0, 900.0, 512, "blocked", False,
                        untied=False)


def _setup(**knobs):
  return step_model.Setup(ARCH, chips=8, tensor=4, peak=1e6, bw=1e9, hbm=1e12, ici=1e9,
                          rows=4, n=2, prompt_len=8, max_new=8, per_call=2,
                          windows=((1, 8, 11),), epochs=1, use_critic=True, param_bytes=4,
                          eval_rows=0, eval_per_call=2, eval_every=1,
                          knobs=step_model.Knobs(mfu=0.5, **knobs), prompt_buckets=(8,))


def test_arch_figures_used_below():
  assert (ARCH.matmul, ARCH.pair, ARCH.head) == (1536.0, 64.0, 256.0)


def test_engine_prefill_pads_to_the_bucket_on_every_replica():
  st = _setup()
  secs, flops, coll, line = step_terms.engine_prefill(st, np.array([3, 5]), tp=4, replicas=2)
  # Per prompt at bucket 8: 8 tokens × 1,536 + 64 pairs (one 8-key block) × 64 + one head
  # position × 256 = 16,640 FLOPs; two prompts over TP4: 8,320 per chip, at 0.5 × 1e6 FLOP/s.
  assert flops == pytest.approx(8320.0)
  # 2 prompts × (2L + 2) = 12 all-reduces at 7 µs; activations 2 L · 8 tokens · D · 2 bytes =
  # 512 per prompt, ring factor 2 · 3/4, at ICI 1e9 × 1/3.
  want = 8320 / 5e5 + 12 * 7e-6 + 1.5 * 2 * 512 / (1e9 / 3)
  assert secs == pytest.approx(want) and coll == 12
  assert "2 prompts padded to [8] tokens" in line and "all 2 decode replicas" in line


def test_built_rollout_counts_prefill_host_gap_and_kernel_blocks():
  st = _setup(host_chunk_ms=10.0)
  eng = step_model.EngineShape(slots=4, page_size=4, kv_tokens=128, chunk_steps=4, replicas=2,
                               kernel="tpu", pages_per_block=8, overlap=False)
  resp, prompts = np.array([3, 5, 2, 6]), np.array([3, 3, 2, 2])
  prog = step_model.continuous_rollout(st, resp, prompts, floor=False, engine=eng)
  # With overlap each chunk hides the host's work behind its own device time: 2 chunks ×
  # (10 ms − the slowest replica's decode seconds / 2).
  lapped = step_model.continuous_rollout(st, resp, prompts, floor=False,
                                         engine=dataclasses.replace(eng, overlap=True))
  decode_s = sum(v for k, v in lapped.terms.items()
                 if k.startswith("decode") and k != "decode compute") + max(
                     0.0, lapped.terms["decode compute"])
  assert 0 < decode_s < 0.02
  assert lapped.terms["host gap"] == pytest.approx(2 * (0.01 - decode_s / 2))
  assert any("overlapped with the chunk in flight" in x for x in lapped.lines)
  # Prefill: prompts 0 and 1 (one per n = 2 responses), both at bucket 8, on both replicas.
  want, _, _, _ = step_terms.engine_prefill(st, np.array([3, 2]), 4, 2)
  assert prog.terms["prefill"] == pytest.approx(want)
  # Replica 0 runs responses 3 and 2, replica 1 runs 5 and 6: the slowest runs 6 steps,
  # ⌈6 / 4⌉ = 2 chunks × 10 ms.
  assert prog.steps == 6 and prog.terms["host gap"] == pytest.approx(0.02)
  # max_pages = ⌈(8 + 8 − 1) / 4⌉ = 4, so blocks of 4 pages = 16 tokens: 7.5 tokens more per
  # live slot and step; replica 1 has 2 live slots for 5 steps and 1 for one: 11 slot-steps,
  # at kv_bytes / tp = 2·2·1·4·2 / 4 = 8 bytes per token and 0.7 × 1e9 B/s.
  assert prog.terms["decode kernel blocks"] == pytest.approx(11 * 7.5 * 8 / 0.7e9)
  assert any("16 tokens per KV block" in x for x in prog.lines)


def test_kernel_block_tokens():
  eng = step_model.EngineShape(1024, 16, 10**6, 16, 16, kernel="tpu", pages_per_block=8)
  assert step_terms.kernel_block_tokens(eng, 1344) == 128      # 8 divides 1,344
  assert step_terms.kernel_block_tokens(eng, 12) == 96          # 6: largest divisor <= 8
  jax_eng = step_model.EngineShape(1024, 16, 10**6, 16, 16, kernel="jax")
  assert step_terms.kernel_block_tokens(jax_eng, 1344) == 0


def test_host_gap_scales_by_chunks():
  # The audit's late phase: 65,720 decode steps in chunks of 16 = 4,108 chunks × 20 ms.
  assert host_gap.gap_seconds(0.02, 65_720, 16) == pytest.approx(82.16)
  assert host_gap.gap_seconds(0.5, 17, 16) == pytest.approx(1.0)   # 2 chunks
  assert host_gap.gap_seconds(0.5, 0, 16) == 0.0


def test_host_gap_exposed_with_overlap():
  # The chips wait only for the host time a chunk's own decode does not cover.
  assert host_gap.exposed_seconds(0.02, 0.015, 10) == pytest.approx(0.05)
  assert host_gap.exposed_seconds(0.01, 0.02, 10) == 0.0


def test_host_gap_measure_takes_the_median_chunk():
  # A fake clock: the three chunks take 3, 1 and 2 units.
  clock = functools.partial(next, iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0]))
  per = host_gap.measure_chunk(4, 4, 8, 32, 1, 4, 8, 4, 1, 3, clock=clock)
  assert per == 2.0
  # With the real clock on a small engine it runs the engine's host calls and is positive.
  assert host_gap.measure_chunk(8, 4, 8, 64, 2, 4, 8, 4, 2, 2) > 0


def test_train_collectives_from_hlo_figures(tmp_path):
  sp = train_hlo.Split(train_hlo.Side(exposed=3, exposed_wire=3e6, overlapped=2,
                                      overlapped_wire=1e6),
                       train_hlo.Side(exposed=1, exposed_wire=2e6), {"all-gather": 6})
  path = tmp_path / "c.json"
  path.write_text(json.dumps({"programs": {"policy_step": sp.as_dict(),
                                           "logprobs": sp.as_dict()}}))
  st = _setup(train_collectives=str(path))
  secs, hidden, line = step_terms.train_collectives(st, "policy_step", 10, 2)
  # 10 micro-batches × (3 × 7 µs + 3 MB / (1e9 / 3)) + 2 calls × (7 µs + 2 MB / (1e9 / 3)).
  assert secs == pytest.approx(10 * (21e-6 + 3e6 / (1e9 / 3)) + 2 * (7e-6 + 2e6 / (1e9 / 3)))
  # The overlapped ones: 10 × (2 × 7 µs + 1 MB / (1e9 / 3)) = 0.03 s, hidden.
  assert hidden == pytest.approx(10 * (14e-6 + 1e6 / (1e9 / 3)))
  assert "hidden by XLA's schedule 0 s" in line
  # A program the file lacks comes back empty: train_side counts it from the layout.
  assert step_terms.train_collectives(st, "critic_step", 10, 2) == (0.0, 0.0, "")
  progs = {p.name: p for p in step_model.train_side(st, np.array([3, 5, 2, 6]),
                                                    np.array([3, 3, 2, 2]))}
  assert any("critic_step collectives from the layout (FSDP 2 × TP 4" in line
             for line in progs["critic_step"].lines)
  # A file compiled for the other train layout is not used for this one.
  other = tmp_path / "fsdp.json"
  other.write_text(json.dumps({"train_layout": "fsdp", "programs": {
      "policy_step": sp.as_dict()}}))
  assert step_terms.train_collectives(_setup(train_collectives=str(other)), "policy_step",
                                      10, 2) == (0.0, 0.0, "")
  fsdp = dataclasses.replace(_setup(train_collectives=str(other)), train_tensor=1)
  assert step_terms.train_collectives(fsdp, "policy_step", 10, 2)[0] > 0
  # A file compiled on a train mesh of its own (mesh.train_tensor=2: "train_tp" 2) serves a
  # setup of 2 train tensor shards only.
  tp2 = tmp_path / "tp2.json"
  tp2.write_text(json.dumps({"train_layout": "shared", "train_tp": 2, "programs": {
      "policy_step": sp.as_dict()}}))
  assert step_terms.train_collectives(_setup(train_collectives=str(tp2)), "policy_step",
                                      10, 2) == (0.0, 0.0, "")
  two = dataclasses.replace(_setup(train_collectives=str(tp2)), train_tensor=2)
  assert step_terms.train_collectives(two, "policy_step", 10, 2)[0] > 0
  # Padded rows, one mini-batch of 4 rows in one micro-batch: 1 trip, 1 call.
  assert progs["policy_step"].terms["collectives"] == pytest.approx(
      step_terms.train_collectives(st, "policy_step", 1, 1)[0])
  # Without a file every program's collectives come from its layout.
  bare = step_model.train_side(_setup(), np.array([3]), np.array([3]))[0]
  assert bare.terms["collectives"] > 0
  assert any("logprobs collectives from the layout" in line for line in bare.lines)


def test_permutes_priced_per_link_and_programs_bounded_by_hidden_traffic(tmp_path):
  """A collective-permute sends over one link one way (ICI / 6), the rings of the other
  collectives over two (ICI / 3); a file from before the permutes were told apart prices
  every byte at the link's; a program takes at least the time of the traffic it hides, and
  the optimistic reading (`Knobs.optimistic`) counts neither."""
  side = train_hlo.Side(exposed=1, exposed_wire=4e6, exposed_permute_wire=3e6,
                        overlapped=1, overlapped_wire=6e8, overlapped_permute_wire=6e8)
  sp = train_hlo.Split(side, train_hlo.Side())
  path = tmp_path / "p.json"
  path.write_text(json.dumps({"programs": {n: sp.as_dict() for n in
                                           ("logprobs", "values", "policy_step",
                                            "critic_step")}}))
  st = _setup(train_collectives=str(path))
  secs, hidden, _ = step_terms.train_collectives(st, "policy_step", 1, 0)
  # 7 µs + 1 MB at 1e9/3 + 3 MB at 1e9/6; hidden 7 µs + 600 MB at 1e9/6.
  assert secs == pytest.approx(7e-6 + 1e6 / (1e9 / 3) + 3e6 / (1e9 / 6))
  assert hidden == pytest.approx(7e-6 + 6e8 / (1e9 / 6))
  opt = dataclasses.replace(st, knobs=st.knobs.optimistic())
  assert step_terms.train_collectives(opt, "policy_step", 1, 0)[0] == pytest.approx(
      7e-6 + 4e6 / (1e9 / 3))
  # Not told apart (no permute fields in the file): every byte at the link's.
  d = sp.as_dict()
  for part in ("per_trip", "per_call"):
    d[part].pop("exposed_permute_wire")
    d[part].pop("overlapped_permute_wire")
  old = tmp_path / "old.json"
  old.write_text(json.dumps({"programs": {"policy_step": d}}))
  got = step_terms.train_collectives(_setup(train_collectives=str(old)), "policy_step", 1, 0)
  assert got[0] == pytest.approx(7e-6 + 4e6 / (1e9 / 6))
  # The hidden 3.6 s exceed this tiny program's compute: it takes their time.
  resp, prompts = np.array([3, 5, 2, 6]), np.array([3, 3, 2, 2])
  progs = {p.name: p for p in step_model.train_side(st, resp, prompts)}
  p = progs["policy_step"]
  compute = p.terms["matmul"] + p.terms["attention"]
  assert p.terms["hidden traffic beyond compute"] == pytest.approx(p.hidden - compute)
  assert p.time == pytest.approx(p.hidden + p.terms["collectives"])
  assert any("of its" in line and "takes the traffic's time" in line for line in p.lines)
  free = {p.name: p for p in step_model.train_side(opt, resp, prompts)}["policy_step"]
  assert "hidden traffic beyond compute" not in free.terms


def _tiny(**over):
  spec = importlib.util.spec_from_file_location("t", os.path.join(ROOT, "configs/tiny.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  for key, v in over.items():
    sec, name = key.split(".")
    c[sec][name] = v
  return config_lib.from_config_dict(c)


def test_code_paths_follow_the_config():
  s = slices.parse("v5e-4")
  cfg = _tiny()
  assert cfg.rl.packing and cfg.sampling.engine == "continuous"
  st = step_model.Setup.of(cfg, archs.model_config(cfg), s)
  assert (st.knobs.train, st.knobs.rollout) == ("packed", "continuous")
  old = _tiny(**{"rl.packing": False, "sampling.engine": "static"})
  st = step_model.Setup.of(old, archs.model_config(old), s)
  assert (st.knobs.train, st.knobs.rollout) == ("padded", "static")
  # A flag still overrides the config.
  st = step_model.Setup.of(cfg, archs.model_config(cfg), s, step_model.Knobs(train="padded"))
  assert (st.knobs.train, st.knobs.rollout) == ("padded", "continuous")
  # The engine's real-length buckets (`sampling.prompt_bucket_min`), the static sampler's one.
  assert st.prompt_buckets == ops.power_buckets(cfg.data.max_prompt_tokens,
                                                cfg.sampling.prompt_bucket_min)
  assert st.prompt_buckets[-1] == cfg.data.max_prompt_tokens
  st = step_model.Setup.of(old, archs.model_config(old), s)
  assert st.prompt_buckets == (old.data.max_prompt_tokens,)


def test_train_layouts_counted_by_hand():
  """`train_layout` on 4 sequences of 8 + 8 tokens, rows of 16, one row per device, on 8
  chips: FSDP 2 × TP 4 (K 2 micro-batches of 2 rows) and FSDP 8 only (one of 8 rows)."""
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  spec = packing.PackSpec(16, 1, 2)
  st = dataclasses.replace(_setup(), pack_forward=spec, pack_steps=spec)
  resp, prompts = np.full(4, 8), np.full(4, 8)
  bw, lat = 1e9 / 3, 7e-6
  tp4 = step_terms.train_layout(st, 4, resp, prompts)
  assert (tp4["shards"], tp4["fwd_micro"], tp4["upd_micro"]) == (2, 2, 2)
  # Per micro-batch, (D - 1) / (D tp) = 1/8 of W · 4 bytes, W = 1,000 + 900 (both learners):
  # forwards (old log-probs, values) 2 × 1,900 · 0.5; updates 2 × 2 gathers (no remat).
  assert tp4["gather_bytes"] == pytest.approx(2 * 1900 * 0.5 + 2 * 2 * 1900 * 0.5)
  assert tp4["scatter_bytes"] == pytest.approx(2 * 1900 * 0.5)
  # TP all-reduces of t_dev · D_model · 2 = 16 · 8 · 2 = 256 bytes, wire 1.5×: forwards 2
  # passes × 2 per layer × 2 layers × 2 micro-batches, updates 2 × 4 × 2 × 2.
  assert (tp4["ar_count"], tp4["ar_bytes"]) == (16 + 32, pytest.approx(48 * 384))
  assert tp4["fsdp_count"] == 2 * 2 * 2 + 2 * 2 * 3 * 2
  assert tp4["ar_s"] == pytest.approx(48 * lat + 48 * 384 / bw)
  assert tp4["fsdp_s"] == pytest.approx(32 * lat + (5700 + 1900) / bw)
  # Memory: states 3 · 4 · 1,900 / 8, no remat checkpoints, MLP 3 · 16 · 8 · 2 / 4, and both
  # blocks kept (no remat): 2 · 16 tokens · 2 (4 · 8 + (2·2·4 + 2·1·4 + 3·8) / 4) = 2,816.
  assert (tp4["checkpoint_bytes"], tp4["mlp_bytes"]) == (0.0, 192.0)
  assert tp4["kept_bytes"] == pytest.approx(2816)
  assert tp4["memory_bytes"] == pytest.approx(2850 + 2816 + 192)
  # Half the blocks rematerialised: half the kept activations, one block's checkpoints.
  half = step_terms.train_layout(dataclasses.replace(
      st, arch=dataclasses.replace(ARCH, remat=0.5)), 4, resp, prompts)
  assert half["kept_bytes"] == pytest.approx(1408)
  assert half["checkpoint_bytes"] == pytest.approx(16 * 8 * 2)
  # Both blocks rematerialised, one selectively: the full one gathers once more and adds 2
  # all-reduces per update; the selective one recomputes no matmul, and keeps q, o (2·4 each),
  # k, v (1·4 each), gate, up (8 each) over tp 4, bf16, and its log-sum-exp (4 H / tp bytes):
  # 16 tokens · (2 (16 + 8 + 16) / 4 + 4 · 2 / 4) = 352 bytes beside two blocks' inputs.
  sel = step_terms.train_layout(dataclasses.replace(
      st, arch=dataclasses.replace(ARCH, remat=1.0, selective=0.5)), 4, resp, prompts)
  full = step_terms.train_layout(dataclasses.replace(
      st, arch=dataclasses.replace(ARCH, remat=1.0)), 4, resp, prompts)
  assert sel["gather_bytes"] == pytest.approx(2 * 1900 * 0.5 + 2 * 2.5 * 1900 * 0.5)
  assert full["gather_bytes"] == pytest.approx(2 * 1900 * 0.5 + 2 * 3 * 1900 * 0.5)
  assert sel["ar_count"] == 16 + 2 * 2 * 5 * 2 and full["ar_count"] == 16 + 2 * 2 * 6 * 2
  assert sel["kept_bytes"] == full["kept_bytes"] == 0.0
  assert sel["checkpoint_bytes"] == pytest.approx(2 * 16 * 8 * 2 + 352)
  fsdp = step_terms.train_layout(st, 1, resp, prompts)
  assert (fsdp["shards"], fsdp["fwd_micro"], fsdp["upd_micro"]) == (8, 1, 1)
  assert fsdp["gather_bytes"] == pytest.approx((1900 + 2 * 1900) * 4 * 7 / 8)
  assert fsdp["scatter_bytes"] == pytest.approx(1900 * 4 * 7 / 8)
  assert fsdp["ar_bytes"] == fsdp["ar_count"] == fsdp["ar_s"] == 0
  assert fsdp["mlp_bytes"] == 3 * 16 * 8 * 2
  line = step_terms.layout_line(st, fsdp, 10.0)
  assert line.startswith("FSDP 8 only: 1 forward / 1 update micro-batches")


def test_compare_layouts_prints_both_meshes():
  cfg = _tiny(**{"mesh.tensor": 2})
  st = step_model.Setup.of(cfg, archs.model_config(cfg), slices.parse("v5e-4"),
                           step_model.Knobs(compare_layouts=True, host_chunk_ms=1.0))
  r = step_model.run(st, "fixed:4", "fixed:4")
  assert [x.split(":")[0] for x in r["layouts"]] == ["FSDP 2 × TP 2", "FSDP 4 only"]
  report = step_model.format_report("t", r)
  assert report.count("  train layout FSDP") == 2
  plain = step_model.run(dataclasses.replace(st, knobs=dataclasses.replace(
      st.knobs, compare_layouts=False)), "fixed:4", "fixed:4")
  assert plain["layouts"] == [] and plain["estimate_s"] == pytest.approx(r["estimate_s"])


def test_the_step_model_keeps_the_kernel_past_one_calls_table_in_slot_groups():
  # qwen32b on v5p-128: 16 decode replicas of 1,344 pages per slot. 2,048 slots (128 per
  # replica) fit one kernel call's scalar memory; 4,096 (256) run in 2 calls of 128 and
  # keep jax's Pallas kernel (before slot groups the step model fell back to pure JAX).
  spec = importlib.util.spec_from_file_location("q", os.path.join(ROOT, "configs/qwen32b.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  s = slices.parse("v5p-128")
  for slots, calls in ((2048, 1), (4096, 2)):
    c = mod.get_config()
    c.sampling.slots = slots
    c = config_lib.from_config_dict(c)
    eng = step_model.Setup.of(c, archs.model_config(c, "qwen2.5-32b"), s).engine
    assert (eng.slots // eng.replicas, eng.kernel) == (slots // 16, "tpu")
    assert step_terms.slot_groups(eng, 1344) == (calls, 128)


def test_layout_collectives_counted_by_hand():
  # 8 chips; ARCH: W = 1,000 parameters (fp32 masters: 4 bytes), L = 2, D = 8, no remat.
  # ICI 1e9 × 1/3 per collective, 7 µs each.
  bw, lat = 1e9 / 3, 7e-6
  tp4 = _setup()  # train on FSDP 2 × TP 4: a chip holds W / 8 and gathers the other half
  micro = [(2, 8), (2, 8)]  # two update micro-batches of 2 rows × 8 tokens
  secs, line = step_terms.layout_collectives(tp4, "policy_step", micro, True, 1000.0,
                                             compute_s=0.0)
  gather = 2 * 2 * 1000 * 4 * (1 / 2) / 4     # 2 micro × 2 gathers (fwd, bwd) × W b (D−1)/(D tp)
  scatter = 2 * 1000 * 4 * (1 / 2) / 4        # a fp32 gradient reduce-scatter per micro-batch
  fsdp_s = 2 * 3 * 2 * lat + (gather + scatter) / bw
  # TP all-reduces: 4 per layer per update micro-batch, each of 8 rows·tokens / 2 shards ·
  # D · 2 bytes, ring factor 2 · 3/4.
  ar_n = 2 * 4 * 2
  ar_s = ar_n * lat + ar_n * 1.5 * (16 / 2) * 8 * 2 / bw
  # With no compute to hide behind, every FSDP collective is exposed.
  assert secs == pytest.approx(ar_s + fsdp_s)
  assert "FSDP 2 × TP 4" in line and "TP all-reduces 16" in line
  # Behind ample compute only the first layer's gather of each pass stays exposed.
  hidden, _ = step_terms.layout_collectives(tp4, "policy_step", micro, True, 1000.0,
                                            compute_s=1e6)
  first = 2 * 2 * (1000 / 2 * 4 * (1 / 2) / 4 / bw + lat)
  assert hidden == pytest.approx(ar_s + first)
  # Selective remat (both blocks, all selective): no forward recompute, so the update's
  # gathers and all-reduces are those without remat.
  sel = dataclasses.replace(tp4, arch=dataclasses.replace(ARCH, remat=1.0, selective=1.0))
  assert step_terms.layout_collectives(sel, "policy_step", micro, True, 1000.0,
                                       compute_s=0.0)[0] == pytest.approx(ar_s + fsdp_s)
  # FSDP only (train_tensor 1): 8 shards, no all-reduces; a forward pass gathers once.
  fsdp = dataclasses.replace(tp4, train_tensor=1)
  secs, line = step_terms.layout_collectives(fsdp, "values", micro, False, 900.0,
                                             compute_s=0.0)
  assert secs == pytest.approx(2 * 2 * lat + 2 * 900 * 4 * (7 / 8) / bw)
  assert "FSDP 8 only" in line and "all-reduces" not in line
