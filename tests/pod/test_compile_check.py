"""The TPU compile check: slice names, and (with libtpu) a fit and a clear misfit from a CPU."""

import os
import subprocess
import sys

import pytest

from vapo_jax import distributed
from vapo_jax.pod import fitting
from vapo_jax.pod import slices

from tpu_aot import NEEDS_LIBTPU  # pylint: disable=wrong-import-order

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny trainer-test model (hidden 32, one layer) with short sequences: compiles in seconds.
TINY = ["--config=configs/tiny.py", "--config.model.hidden_size=32",
        "--config.model.intermediate_size=64", "--config.model.num_layers=1",
        "--config.model.num_heads=2", "--config.model.num_kv_heads=1",
        "--config.model.head_dim=16", "--config.data.max_prompt_tokens=16",
        "--config.sampling.max_new_tokens=8", "--config.rl.prompts_per_step=8",
        "--config.rl.responses_per_prompt=2", "--config.rl.micro_batch_size=4",
        "--config.eval.batch_prompts=4", "--config.eval.samples_per_problem=2",
        "--config.sampling.prompts_per_call=4"]


def test_slice_names():
  s = slices.parse("v5p-128")
  assert (s.chips, s.shape, s.topology_name, s.hosts) == (64, (4, 4, 4), "v5p:4x4x4", 16)
  assert s.accelerator_type == "v5p-128"
  e = slices.parse("v5litepod-16")
  assert (e.chips, e.topology_name, e.accelerator_type) == (16, "v5e:4x4", "v5litepod-16")
  assert slices.parse("v6e-8").shape == (2, 4) and slices.parse("v6e-8").hosts == 1
  assert slices.parse("v4-32").chips == 16
  assert slices.parse("v5p:2x2x1").accelerator_type == "v5p-8"
  for bad, why in (("v5p-7", "multiple of 2"), ("v9-8", "unknown TPU generation"),
                   ("v5p-96", "no standard v5p slice"), ("tpu", "unknown TPU slice")):
    with pytest.raises(ValueError, match=why):
      slices.parse(bad)


