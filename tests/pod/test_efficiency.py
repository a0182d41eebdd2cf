"""Issue 55 item 1 on cases counted by hand: the train programs' MFU (MaxText's model FLOPs)
and HFU (executed FLOPs), one meaning of --mfu in the estimate and the floor, the engine's
decode all-reduce bytes, and the compile line."""

import dataclasses

import numpy as np
import pytest

from vapo_jax.pod import step as step_model
from vapo_jax.pod.step import compiles
from vapo_jax.pod.step import counts as step_counts
from vapo_jax.pod.step import efficiency
from vapo_jax.pod.step import terms as step_terms

# L 1, D 2, F 3, H 1, K 1, Dh 2, V 5: m = 2 (2·2·3 + 1·2·2 + 3·2·3) = 68 FLOPs per token,
# a = 4·1·1·2 = 8 per pair, LM head 2·2·5 = 20, value head 2 D = 4 per position.
TINY = step_counts.Arch(1, 2, 3, 1, 1, 2, 5, 100.0, 90.0, 512, "dense", 0.0)
# L 2, D 8, F 8, H 2, K 1, Dh 4, V 16 (the step-terms tests' architecture).
ARCH = step_counts.Arch(2, 8, 8, 2, 1, 4, 16, 1000.0, 900.0, 512, "blocked", False,
                        untied=False)


def _setup(arch=ARCH, **knobs):
  return step_model.Setup(arch, chips=8, tensor=4, peak=1e6, bw=1e9, hbm=1e12, ici=1e9,
                          rows=4, n=2, prompt_len=8, max_new=8, per_call=2,
                          windows=((1, 8, 11),), epochs=1, use_critic=True, param_bytes=4,
                          eval_rows=0, eval_per_call=2, eval_every=1,
                          knobs=step_model.Knobs(mfu=0.5, **knobs), prompt_buckets=(8,))


def test_tiny_arch_figures():
  assert (TINY.matmul, TINY.pair, TINY.head) == (68.0, 8.0, 20.0)


def test_model_flops_count_real_tokens_causal_pairs_and_response_heads():
  st = dataclasses.replace(_setup(TINY), chips=1)
  # One sequence: prompt 1, response 2, n = 3: 3 · 68 + 3·4/2 · 8 + heads.
  # policy forward 204 + 48 + 2 · 20 = 292; critic forward 204 + 48 + 2 · 4 = 260.
  # old log-probs 292 + values 260 + policy update 3 · 292 + critic update 3 · 260 = 2,208.
  assert efficiency.model_flops(st, np.array([2]), np.array([1])) == pytest.approx(2208.0)
  # Two epochs, no old-log-prob pass, no critic: 2 · 3 · 292; on 4 chips a quarter.
  st2 = dataclasses.replace(st, epochs=2, old_logprobs_pass=False, use_critic=False, chips=4)
  assert efficiency.model_flops(st2, np.array([2]), np.array([1])) == pytest.approx(438.0)


def test_mfu_and_hfu_over_the_train_programs_time():
  st = _setup()
  progs = [step_model.Program("rollout", flops=1e9, terms={"decode weights": 100.0}),
           step_model.Program("policy_step", flops=3e6, terms={"matmul": 4.0, "collectives": 1.0}),
           step_model.Program("values", flops=1e6, terms={"matmul": 5.0})]
  e = efficiency.of(st, progs, model=2e6)
  # Train time 10 s at 1e6 FLOP/s peak: HFU 4e6 / 1e7, MFU 2e6 / 1e7; the rollout not counted.
  assert (e["seconds"], e["hfu"], e["mfu"]) == pytest.approx((10.0, 0.4, 0.2))


def test_the_floor_runs_its_flops_at_its_knob_and_mfu_counts_attention_3x():
  st = _setup()
  resp, prompts = np.array([3, 5, 2, 6]), np.array([3, 3, 2, 2])
  flo = step_model.floor(st, resp, prompts)
  model = efficiency.model_flops(st, resp, prompts)
  e = efficiency.of(st, flo.programs, model)
  # No collectives in the floor: its train programs run their FLOPs at --mfu_ceiling exactly.
  assert e["hfu"] == pytest.approx(st.knobs.mfu_ceiling)
  # It executes the model FLOPs but for the attention backward's score recompute: 0.5 a per
  # causal pair in each update (policy and critic, one epoch).
  n = (prompts + resp).astype(float)
  extra = 0.5 * (n * (n + 1) / 2).sum() * ARCH.pair * 2 / st.chips
  assert e["executed"] - model == pytest.approx(extra)


