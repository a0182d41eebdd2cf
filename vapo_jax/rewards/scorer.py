"""Batched, parallel, time-bounded reward scoring for a rollout batch.

`RewardScorer` keeps a pool of worker processes, each with a private pipe.
The parent hands one check at a time to an idle worker and waits on all
pipes with the earliest deadline as timeout. A worker that overruns its
check's time limit is killed and replaced; the check scores 0 with reason
`timeout`. A worker that dies (segfault, out of memory) is replaced and its
check scores 0 with reason `error:crash`. A plug-in that raises scores 0 with
reason `error:<ExceptionType>`. Nothing a response contains can stall the
pool.

With `num_workers=0` checks run in the calling process under a SIGALRM
budget (main thread only). That mode is for tests and tiny runs: it cannot
stop work stuck inside C code, which worker mode can.
"""

import collections
import dataclasses
import multiprocessing
from multiprocessing import connection
import signal
import threading
import time
from typing import Sequence

import numpy as np

from vapo_jax.rewards import plugins


@dataclasses.dataclass(frozen=True)
class BatchScores:
  """Scores of one batch.

  Attributes:
    rewards: float32 [N] rewards.
    correct: bool [N], reward > 0.
    reasons: N reason strings (`timeout`, `error:...`, or the plug-in's).
    timeouts: number of checks that ran past the time limit.
    errors: number of checks whose plug-in raised or whose worker died.
    max_seconds: the slowest check's wall time.
  """
  rewards: np.ndarray
  correct: np.ndarray
  reasons: list[str]
  timeouts: int
  errors: int
  max_seconds: float = 0.0

  def metrics(self) -> dict[str, float]:
    n = max(len(self.reasons), 1)
    return {
        "reward/mean": float(self.rewards.mean()) if len(self.rewards) else 0.0,
        "reward/accuracy": float(self.correct.mean()) if len(self.correct) else 0.0,
        "reward/timeouts": float(self.timeouts),
        "reward/errors": float(self.errors),
        "reward/no_answer_frac": sum(
            r in ("no_answer", "malformed_box", "empty_box")
            for r in self.reasons) / n,
        "reward/max_check_seconds": self.max_seconds,
    }


class _Timeout(BaseException):  # Not caught by `except Exception`.
  pass


def _run_one(fn, prompt, response, reference):
  try:
    return plugins.to_score(fn(prompt, response, reference))
  except Exception as e:  # pylint: disable=broad-except
    return 0.0, False, f"error:{type(e).__name__}"


