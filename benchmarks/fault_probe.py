r"""Where a run's kernel time goes: minor page faults and CPU seconds per program.

Builds the trainer of a config (the tiny default unless --config says otherwise) and calls
each of the programs one RL step is made of, once to compile and then --repeats times,
reading `resource.getrusage` around every call:

  sft step      one SFT train step (forward, backward, AdamW)
  rollout       one sampler call over the step's prompts (configs' sampling.engine)
  experience    rollout + old log-probs + values + reward + advantages
  update        the PPO loop over that batch (policy and critic steps)
  eval          the held-out evaluation on --eval_examples problems

and prints, per program and call: minor faults (and the MiB of fresh zero pages they stand
for, at 4 KiB each), user and system CPU seconds, the share of its CPU time spent in the
kernel, and the XLA compiles of the first and of the later calls (a later one would be a
per-step shape). Faults and CPU seconds are meaningful on a loaded machine; wall times are not.

  python benchmarks/fault_probe.py                            # glibc settings of run.host_memory
  VAPO_HOST_MALLOC=0 python benchmarks/fault_probe.py         # glibc's defaults
  python benchmarks/fault_probe.py --compare                  # both, in two subprocesses
  python benchmarks/fault_probe.py --config.sampling.engine=continuous   # the rollout engine

The malloc settings (`vapo_jax.run.host_memory`) are applied at the start, as `main` does,
unless VAPO_HOST_MALLOC=0.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

# Run from a checkout without installing: this repository's vapo_jax first.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402  # pylint: disable=wrong-import-position
from ml_collections import config_flags  # noqa: E402  # pylint: disable=wrong-import-position

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "configs", "tiny.py"), "Experiment config file.", lock_config=True)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Measured calls per program (after one warm-up).")
_PROGRAMS = flags.DEFINE_list("programs", "sft,rollout,experience,update,eval",
                              "Programs to probe, in order.")
_EVAL_EXAMPLES = flags.DEFINE_integer("eval_examples", 64, "Held-out problems in `eval`.")
_COMPARE = flags.DEFINE_bool("compare", False, "Run glibc's defaults and run.host_memory's "
                             "settings in two subprocesses and print both.")
_JSON = flags.DEFINE_string("json", None, "Also write the figures as JSON.")

PAGE = resource.getpagesize()
_COMPILES = [0]  # XLA backend compiles so far (jax.monitoring), to catch per-call recompiles


def _count_compiles():
  import jax  # pylint: disable=import-outside-toplevel

  def listener(event, duration_secs, **kwargs):
    del duration_secs, kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      _COMPILES[0] += 1

  jax.monitoring.register_event_duration_secs_listener(listener)


def usage() -> tuple[int, int, float, float, float]:
  """(minor faults, major faults, user s, system s, wall s) of this process so far."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_minflt, r.ru_majflt, r.ru_utime, r.ru_stime, time.perf_counter()


def measure(fn, repeats: int) -> dict:
  """One warm-up call of fn (compiles), then `repeats` calls; per-call rusage deltas."""
  first = _delta(fn)
  calls = [_delta(fn) for _ in range(repeats)]
  return {"first": first, "calls": calls}


def _delta(fn) -> dict:
  c, a = _COMPILES[0], usage()
  fn()
  b = usage()
  return {"minflt": b[0] - a[0], "majflt": b[1] - a[1], "user_s": b[2] - a[2],
          "sys_s": b[3] - a[3], "wall_s": b[4] - a[4], "compiles": _COMPILES[0] - c}


def describe(name: str, m: dict) -> str:
  calls = m["calls"]
  n = max(len(calls), 1)
  flt = sum(c["minflt"] for c in calls) / n
  user = sum(c["user_s"] for c in calls) / n
  sys_s = sum(c["sys_s"] for c in calls) / n
  share = sys_s / max(user + sys_s, 1e-9)
  compiles = sum(c["compiles"] for c in calls)
  return (f"{name:<11} per call: {flt:>9.0f} minor faults ({flt * PAGE / 2**20:7.1f} MiB of "
          f"fresh pages), user {user:6.3f} s, sys {sys_s:6.3f} s ({100 * share:4.1f}% in the "
          f"kernel); first call {m['first']['minflt']} faults, {m['first']['compiles']} "
          f"compiles; later calls {compiles} compiles")


