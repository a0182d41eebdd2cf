"""benchmarks/calibrate_train.py at --toy on the CPU (issue 55 item 3): every stage in its
JSON, FLOP counts checked by hand and against `pod.step.efficiency`, and the step model
reading the JSON (`--efficiency`) in place of the assumed --mfu."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest

from vapo_jax.pod.step import efficiency
from vapo_jax.pod.step import measured

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYERS = (4, 8)
OURS = ("policy_step", "critic_step", "logprobs")
REFERENCE = ("update_lm", "update_value", "forward_lm")


def _script():
  spec = importlib.util.spec_from_file_location(
      "calibrate_train", os.path.join(ROOT, "benchmarks", "calibrate_train.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("calibrate") / "calibrate.json")
  ct = _script()
  t0 = time.perf_counter()
  ct.main(["--toy", "--peak_tflops=1", "--steps=2", f"--out={out}"])
  with open(out, encoding="utf-8") as f:
    return ct, out, json.load(f), time.perf_counter() - t0


def test_every_stage_in_the_json(run):
  _, out, data, wall = run
  assert wall < 300, wall   # toy dims (a real-size run would not finish here)
  assert data["complete"] and data["toy"] and data["platform"] == "cpu"
  assert data["extrapolated"]["hfu"] == pytest.approx(measured.extrapolate(data, 64)["hfu"])
  assert (data["tokens"], data["prompt"], data["layers"]) == (128, 32, list(LAYERS))
  # qwen32b's mix at 4 layers: every block rematerialised, the last 2 selectively.
  assert data["dims"]["remat_fraction"] == 1.0 and data["target_layers"] == 64
  assert data["dims"]["selective_fraction"] == 0.5
  got = {(s["side"], s["name"], s["layers"]): s for s in data["stages"]}
  want = ([("vapo_jax", n, L) for n in OURS for L in LAYERS]
          + [("reference", n, L) for n in REFERENCE for L in LAYERS])
  assert sorted(got) == sorted(want)
  for s in got.values():
    assert s["status"] == "ok", s
    assert s["compile_s"] > 0 and len(s["step_s"]) == 2 and s["median_s"] > 0
    assert s["hfu"] == pytest.approx(s["executed_flops"] / (s["median_s"] * 1e12))
    assert s["mfu"] == pytest.approx(s["model_flops"] / (s["median_s"] * 1e12))
  # The trainer's own programs: one packed row of 128 slots.
  assert got[("vapo_jax", "policy_step", 4)]["program"] == "policy_step[rows=1x128]"
  assert {(r["program"], r["layers"]) for r in data["summary"]} == {
      (n, L) for n in OURS for L in LAYERS}


def test_flop_counts_by_hand(run):
  """Toy, 4 layers: D 64, F 128, H 4, K 2, Dh 16, V 512; one sequence of P 32 + R 96 = T 128.
  m = 2 L (D Dh (H + 2K) + H Dh D + 3 D F) = 8 (8,192 + 4,096 + 24,576) = 294,912 per token,
  a = 4 L H Dh = 1,024 per pair, LM head 2 D V = 65,536, down 2 L D F = 65,536; qwen32b's
  remat mix: every block rematerialised (r = 1), 2 of the 4 selectively (s = 1/2)."""
  _, _, data, _ = run
  got = {(s["side"], s["name"]): s for s in data["stages"] if s["layers"] == 4}
  body = 128 * 294_912 + 128 * 129 // 2 * 1_024                     # 46,202,880
  model = {"logprobs": body + 96 * 65_536,                           # 52,494,336
           "policy_step": 3 * (body + 96 * 65_536),
           "critic_step": 3 * (body + 96 * 2 * 64)}                  # value head 2 D
  for name, want in model.items():
    assert got[("vapo_jax", name)]["model_flops"] == want, name
  # Executed (the step model's count): the blocked scan at C = 128 computes the whole
  # 128 x 128 block (16,384 pairs), the LM head runs a whole chunk of 128 positions;
  # an update: (3 + r − s) m − (r − s) down per token (a selective block recomputes no
  # matmul), (2.5 + 1 + r) a per pair (off the splash kernel every rematerialised block
  # recomputes its attention), 4 x head.
  per_token = 3.5 * 294_912 - 0.5 * 65_536                          # 999,424
  executed = {"logprobs": 128 * 294_912 + 16_384 * 1_024 + 128 * 65_536,
              "policy_step": 128 * per_token + 16_384 * 1_024 * 4.5 + 4 * 128 * 65_536}
  for name, want in executed.items():
    assert got[("vapo_jax", name)]["executed_flops"] == want, name
    # XLA's cost analysis of the same compiled program (every loop here runs once).
    xla = got[("vapo_jax", name)]["xla_flops"]
    assert 0.8 < xla / want < 1.25, (name, xla, want)
  # The reference: exact causal pairs T (T + 1) / 2, flash backward 2.5 a, the head at the
  # R response positions (3x in an update).
  assert got[("reference", "update_lm")]["executed_flops"] == (
      128 * per_token + 8_256 * 1_024 * 4.5 + 3 * 96 * 65_536)       # 184,844,288
  assert got[("reference", "forward_lm")]["model_flops"] == model["logprobs"]


def test_model_flops_are_efficiency_py_s(run):
  """The per-program model FLOPs sum to `efficiency.model_flops` of the same step (one
  epoch, the old-log-prob pass, the critic), on packed segments as on one sequence."""
  ct, _, _, _ = run
  for spec in ("one", "lognormal:40,0.8"):
    cfg, tensor = ct.base_config(os.path.join(ROOT, "configs", "qwen32b.py"), True, 0, 1)
    p_B, l_B = ct.segments(spec, 32, 128)
    if len(p_B) > 1:
      cfg, _ = ct.base_config(os.path.join(ROOT, "configs", "qwen32b.py"), True, 0, len(p_B))
    assert (p_B + l_B).sum() <= 128
    st, executed, model = ct.counts(cfg, ct.model_config(cfg, tensor, 4, True), p_B, l_B,
                                    "cpu")
    assert (st.epochs, st.old_logprobs_pass, st.use_critic, st.chips) == (1, True, True, 1)
    assert sum(model.values()) == pytest.approx(efficiency.model_flops(st, l_B, p_B))
    assert all(executed[k] > model[k] for k in OURS)


def _reference():
  spec = importlib.util.spec_from_file_location(
      "calibrate_reference", os.path.join(ROOT, "benchmarks", "calibrate_reference.py"))
  mod = importlib.util.module_from_spec(spec)
  sys.modules.setdefault("calibrate_reference", mod)   # its dataclass looks itself up there
  spec.loader.exec_module(mod)
  return mod


def test_reference_remat_kinds_give_the_same_gradients_and_keep_what_they_say():
  """The reference's blocks: none, every block fully recomputed, and one of two selective
  (keeps its named matmul outputs) give equal losses and gradients; the selective block's
  saved residuals include its named values and the full one's do not; the FLOP count drops
  the selective block's matmul recompute only."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  ref = _reference()
  base = dict(layers=2, d=32, f=64, h=2, k=1, dh=16, vocab=64, tokens=24, prompt=8)
  params = ref.init(ref.Dims(remat_layers=0, **base), False, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (24,), 0, 64)
  out = {}
  for kind, (n, s) in {"none": (0, 0), "full": (2, 0), "selective": (2, 1)}.items():
    dims = ref.Dims(remat_layers=n, selective=s, **base)
    fn = lambda p, dims=dims: ref._loss(dims, None, False, p, tokens, None)  # noqa: E731
    out[kind] = jax.jit(jax.value_and_grad(fn))(params)
  for kind in ("full", "selective"):
    np.testing.assert_allclose(out[kind][0], out["none"][0], rtol=1e-3)
    for a, b in zip(jax.tree.leaves(out[kind][1]), jax.tree.leaves(out["none"][1])):
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                 rtol=2e-2, atol=2e-3)   # bf16 matmuls, fused differently

  def saved(n, s):
    dims = ref.Dims(remat_layers=n, selective=s, **base)
    step = lambda p, x: ref._block(dims, None, p, x)  # noqa: E731
    x = jax.numpy.ones((1, 24, 32), jax.numpy.bfloat16)
    _, res = jax.vjp(ref._remat(dims, 0, step), params["layers"][0], x)
    return len(jax.tree.leaves(res))
  assert saved(1, 1) > saved(1, 0)   # the named matmul outputs are kept, not recomputed
  a = ref.flops(ref.Dims(remat_layers=2, selective=0, **base), "update_lm")
  b = ref.flops(ref.Dims(remat_layers=2, selective=1, **base), "update_lm")
  from vapo_jax.pod.step import counts  # pylint: disable=import-outside-toplevel
  arch = counts.Arch(2, 32, 64, 2, 1, 16, 64, 0.0, 0.0, 512, "dense", 1.0)
  assert a - b == pytest.approx(24 * (arch.matmul - arch.down) / 2)


