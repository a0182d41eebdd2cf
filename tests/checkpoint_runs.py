"""Whole runs the checkpoint tests share: a jax compilation cache for the session, a small
three-stage config, a recorder of the prompts each stage sees that can SIGTERM the run, and
a loop that reruns a preempted run until it finishes."""

import os
import signal

import jax
import numpy as np
import pytest

from vapo_jax.run import inputs
from vapo_jax.run import trainer as trainer_lib
from tiny_trainer import tiny


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
  """Trainers compile the same programs over and over: share them through jax's disk cache.

  Modules that import this fixture get their own instance; the first one sets the cache
  up for the whole session and the others leave it alone.
  """
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_min_entry_size_bytes")
  if jax.config.jax_compilation_cache_dir:
    yield
    return
  old = {n: getattr(jax.config, n) for n in names}
  jax.config.update(names[0], str(tmp_path_factory.mktemp("jax_cache")))
  jax.config.update(names[1], 0)
  jax.config.update(names[2], 0)
  yield
  for n, v in old.items():
    jax.config.update(n, v)


def small(**overrides):
  return tiny(**{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1, "sft.enabled": True,
                 "sft.steps": 3, "sft.batch_size": 8, "value_pretrain.max_steps": 2,
                 "value_pretrain.min_steps": 2, "rl.steps": 3, "checkpoint.every": 1,
                 "checkpoint.keep": 3, "metrics.plot": False, **overrides})


class Recorder:
  """Records the prompts each stage sees and sends SIGTERM at chosen step boundaries."""

  def __init__(self, monkeypatch, kill_at=()):
    self.seen = []
    self.kill_at = set(kill_at)
    experience, sft_batch = trainer_lib.Trainer.experience, inputs.sft_batch
    step_end = trainer_lib.Trainer._step_end

    def record_experience(trainer, examples, **kw):
      self.seen.append(("rollout", tuple(ex.uid for ex in examples)))
      return experience(trainer, examples, **kw)

    def record_sft(examples, *a, **kw):
      self.seen.append(("sft", tuple(ex.uid for ex in examples)))
      return sft_batch(examples, *a, **kw)

    def maybe_kill(trainer, stage, done, **kw):
      if (stage, done) in self.kill_at:
        self.kill_at.discard((stage, done))
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by the trainer
      return step_end(trainer, stage, done, **kw)

    monkeypatch.setattr(trainer_lib.Trainer, "experience", record_experience)
    monkeypatch.setattr(trainer_lib.inputs, "sft_batch", record_sft)
    monkeypatch.setattr(trainer_lib.Trainer, "_step_end", maybe_kill)


def final_state(t):
  return jax.device_get({n: t.state.train_state(n) for n in ("policy", "critic")})


def run_to_end(cfg, workdir):
  """Runs (and reruns after each preemption) until done; returns (state, summaries)."""
  summaries = []
  while True:
    t = trainer_lib.Trainer(cfg, workdir, progress=False)
    try:
      summaries.append(t.run())
      if "preempted" not in summaries[-1]:
        return final_state(t), summaries
    finally:
      t.close()


def assert_bitwise_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