def probe(cfg, programs, repeats: int, eval_examples: int) -> dict:
  """Builds the trainer and measures each program; returns {program: measure(...)}."""
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import batch as batch_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import inputs  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel

  t = trainer_lib.Trainer(cfg, None, progress=False)
  s, p = t.state, t.parts
  out = {}
  try:
    if "sft" in programs:
      t.setup("sft")
      sft = s.learners["sft"]
      batch = batch_lib.shard_batch(batch_lib.RolloutBatch(**inputs.sft_batch(
          next(s.sft_prompts), p.text, cfg.data.max_prompt_tokens,
          cfg.sampling.max_new_tokens)), p.mesh, p.batch_axes)

      def sft_step():
        sft.state, m, _ = sft.step(sft.state, batch)
        jax.block_until_ready(m)

      out["sft"] = measure(sft_step, repeats)
      s.policy_params = sft.state.params
      del s.learners["sft"]
    if cfg.uses_critic:
      t.setup("critic")
    t.setup("policy")
    examples = next(s.prompts)
    if "rollout" in programs:
      out["rollout"] = measure(lambda: jax.block_until_ready(p.experience._sample(  # pylint: disable=protected-access
          s.policy_params, examples, s.next_key())), repeats)
    held = {}
    if "experience" in programs or "update" in programs:
      def experience():
        held["batch"] = jax.block_until_ready(t.experience(examples)[0])

      out["experience"] = measure(experience, repeats)
    if "update" in programs:
      out["update"] = measure(lambda: t.update(held["batch"], stage="rl", step=0,
                                               policy=True), repeats)
    if "eval" in programs:
      out["eval"] = measure(lambda: t.evaluate(p.eval_examples[:eval_examples]), repeats)
  finally:
    t.close()
  if "experience" not in programs:
    out.pop("experience", None)
  return out


def main(argv):
  del argv
  if _COMPARE.value:
    return compare()
  from vapo_jax.run import host_memory  # pylint: disable=import-outside-toplevel
  applied = host_memory.configure(host_memory.expected_platform())  # as main does, first
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  _count_compiles()
  cfg = config_lib.from_command_line(_CONFIG.value)
  total0 = usage()
  results = probe(cfg, _PROGRAMS.value, _REPEATS.value, _EVAL_EXAMPLES.value)
  total1 = usage()
  env = os.environ.get(host_memory.ENV, "unset")
  print(f"malloc: {applied or 'glibc defaults'} ({host_memory.ENV}={env}); "
        f"sampling.engine={cfg.sampling.engine}; {jax.default_backend()} x {jax.device_count()}")
  for name, m in results.items():
    print(describe(name, m))
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  print(f"whole probe: {total1[0] - total0[0]} minor faults, user {total1[2] - total0[2]:.1f} s, "
        f"sys {total1[3] - total0[3]:.1f} s, max RSS {rss / 1024:.0f} MiB")
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as f:
      json.dump({"malloc": applied, "engine": cfg.sampling.engine, "programs": results,
                 "max_rss_kib": rss}, f, indent=1)


def compare():
  """The probe twice, glibc's defaults then host_memory's settings, each in its own process."""
  argv = [a for a in sys.argv[1:] if not a.startswith("--compare")]
  for value in ("0", "1"):
    env = dict(os.environ, VAPO_HOST_MALLOC=value)
    print(f"--- VAPO_HOST_MALLOC={value}", flush=True)
    subprocess.run([sys.executable, os.path.abspath(__file__), *argv], env=env, check=True)


if __name__ == "__main__":
  from vapo_jax import cli  # noqa: E402  # pylint: disable=wrong-import-position
  cli.run(main)