def test_the_probes_hold_the_configs_remat_mix(run):
  """model_config scales model.remat_layers and model.remat_selective to the probe as the
  compile check does (`fitting.probe_model`): of 64 blocks, 48 full -> 6 of 8; all 64 with
  the last 32 selective -> 8 of 8, the last 4 selective."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  ct, _, _, _ = run
  cfg, tensor = ct.base_config(os.path.join(ROOT, "configs", "qwen32b.py"), True, 0, 1)
  for (n, s), want in {(48, 0): (6, 0), (-1, 32): (8, 4), (-1, 0): (8, 0)}.items():
    c = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat_layers=n,
                                                           remat_selective=s))
    m = ct.model_config(c, tensor, 8, True)
    assert (m.num_layers, m.num_remat, m.remat_selective) == (8, *want), (n, s)
    assert [m.remat_kind(i) for i in range(8)].count("selective") == want[1]


def _synthetic(t4, t8, peak=1e13):
  stage = lambda n, L, t, f: {"side": "vapo_jax", "name": n, "layers": L, "status": "ok",  # noqa: E731
                              "median_s": t, "executed_flops": f, "model_flops": f / 2}
  return {"platform": "tpu", "device_kind": "TPU v5p", "peak_flops": peak, "complete": True,
          "stages": [stage("policy_step", 4, t4, 4e12), stage("policy_step", 8, t8, 6e12),
                     {"side": "reference", "name": "update_lm", "layers": 4, "status": "ok",
                      "median_s": 0.1, "executed_flops": 1.0, "model_flops": 1.0}]}


def test_extrapolation_by_hand():
  # t(4) 1.0 s, t(8) 1.5 s: 0.125 s per layer, t(64) = 1 + 60 · 0.125 = 8.5 s; FLOPs 4e12
  # and 6e12: F(64) = 4e12 + 60 · 0.5e12 = 34e12; HFU = 34e12 / (8.5 · 1e13) = 0.4.
  m = measured.extrapolate(_synthetic(1.0, 1.5), 64)
  assert m["hfu"] == pytest.approx(0.4) and m["mfu"] == pytest.approx(0.2)
  assert m["per_program"]["policy_step"]["fixed_s"] == pytest.approx(0.5)
  assert "from 4 and 8" in m["how"]
  # Not slower at 8 layers (noise): the 8-layer HFU, 6e12 / (1.0 · 1e13).
  assert measured.extrapolate(_synthetic(1.0, 1.0), 64)["hfu"] == pytest.approx(0.6)
  one = _synthetic(1.0, 1.5)
  one["stages"] = one["stages"][:1]
  got = measured.extrapolate(one, 64)
  assert got["hfu"] == pytest.approx(0.4) and "not extrapolated" in got["how"]
  with pytest.raises(ValueError, match="peak"):
    measured.extrapolate({**one, "peak_flops": None}, 64)


def _step_model(*extra):
  out = subprocess.run(
      [sys.executable, "-m", "vapo_jax.pod.step_model", "--config=configs/qwen32b.py",
       "--topology=v5p-128", "--arch=qwen2.5-32b", "--lengths=mid", "--host_chunk_ms=6",
       # No stamped train collectives in the tree yet: the layout's arithmetic, which the
       # step model allows only without the rings (pod.stamp.resolve_train).
       "--config.model.collective_matmul=False", *extra],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def _estimate(text):
  return float(re.search(r"step estimate (\d+) s", text).group(1))


def test_step_model_uses_the_measured_efficiency(run):
  _, out, data, _ = run
  m = measured.extrapolate(data, 64)
  assumed, used = _step_model(), _step_model(f"--efficiency={out}")
  assert "efficiency: ASSUMED --hfu=0.4" in assumed and "MEASURED" not in assumed
  assert f"efficiency: MEASURED, not assumed: --hfu={m['hfu']:.3f}" in used
  assert "toy shapes" in used and "not a TPU" in used and "in place of the assumed 0.4" in used
  assert f" hfu={m['hfu']}," in used                     # the knob the estimate ran with
  assert "HFU measured (--efficiency)" in used and "none measured" not in used
  # The toy CPU's HFU is a few per cent: the train programs' compute takes 0.4 / HFU as
  # long, so the estimate grows (the floor, at its own 50 %, does not move).
  assert m["hfu"] < 0.4 and _estimate(used) > 2 * _estimate(assumed)
  floor = lambda t: re.search(r"floor (\d+) s \(", t).group(1)  # noqa: E731
  assert floor(used) == floor(assumed)
  hfu = lambda t: float(re.search(r"estimate MFU [\d.]+%, HFU ([\d.]+)%", t).group(1))  # noqa: E731
  assert hfu(used) <= 100 * m["hfu"] + 0.05 and hfu(assumed) <= 40.05
