"""Our side of benchmarks/trl_bench.py, in a process of its own (see trl_bench's doc).

Each side runs as its users run it. TRL stays in the bench's process with glibc's malloc
defaults; ours runs in a child started fresh (`spawn`: no torch, no inherited heap) with the
malloc settings `python -m vapo_jax.main` applies (run/host_memory.py). Until 2026-12-06 both
shared one process: one heap, and our settings applied to TRL as well. Our update then took
10.4-13.2 s in the rounds that followed our own step and 16.5-18.7 s in those that followed
two of TRL's (docs/speed.md).

The parent sends one request at a time and waits for the answer, so the sides still
interleave round by round and never overlap:

  "step"     our RL step i (`Ours`); its record comes back
  "rollout"  (sampler, round): one rollout alone on the engine or the static sampler; its
             seconds, response tokens and each response's length come back
  "floor"    (lengths, seconds, peaks): the engine's rounds against their floor
             (trl_rollout.engine_floor)
  "close"    the trainer closed; the child exits

An error in the child comes back as its traceback, and the parent stops with it.
"""

from __future__ import annotations

import itertools
import os
import traceback
import types

import numpy as np

import step_record as sr

ALONE = "timed again alone"  # the phase of our forwards re-run outside the step


class Ours:
  """Runs our RL step i and keeps what it generated, compiled and packed (see the doc)."""

  def __init__(self, rl_step_bench, t, events: sr.CompileEvents, shapes: sr.PackedShapes):
    self.bench, self.t, self.events, self.shapes = rl_step_bench, t, events, shapes
    self.runs: list[dict] = []
    self._seen: dict = {}
    shapes.phase = ALONE

    def phased(fn, phase, keep=None):  # packed passes by phase; the step's batch, metrics
      def run(*a, **k):
        shapes.phase = phase
        try:
          out = fn(*a, **k)
        finally:
          shapes.phase = ALONE
        if keep is not None:
          keep(out)
        return out
      return run
    t.experience = phased(t.experience, "experience",
                          lambda out: self._seen.update(batch=out[0], em=out[1]))
    t.update = phased(t.update, "update")

  def __call__(self) -> dict:
    self.events.take()
    self.shapes.take()
    out = self.bench.one_step(self.t, len(self.runs))
    out["step"] = out["rollout"] + out["overlapped"] + out["updates"]
    out["step_nocompile"] = out["step"] - out["compile"]
    out["jax_compile"] = self.events.take()
    out["packed"] = self.shapes.take()
    batch, em = self._seen.pop("batch", None), self._seen.pop("em", {})
    if batch is not None:
      out["generated_lengths"] = [int(x) for x in
                                  np.asarray(batch.response_mask_BxR).sum(axis=1)]
    out["token_efficiency"] = {k: float(v) for k, v in em.items()
                               if k.startswith("perf/") and k.endswith("token_efficiency")}
    self.runs.append(out)
    return out


def serve(conn, spec: dict) -> None:
  """The child: builds our trainer on `spec` ("args": trl_bench's flags as a dict,
  "model_dir"), answers "ready" with what the parent needs, then serves requests."""
  try:
    # As `python -m vapo_jax.main` does, before JAX starts its CPU client.
    from vapo_jax.run import host_memory  # pylint: disable=import-outside-toplevel
    malloc = host_memory.configure(host_memory.expected_platform())
    import jax  # pylint: disable=import-outside-toplevel
    from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
    import rl_step_bench  # pylint: disable=import-outside-toplevel
    import trl_bench  # pylint: disable=import-outside-toplevel  (our_config)
    import trl_rollout  # pylint: disable=import-outside-toplevel

    args = types.SimpleNamespace(**spec["args"])
    cfg = trl_bench.our_config(args.config, args.preset, spec["model_dir"], args)
    events = sr.CompileEvents().start()
    shapes = sr.PackedShapes()
    installed = shapes.install()
    t = trainer_lib.Trainer(cfg, progress=False)
    examples = t.parts.train_examples[:args.prompts]
    t.state.prompts = itertools.repeat(examples)   # the same P prompts every step, as TRL's
    text = t.parts.text
    t.setup("reference")
    t.setup("policy")
    ours = Ours(rl_step_bench, t, events, shapes)
    rollouts = trl_rollout.OurRollouts(args, cfg, t, examples)
    dev = jax.devices()[0]
    conn.send(("ready", {
        "rendered": [text.template.apply(ex.problem) for ex in examples],
        "answers": [ex.answer for ex in examples],
        "prompt_ids": [list(text.prompt_ids(ex.problem)) for ex in examples],
        "eos_ids": sorted(int(e) for e in text.eos_ids),
        "jax_platform": dev.platform, "jax_device_kind": dev.device_kind,
        "malloc": malloc, "shapes_installed": installed, "pid": os.getpid()}))
    while True:
      cmd, payload = conn.recv()
      if cmd == "step":
        conn.send(("ok", ours()))
      elif cmd == "rollout":
        conn.send(("ok", rollouts(*payload)))
      elif cmd == "floor":
        conn.send(("ok", rollouts.floor(*payload)))
      elif cmd == "close":
        events.stop()
        shapes.uninstall()
        t.close()
        conn.send(("ok", None))
        return
      else:
        raise ValueError(f"unknown request {cmd!r}")
  except BaseException:  # pylint: disable=broad-except
    try:
      conn.send(("error", traceback.format_exc()))
    except (OSError, ValueError):
      pass
    raise


class OursProcess:
  """The parent's handle on the child: `()` runs our next RL step (its record is appended to
  `runs`), `rollout(name, i)`, `floor(...)`, `close()`; `info` is the child's "ready"."""

  def __init__(self, args, model_dir: str):
    import multiprocessing  # pylint: disable=import-outside-toplevel
    ctx = multiprocessing.get_context("spawn")
    self._conn, child = ctx.Pipe()
    # Not a daemon: our reward scorer may start processes of its own.
    self.proc = ctx.Process(target=serve, name="vapo_jax-side",
                            args=(child, {"args": dict(vars(args)), "model_dir": model_dir}))
    self.proc.start()
    child.close()
    self.runs: list[dict] = []
    self.info = self._answer("setup")

  def _answer(self, what: str):
    while not self._conn.poll(1.0):
      if not self.proc.is_alive():
        raise SystemExit(f"error: our side's process ended during {what} "
                         f"(exit code {self.proc.exitcode})")
    try:
      kind, payload = self._conn.recv()
    except EOFError:
      raise SystemExit(f"error: our side's process closed its pipe during {what}") from None
    if kind == "error":
      raise SystemExit(f"error: our side failed during {what}:\n{payload}")
    return payload

  def ask(self, cmd: str, *payload):
    self._conn.send((cmd, payload))
    return self._answer(cmd)

  def __call__(self) -> None:
    self.runs.append(self.ask("step"))

  def rollout(self, name: str, i: int) -> tuple[float, float, list[int]]:
    return self.ask("rollout", name, i)

  def floor(self, lengths, seconds, peaks) -> dict | None:
    return self.ask("floor", lengths, seconds, peaks)

  def close(self) -> None:
    if self.proc.is_alive():
      try:
        self.ask("close")
      finally:
        self.proc.join(timeout=60)
    if self.proc.is_alive():
      self.proc.terminate()
      self.proc.join(timeout=10)