def _worker_main(conn, fn_spec: str, memory_limit_mb: int | None):
  """Loop of a worker process: receive (i, fn, prompt, response, ref), reply.

  `fn` is None for the pool's plug-in or another plug-in's spec (loaded once
  and kept)."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  fns = {None: plugins.load_reward_fn(fn_spec)}
  if memory_limit_mb:
    import resource  # pylint: disable=g-import-not-at-top
    limit = memory_limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  conn.send("ready")
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg is None:
      return
    i, spec, prompt, response, reference = msg
    try:
      if spec not in fns:
        fns[spec] = plugins.load_reward_fn(spec)
      out = _run_one(fns[spec], prompt, response, reference)
    except ValueError as e:
      out = (0.0, False, f"error:{type(e).__name__}")
    conn.send((i, out))


@dataclasses.dataclass
class _Worker:
  process: multiprocessing.Process
  conn: connection.Connection
  ready: bool = False
  task: int | None = None
  started: float = 0.0


class RewardScorer:
  """Scores rollout batches with a reward plug-in in killable workers.

  Usage:
    with RewardScorer(num_workers=2, timeout_s=5.0) as scorer:
      scores = scorer.score_batch(prompts, responses, references)
  """

  def __init__(self, fn: str = plugins.DEFAULT_REWARD_FN, num_workers: int = 2,
               timeout_s: float = 5.0, memory_limit_mb: int | None = 4096,
               start_method: str = "spawn"):
    """Starts the workers.

    Args:
      fn: the plug-in, `"module:function"`; checked here before any worker
        starts.
      num_workers: worker processes; 0 runs checks in this process.
      timeout_s: hard wall-clock limit per check.
      memory_limit_mb: address-space limit per worker (None: no limit).
      start_method: multiprocessing start method; `spawn` is safe in a
        process that has started JAX threads, `fork` is not.
    """
    if num_workers < 0 or timeout_s <= 0:
      raise ValueError("num_workers must be >= 0 and timeout_s > 0, got "
                       f"{num_workers}, {timeout_s}")
    self._fn_spec = fn
    self._fn = plugins.load_reward_fn(fn)
    self._timeout = timeout_s
    self._memory = memory_limit_mb
    self._ctx = multiprocessing.get_context(start_method)
    self._workers = []
    self._workers = [self._start_worker() for _ in range(num_workers)]
    self.restarts = 0
    self._failed_starts = 0
    self.total_timeouts = 0
    self.total_errors = 0

  # -- worker management ----------------------------------------------------
  def _start_worker(self) -> _Worker:
    parent, child = self._ctx.Pipe(duplex=True)
    proc = self._ctx.Process(target=_worker_main,
                             args=(child, self._fn_spec, self._memory),
                             daemon=True)
    proc.start()
    child.close()
    return _Worker(proc, parent)

  def _replace(self, k: int):
    w = self._workers[k]
    if w.process.is_alive():
      w.process.kill()
    w.process.join(timeout=5)
    w.conn.close()
    self._workers[k] = self._start_worker()
    self.restarts += 1

  def close(self):
    """Stops all workers (idempotent)."""
    for w in self._workers:
      try:
        w.conn.send(None)
      except (OSError, ValueError):
        pass
    for w in self._workers:
      w.process.join(timeout=1)
      if w.process.is_alive():
        w.process.kill()
        w.process.join()
      w.conn.close()
    self._workers = []

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass

  # -- scoring --------------------------------------------------------------
  def using(self, fn: str) -> "ScorerView":
    """The same worker pool scoring with another plug-in (e.g. the math
    reward in lenient mode for evaluation); checked here."""
    if fn == self._fn_spec:
      return ScorerView(self, None)
    plugins.load_reward_fn(fn)
    return ScorerView(self, fn)

  def score_batch(self, prompts: Sequence[str], responses: Sequence[str],
                  references: Sequence[str], fn: str | None = None) -> BatchScores:
    """Scores N (prompt, response, reference) triples.

    Args:
      fn: another plug-in to score with (None: the pool's own); prefer
        `using(fn)`, which checks it once.

    Returns:
      `BatchScores` in input order.
    """
    n = len(responses)
    if not len(prompts) == n == len(references):
      raise ValueError(f"lengths differ: {len(prompts)} prompts, {n} "
                       f"responses, {len(references)} references")
    tasks = list(zip(prompts, responses, references))
    if self._workers:
      results, seconds = self._score_in_workers(tasks, fn)
    else:
      results, seconds = self._score_in_process(
          tasks, self._fn if fn is None else plugins.load_reward_fn(fn))
    reasons = [r[2] for r in results]
    timeouts = sum(r == "timeout" for r in reasons)
    errors = sum(r.startswith("error:") for r in reasons)
    self.total_timeouts += timeouts
    self.total_errors += errors
    return BatchScores(
        rewards=np.asarray([r[0] for r in results], np.float32).reshape(n),
        correct=np.asarray([r[1] for r in results], bool).reshape(n),
        reasons=reasons, timeouts=timeouts, errors=errors,
        max_seconds=max(seconds, default=0.0))

  def _score_in_process(self, tasks, fn):
    use_alarm = threading.current_thread() is threading.main_thread()
    results, seconds = [], []
    def on_alarm(signum, frame):
      raise _Timeout()
    old = signal.signal(signal.SIGALRM, on_alarm) if use_alarm else None
    try:
      for prompt, response, reference in tasks:
        start = time.monotonic()
        try:
          if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, self._timeout)
          results.append(_run_one(fn, prompt, response, reference))
        except _Timeout:
          results.append((0.0, False, "timeout"))
        finally:
          if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        seconds.append(time.monotonic() - start)
    finally:
      if use_alarm:
        signal.signal(signal.SIGALRM, old)
    return results, seconds

  def _score_in_workers(self, tasks, fn):
    results = [None] * len(tasks)
    seconds = [0.0] * len(tasks)
    pending = collections.deque(range(len(tasks)))
    while pending or any(w.task is not None for w in self._workers):
      for w in self._workers:
        if w.ready and w.task is None and pending:
          i = pending.popleft()
          try:
            w.conn.send((i, fn, *tasks[i]))
          except (OSError, ValueError):
            pending.appendleft(i)  # The worker died while idle: retry.
            w.ready = False
            continue
          w.task, w.started = i, time.monotonic()
      now = time.monotonic()
      deadlines = [w.started + self._timeout for w in self._workers
                   if w.task is not None]
      wait_s = max(0.0, min(deadlines) - now) if deadlines else 1.0
      ready = connection.wait([w.conn for w in self._workers], timeout=wait_s)
      for k, w in enumerate(self._workers):
        if w.conn in ready:
          try:
            msg = w.conn.recv()
          except (EOFError, OSError):
            if not w.ready:
              self._failed_starts += 1
              if self._failed_starts > 3 * len(self._workers) + 3:
                raise RuntimeError(
                    f"reward workers for {self._fn_spec!r} keep dying at "
                    "start-up; run the plug-in in-process (num_workers=0) "
                    "to see its error") from None
            if w.task is not None:
              results[w.task] = (0.0, False, "error:crash")
              seconds[w.task] = time.monotonic() - w.started
            self._replace(k)
            continue
          if msg == "ready":
            w.ready = True
          else:
            i, out = msg
            results[i], seconds[i] = out, time.monotonic() - w.started
            w.task = None
      now = time.monotonic()
      for k, w in enumerate(self._workers):
        if w.task is not None and now - w.started > self._timeout:
          results[w.task] = (0.0, False, "timeout")
          seconds[w.task] = now - w.started
          self._replace(k)
    return results, seconds


@dataclasses.dataclass(frozen=True)
class ScorerView:
  """A `RewardScorer` pool seen through another plug-in (`fn`, None: the
  pool's own). Closing the pool closes the view."""
  scorer: RewardScorer
  fn: str | None

  def score_batch(self, prompts: Sequence[str], responses: Sequence[str],
                  references: Sequence[str]) -> BatchScores:
    return self.scorer.score_batch(prompts, responses, references, self.fn)