def test_cluster_detection():
  assert distributed.detect({}) == "single"
  assert distributed.detect({"JAX_COORDINATOR_ADDRESS": "h:1"}) == "explicit"
  assert distributed.detect({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}) == "slurm"
  assert distributed.detect({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) == "single"
  assert distributed.detect({"TPU_WORKER_HOSTNAMES": "a,b"}) == "tpu"
  with pytest.raises(ValueError, match="process_id"):
    distributed.initialize("explicit", coordinator="127.0.0.1:1", num_processes=2)


def _program(report, name):
  """A program's figures by name; with rl.packing (the default) the packed train-side
  programs are `name[rows=nxT]`, one per packed shape: the one with the most trips."""
  hits = [p for k, p in report["programs"].items() if k.split("[")[0] == name]
  assert hits, (name, list(report["programs"]))
  return max(hits, key=lambda p: p["flops"])


def _check(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  return subprocess.run([sys.executable, "-m", "vapo_jax.pod.compile_check", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.floor
@NEEDS_LIBTPU
def test_small_config_fits_a_small_slice(tmp_path):
  out = _check(*TINY, "--topology=v5e-4", f"--json={tmp_path}/r.json")
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "v5e-4: FITS" in out.stdout
  # The rollout engine's own programs (the default sampling.engine), and its KV-pool lines.
  for name in ("policy_step", "critic_step", "logprobs", "values", "decode_copy", "prefill",
               "insert", "decode_chunk", "eval_insert", "eval_decode_chunk"):
    assert f"  {name}" in out.stdout, name
  for pool in ("rollout", "eval"):
    line = next(x for x in out.stdout.splitlines() if x.startswith(f"  kv_pool {pool}"))
    assert "pages x 16 = " in line and line.endswith(": FITS"), line
  import json  # pylint: disable=import-outside-toplevel
  report = json.load(open(tmp_path / "r.json", encoding="utf-8"))[0]
  assert report["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert _program(report, "policy_step")["flops"] > 0 and report["step_time_s"] > 0
  # By hand: TINY's policy (vocab 97 padded to 128, d 32, one layer: q/o 32x32, k/v 32x16
  # with biases, MLP 3 x 32x64, three RMSNorm scales) has P parameters; its TrainState is
  # params + Adam's two moments, float32, split over fsdp = 4 chips. The small 1-D leaves
  # (biases, norm scales) and the int32 step counters may stay replicated.
  d, f, hd = 32, 64, 16
  vectors = 2 * hd + hd + hd + 3 * d          # q, k, v biases; two layer norms + final norm
  matrices = 128 * d + d * 2 * hd + 2 * d * hd + 2 * hd * d + 3 * d * f
  sharded = 3 * 4 * (matrices + vectors) / 4
  replicated_extra = 3 * 4 * vectors * 3 / 4 + 4 * 4
  got = report["resident"]["policy_state"]
  assert sharded <= got <= sharded + replicated_extra, (got, sharded)
  p = _program(report, "policy_step")
  assert p["peak"] >= got and p["arguments"] >= got
  # On a TPU slice the pool is sized from the chip's HBM: TINY's is capped by its slots.
  assert report["kv_pools"]["rollout"]["limited_by"] == "slots"
  assert report["programs"]["decode_chunk"]["peak"] >= sum(report["resident"].values()) + sum(
      report["rollout_parts"][k] for k in ("decode_copy", "kv_pool"))


@pytest.mark.floor
@NEEDS_LIBTPU
def test_qwen32b_on_a_too_small_slice_fails_clearly():
  out = _check("--config=configs/qwen32b.py", "--topology=v5p-8")
  assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
  assert "v5p-8: DOES NOT FIT — the training state alone needs" in out.stdout
  assert "GB per chip" in out.stdout and "use a slice with more chips" in out.stdout


@NEEDS_LIBTPU
def test_a_program_that_compiles_but_exceeds_the_budget_does_not_fit(tmp_path):
  # The step compiles (XLA fits it in HBM), but the run's budget, HBM less the headroom, is
  # below its peak: the check must say so and exit 1, not report a fit.
  out = _check(*TINY, "--topology=v5e-4", "--programs=policy_step", "--headroom=0.99999",
               f"--json={tmp_path}/r.json")
  assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
  import json  # pylint: disable=import-outside-toplevel
  report = json.load(open(tmp_path / "r.json", encoding="utf-8"))[0]
  step = _program(report, "policy_step")
  assert not step["error"] and step["peak"] > report["budget_per_chip"]
  assert not step["fits"] and not report["fits"]
  assert f"v5e-4: DOES NOT FIT — {step['program']} needs" in out.stdout


@NEEDS_LIBTPU
def test_the_engine_decodes_with_jax_pallas_kernel_where_it_takes_the_shapes(tmp_path):
  # sampling.attention_kernel="auto": on a TPU slice the engine's decode chunk calls jax's
  # ragged paged attention kernel (replicas included) when the per-shard head_dim is a
  # multiple of 128; TINY's head_dim 16 keeps the pure-JAX attention, and one line says why.
  wide = [a for a in TINY if "hidden_size" not in a and "head_dim" not in a] + [
      "--config.model.hidden_size=256", "--config.model.head_dim=128"]
  runs = {}
  for name, args in (("wide", wide), ("tiny", TINY)):
    out = _check(*args, "--topology=v5e-4", "--programs=decode_chunk",
                 f"--json={tmp_path}/{name}.json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    import json  # pylint: disable=import-outside-toplevel
    runs[name] = (out.stdout, json.load(open(tmp_path / f"{name}.json", encoding="utf-8"))[0])
  stdout, report = runs["wide"]
  assert report["attention_kernels"]["rollout"] == "tpu"
  assert report["engines"]["rollout"]["replicas"] == 4
  assert _program(report, "decode_chunk")["kernel_calls"] >= 1  # one layer: its call site
  assert "Pallas kernel" in next(x for x in stdout.splitlines() if "kv_pool rollout" in x)
  stdout, report = runs["tiny"]
  assert report["attention_kernels"]["rollout"] == "jax"
  assert _program(report, "decode_chunk")["kernel_calls"] == 0
  assert "head_dim must be a multiple of 128" in stdout


def test_remat_search_picks_the_fewest_rematerialised_blocks_that_fit(monkeypatch):
  # Synthetic compiles: 4 blocks; every block rematerialised peaks at 10 GB, none at 30 GB
  # (policy) / 26 GB (critic): a kept block costs 5 / 4 GB more. With a 22 GB budget the
  # policy needs ⌈(30 − 22) / 5⌉ = 2 rematerialised blocks, the critic ⌈(26 − 22) / 4⌉ = 1.
  # The pick is then compiled; `bump` GB more than linear there makes it step up.
  from vapo_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import compile_check  # pylint: disable=import-outside-toplevel
  seen = []

  def fake_check(cfg, mcfg, s, *, names, budget=22e9, bump=0.0, **kw):
    del cfg, s, kw
    seen.append((mcfg.remat, mcfg.remat_layers, names))
    n = 4 if mcfg.remat_layers < 0 else mcfg.remat_layers
    extra = bump if n == 2 else 0.0
    # Packed programs carry their row shape; the worst of a program's shapes counts.
    peaks = {"policy_step[rows=2x8]": 30e9 - 5e9 * n + extra,
             "policy_step[rows=1x16]": 29e9 - 5e9 * n,
             "critic_step": 26e9 - 4e9 * n}
    return {"budget_per_chip": budget,
            "programs": {k: {"peak": v, "error": ""} for k, v in peaks.items()}}

  monkeypatch.setattr(compile_check, "check", fake_check)
  shapes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=2,
                num_kv_heads=1)
  mcfg = ModelConfig(num_layers=4, **shapes)
  lines = []
  found = compile_check.remat_search(None, mcfg, None, log=lines.append)
  assert found["layers"] == 2 and found["peaks"]["policy_step"] == (10e9, 30e9)
  assert seen == [(True, -1, compile_check.UPDATES), (True, 0, compile_check.UPDATES),
                  (True, 2, compile_check.UPDATES)]   # the two ends, then the pick
  assert found["verified"]["2"]["policy_step"] == 20e9
  assert "model.remat_layers=2" in lines[-1] and "checked by compile" in lines[-1]
  # The pick compiles 3 GB over the line (23 GB > 22): one more block, 3, fits.
  monkeypatch.setattr(compile_check, "check", lambda *a, **k: fake_check(*a, bump=3e9, **k))
  found = compile_check.remat_search(None, mcfg, None, log=lines.append)
  assert found["layers"] == 3 and set(found["verified"]) == {"2", "3"}
  # Everything fits without remat: 0; nothing fits a budget below the all-remat peak.
  monkeypatch.setattr(compile_check, "check",
                      lambda *a, **k: fake_check(*a, budget=40e9, **k))
  assert compile_check.remat_search(None, mcfg, None, log=lines.append)["layers"] == 0
  monkeypatch.setattr(compile_check, "check",
                      lambda *a, **k: fake_check(*a, budget=12e9, **k))
  assert compile_check.remat_search(None, mcfg, None, log=lines.append)["layers"] == -1
  # Below the all-remat peak nothing fits: None, not "all" (it said -1 before mix_search).
  monkeypatch.setattr(compile_check, "check", lambda *a, **k: fake_check(*a, budget=9e9, **k))
  assert compile_check.remat_search(None, mcfg, None, log=lines.append)["layers"] is None
  assert "does not fit even at model.remat_layers=4" in lines[-1]
  # With probes of 2 and 4 layers only multiples of 4 / 2 = 2 blocks are exact: 1 -> 2.
  monkeypatch.setattr(compile_check, "check", lambda *a, **k: fake_check(*a, budget=27e9, **k))
  found = compile_check.remat_search(None, mcfg, None, log=lines.append, probe_layers=(2, 4))
  assert found["layers"] == 2
  # A partial remat's probes keep its fraction of rematerialised blocks.
  probe = fitting.probe_model(ModelConfig(num_layers=64, remat=True, remat_layers=32,
                                                **shapes), 4)
  assert (probe.num_layers, probe.remat_layers) == (4, 2)
  # Probes that cannot hold that fraction are refused, with probes that can: 48 of 64 on 2 and
  # 4 layers would be 1.5 of 2 (rounded to 2 of 2: every block, a line that prices a kept
  # block per layer); 4 and 8 layers hold it exactly (3 of 4, 6 of 8).
  m48 = ModelConfig(num_layers=64, remat=True, remat_layers=48, **shapes)
  why = fitting.probe_refusal(m48, (2, 4))
  assert "1.5 of 2" in why and "--probe_layers=4,8" in why
  assert fitting.probe_refusal(m48, (4, 8)) == ""
  assert "inlines" in fitting.probe_refusal(m48.replace(remat_layers=-1), (1, 2))
  assert fitting.probe_refusal(m48.replace(remat_layers=-1), (2, 4)) == ""
  assert fitting.probe_refusal(m48.replace(remat_layers=40), (4, 8)).endswith(
      "--probe_layers=8,16")


def test_selective_search_picks_the_most_selective_blocks_that_fit():
  # Synthetic compiles of 4 blocks, all rematerialised: with none selective the policy
  # peaks at 10 GB and the critic at 8, with all 4 selective at 30 / 24 GB: a selective block
  # costs 5 / 4 GB more. Under 22 GB the policy takes ⌊(22 − 10) / 5⌋ = 2, the critic 3.
  # The pick is compiled; `bump` GB over the line there makes it step down.
  from vapo_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  seen = []

  def fake_check(mcfg, budget=22e9, bump=0.0):
    seen.append((mcfg.remat_layers, mcfg.remat_selective))
    s = mcfg.remat_selective
    peaks = {"policy_step[rows=2x8]": 10e9 + 5e9 * s + (bump if s == 2 else 0.0),
             "critic_step": 8e9 + 4e9 * s}
    return {"budget_per_chip": budget,
            "programs": {k: {"peak": v, "error": ""} for k, v in peaks.items()}}

  mcfg = ModelConfig(num_layers=4, vocab_size=64, hidden_size=32, intermediate_size=64,
                     num_heads=2, num_kv_heads=1, remat=True, remat_layers=3)
  names = ("policy_step", "critic_step")
  lines = []
  found = fitting.selective_search(fake_check, mcfg, names, log=lines.append)
  assert found["selective"] == 2 and found["peaks"]["policy_step"] == (10e9, 30e9)
  assert seen == [(-1, 0), (-1, 4), (-1, 2)]   # every block rematerialised; ends, then pick
  assert found["verified"]["2"]["policy_step"] == 20e9
  assert "model.remat_selective=2" in lines[-1] and "checked by compile" in lines[-1]
  # 3 GB over the line at 2 (23 > 22 GB): one fewer, 1, fits.
  found = fitting.selective_search(lambda m: fake_check(m, bump=3e9), mcfg, names,
                                   log=lines.append)
  assert found["selective"] == 1 and set(found["verified"]) == {"2", "1"}
  # Everything selective fits a large budget; none fits below the all-full peak.
  assert fitting.selective_search(lambda m: fake_check(m, budget=40e9), mcfg, names,
                                  log=lines.append)["selective"] == 4
  found = fitting.selective_search(lambda m: fake_check(m, budget=9e9), mcfg, names,
                                   log=lines.append)
  assert found["selective"] is None and "does not fit" in lines[-1]
  assert fitting.selective_search(lambda m: fake_check(m, budget=12e9), mcfg, names,
                                  log=lines.append)["selective"] == 0
  # Probes of 2 and 4 layers hold multiples of 2 selective blocks: 3 (critic) -> 2.
  assert fitting.selective_search(lambda m: fake_check(m, budget=26e9), mcfg, names,
                                  log=lines.append, probe_layers=(2, 4))["selective"] == 2
  # A probe keeps the selective fraction; one that cannot hold it is refused.
  m = mcfg.replace(num_layers=64, remat_layers=-1, remat_selective=48)
  assert fitting.probe_model(m, 8).remat_selective == 6
  assert fitting.probe_refusal(m, (4, 8)) == ""
  assert "remat_selective=40" in fitting.probe_refusal(m.replace(remat_selective=40), (4, 8))