def test_mfu_means_one_thing_in_floor_and_estimate():
  st = _setup(mfu_ceiling=0.5)
  resp, prompts = np.array([3, 5, 2, 6]), np.array([3, 3, 2, 2])
  base = step_model.floor(st, resp, prompts)
  at4 = step_model.floor(dataclasses.replace(st, knobs=dataclasses.replace(
      st.knobs, mfu_ceiling=0.4)), resp, prompts)
  train = ("logprobs", "values", "policy_step", "critic_step")
  # The floor's train programs are compute alone: at 0.4 they take 0.5 / 0.4 of their time.
  for p, q in zip(base.programs, at4.programs):
    if p.name in train:
      assert q.time == pytest.approx(p.time * 0.5 / 0.4)
  # run() reports the floor at the estimate's own knob too (the like-for-like ratio).
  st4 = dataclasses.replace(st, knobs=dataclasses.replace(st.knobs, mfu=0.4))
  r = step_model.run(st4, "fixed:5", "fixed:3")
  resp4, prompts4 = step_model.lengths_for(st4, "fixed:5", "fixed:3")
  same = step_model.floor(dataclasses.replace(st4, knobs=dataclasses.replace(
      st4.knobs, mfu_ceiling=0.4)), resp4, prompts4)
  assert r["floor_same_s"] == pytest.approx(same.time) and r["floor_s"] < same.time
  assert r["ratio_same"] == pytest.approx(r["estimate_s"] / same.time)
  text = step_model.format_report("t", r)
  assert "at equal compute efficiency (the floor at --hfu=0.4 too, not 0.5)" in text
  assert "efficiency of the train programs" in text


def test_decode_all_reduce_bytes_per_row_and_step():
  st = _setup()
  # 2 L · D · 2 bytes · 2 (tp − 1) / tp / (ICI · 1/3): 2·2·8·2 · 1.5 / (1e9 / 3) at TP4.
  assert step_terms.decode_allreduce_s(st, 4) == pytest.approx(96.0 / (1e9 / 3))
  assert step_terms.decode_allreduce_s(st, 1) == 0.0
  # qwen2.5-32b at TP4, 128 slots per replica, 200 GB/s: 1.26 ms per step (the review's).
  q = dataclasses.replace(st, arch=dataclasses.replace(ARCH, layers=64, d=5120), ici=600e9)
  assert 128 * step_terms.decode_allreduce_s(q, 4) == pytest.approx(1.258e-3, rel=1e-3)


def test_built_engine_pays_all_reduce_bytes_for_every_slot_of_every_step():
  st = _setup()
  # A pool of 64 tokens per replica: no response is evicted (tests/pod/test_rollout_pool.py).
  eng = step_model.EngineShape(slots=4, page_size=4, kv_tokens=128, chunk_steps=4, replicas=2,
                               kernel="jax", overlap=True)
  resp, prompts = np.array([3, 5, 2, 6]), np.array([3, 3, 2, 2])
  prog = step_model.continuous_rollout(st, resp, prompts, floor=False, engine=eng)
  # The slowest replica (responses 5 and 6) runs 6 steps of its 2 slots, live or not.
  assert prog.steps == 6
  assert prog.terms["decode all-reduce bytes"] == pytest.approx(
      6 * 2 * step_terms.decode_allreduce_s(st, 4))
  assert step_model.continuous_rollout(st, resp, prompts, floor=True).terms[
      "decode all-reduce bytes"] == 0.0   # the floor: no collective costs


def test_compile_line_counts_the_bounded_set_and_prefers_measured_times():
  from vapo_jax import packing  # pylint: disable=import-outside-toplevel
  spec = packing.PackSpec.from_budget(64, 16, 1, 2)   # rows of 16, two row lengths
  lens = spec.row_lens()
  st = dataclasses.replace(_setup(compile_s=10.0, train="packed", rollout="continuous"),
                           pack_forward=spec, pack_steps=spec, prompt_buckets=(4, 8),
                           eval_rows=2, run_steps=5)
  names = compiles.program_set(st)
  # 4 passes × one program per row length, the engine's copy, 2 prefills, insert, chunk,
  # and the evaluation engine's insert and chunk.
  assert len(names) == 4 * len(lens) + 1 + 2 + 2 + 2
  assert "prefill[4]" in names and "eval_decode_chunk" in names
  first = f"policy_step[rows={spec.at(lens[0]).max_rows}x{lens[0]}]"
  assert first in names
  st = dataclasses.replace(st, compile_times={first: 30.0, "prefill": 2.0, "insert": 1.0},
                           compile_note=" (probes)")
  assert compiles.seconds(st, first) == (30.0, True)
  assert compiles.seconds(st, "prefill[8]") == (2.0, True)   # the family's time
  assert compiles.seconds(st, "decode_chunk") == (10.0, False)  # assumed, said so
  assert compiles.seconds(st, "eval_insert") == (10.0, False)   # another program's family
  total, line = compiles.line(st)
  # Every policy_step row length takes the measured one's 30 s, both prefills 2, insert 1.
  measured = len(lens) + 2 + 1
  want = 30.0 * len(lens) + 2 * 2.0 + 1.0 + 10.0 * (len(names) - measured)
  assert total == pytest.approx(want)
  assert f"{measured} timed by the compile check (probes)" in line and "assumed 10 s" in line
  assert f"{total / 5:.1f} s per step" in line


def test_compile_times_from_a_compile_check_report():
  rep = [{"slice": "v5p-8", "programs": {"a": {"compile_s": 1.0, "error": ""}}},
         {"slice": "v5p-128", "extrapolated_from_layers": [4, 8],
          "programs": {"a": {"compile_s": 3.0, "error": ""},
                       "b": {"compile_s": 9.0, "error": "RESOURCE_EXHAUSTED"}}}]
  got = compiles.from_check(rep, "v5p-128")
  assert got == {"compile_times": {"a": 3.0},
                 "compile_note": " (probes of 4 and 8 layers, summed)"}
  assert compiles.from_check(rep, "v6e-8")["compile_times"] == {"a": 1.0}
