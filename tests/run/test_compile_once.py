"""Compile once: a run whose response lengths change every step compiles its program set in
its first step and nothing after, as `python -m vapo_jax.main` runs it.

Each packed pass (the policy and critic steps, the old-log-prob and value forwards) announces
its bounded program set (`[compile] <pass>: N programs (rows=<n>x<T>, ...)`, one per row
length) and compiles it at its first call; `metrics.jsonl` carries JAX's own compile events
per step (`run.compiles`). A planner that let the rows per micro-batch follow the batch again
would meet new table shapes in later steps: a line saying so, and compiles there.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from vapo_jax.run import compiles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ["--config=configs/tiny.py", "--noprogress", "--config.sft.steps=2",
         "--config.sft.batch_size=16", "--config.value_pretrain.max_steps=2",
         "--config.value_pretrain.min_steps=2", "--config.rl.steps=4",
         "--config.rl.prompts_per_step=8", "--config.rl.responses_per_prompt=4",
         "--config.rl.packing_row_steps=2", "--config.rl.packing_tokens_per_device=320",
         "--config.eval.num_examples=8",
         "--config.eval.batch_prompts=8", "--config.eval.every=2",
         "--config.data.num_train=256", "--config.data.num_eval=8",
         "--config.checkpoint.every=0", "--config.metrics.tensorboard=False",
         "--config.metrics.plot=False"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("compile_once")
  # No persistent cache: every program this process needs is compiled here, in its run.
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  # One device: 4 rows of 80 per micro-batch, so K follows the lengths.
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  out = subprocess.run([sys.executable, "-m", "vapo_jax.main", *FLAGS,
                        "--config.compile.cache=False", f"--workdir={workdir}"],
                       cwd=ROOT, env=env, text=True, capture_output=True, timeout=900,
                       check=False)
  assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  return out.stdout, records


def test_after_the_first_step_no_step_compiles(run):
  _, records = run
  rl = [r for r in records if r["stage"] == "rl"]
  vp = [r for r in records if r["stage"] == "value_pretrain"]
  assert [r["step"] for r in rl] == [1, 2, 3, 4] and len(vp) == 2
  # The lengths did change: other packed plans from step to step.
  plans = {(r["perf/policy_micro_batches"], r["perf/policy_row_len"], r["perf/logprobs_rows"],
            r["perf/logprobs_micro_batches"], r["perf/logprobs_row_len"]) for r in rl}
  assert len(plans) > 1, plans
  assert len({r["response/length_mean"] for r in rl}) == len(rl)
  assert rl[0]["compile/count"] > 0 and vp[0]["compile/count"] > 0   # the warm-up compiles
  for r in rl[1:] + vp[1:]:
    assert r["compile/count"] == 0, (r["stage"], r["step"], r["compile/count"])
    assert r["compile/seconds"] < 0.5, (r["stage"], r["step"], r["compile/seconds"])


def test_the_programs_compiled_are_the_set_announced(run):
  stdout, records = run
  announced = dict(re.findall(r"^\[compile\] (\w+): \d+ programs? \(([^)]*)\)", stdout, re.M))
  # The engines' decode chunks, one per row bucket (sampling.decode_buckets), rollout's and
  # evaluation's: every bucket a rollout ran was announced (and so compiled ahead).
  engines = re.findall(r"^\[compile\] decode_chunk: \d+ programs? \(([^)]*)\)", stdout, re.M)
  del announced["decode_chunk"]
  assert engines and all(len(e.split(", ")) > 1 for e in engines), engines
  for r in records:
    for k, v in r.items():
      if k.startswith("rollout/decode_chunks_rows_") and v > 0:
        assert any(f"rows={k.rsplit('_', 1)[1]}" in e.split(", ") for e in engines), (k, engines)
  assert set(announced) == {"sft", "policy", "critic", "logprobs", "values"}, stdout[-3000:]
  for name, progs in announced.items():
    labels = progs.split(", ")
    assert len(labels) == 2, (name, labels)        # rl.packing_row_steps=2: two row lengths
    # Every plan a pass ran was in its announced set (rows=<n>x<T>).
    for r in records:
      if f"perf/{name}_row_len" in r:
        n, t = int(r[f"perf/{name}_rows"]), int(r[f"perf/{name}_row_len"])
        assert f"rows={n}x{t}" in labels, (name, n, t, labels)
  assert "outside the program set" not in stdout


def test_the_tally_counts_jax_compiles_and_the_cache_dir_must_be_private(tmp_path):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  start = compiles.snapshot()
  f = jax.jit(lambda x: jnp.sin(x) * 3)
  f(jnp.ones(7))
  f(jnp.ones(7))
  got = compiles.since(start)
  assert got["compile/count"] >= 1 and got["compile/seconds"] > 0
  assert 0.05 < got["mem/peak_rss_gb"] < 1e3      # a JAX process holds > 50 MB; GB, not KiB
  again = compiles.snapshot()
  f(jnp.ones(7))
  assert compiles.since(again)["compile/count"] == 0
  shared = tmp_path / "shared"
  shared.mkdir()
  os.chmod(shared, 0o777)
  assert "others can write" in compiles.private_dir(str(shared))
  assert compiles.private_dir(str(tmp_path / "mine")) is None
  assert oct(os.stat(tmp_path / "mine").st_mode & 0o777) == "0o700"


def test_the_cache_set_after_a_compile_still_keeps_programs(tmp_path, monkeypatch):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=import-outside-toplevel
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  jax.jit(lambda x: x + 1)(jnp.ones(3))              # JAX has compiled before the run starts
  old = (jax.config.jax_compilation_cache_dir,
         jax.config.jax_persistent_cache_min_compile_time_secs)
  try:
    assert compiles.enable_cache(False, str(tmp_path / "off")) is None
    path = compiles.enable_cache(True, str(tmp_path / "cache"))
    assert path == str(tmp_path / "cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.jit(lambda x: jnp.cos(x) * 5 + 0.25)(jnp.ones(11))
    assert os.listdir(path), "no program was written to the cache"
  finally:
    jax.config.update("jax_compilation_cache_dir", old[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
    cc.reset_cache()
