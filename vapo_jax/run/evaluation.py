"""Held-out accuracy with the run's own sampler and checker: avg@k, pass@k and greedy.

  avg@k  = mean over problems of (correct samples / k)  — the paper's AIME metric (k = 32)
  pass@k = mean over problems of [any of the k samples is correct]
  greedy = accuracy of the argmax decode (one sample)

ci95_lo/avg@k, ci95_hi/avg@k: the 95% percentile-bootstrap interval of avg@k over the problems
(`vapo_jax.bootstrap`, 2,000 resamples, seed 0): how far another draw of as many problems
could move it. Differences between evaluations: `tools.compare` on their per-problem records.

Multi-host: every host walks the same examples; each samples and scores only the rows its
devices hold (`rl.rollout`, `rl.reward`), and the per-row scores are all-gathered, so every
host returns the same metrics.
"""

import jax
import numpy as np

from vapo_jax import bootstrap
from vapo_jax import distributed as dist
from vapo_jax.data import shortcuts
from vapo_jax.rl import reward as reward_lib
from vapo_jax.rl import rollout as rollout_lib
from vapo_jax.run import eval_records
from vapo_jax.sampler import types


def sample_and_score(sampler: types.RolloutSampler, params, examples, text, scorer, key,
                     batch_prompts: int):
  """Samples `sampler.cfg.n_per_prompt` responses per example and scores them.

  Returns:
    (scores [N, n] float32, lengths [N, n] int32, truncated [N, n] bool, responses list:
    the decoded responses of this host's rows, in row order).
  """
  n = sampler.cfg.n_per_prompt
  if sampler.continuous:  # one engine call: its slots bound the memory
    batch_prompts = len(examples)
  scores, lengths, truncated, responses = [], [], [], []
  for start in range(0, len(examples), batch_prompts):
    chunk = list(examples[start:start + batch_prompts])
    real = len(chunk)
    chunk += [chunk[-1]] * (batch_prompts - real)  # keep one compiled shape
    key, sub = jax.random.split(key)
    out = rollout_lib.sample(sampler, params,
                             lambda i, c=chunk: text.prompt_ids(c[i].problem), len(chunk), sub)
    scored = reward_lib.score(scorer, out, text.decode, [ex.problem for ex in chunk],
                              [ex.answer for ex in chunk])
    rows, resp = reward_lib.local_responses(out)
    responses += [text.decode(r) for row, r in zip(rows, resp) if row < real * n]
    lens, trunc = dist.to_host((out.lengths_B, out.truncated_B))
    scores.append(scored.all_scores.rewards[:real * n].reshape(real, n))
    lengths.append(lens[:real * n].reshape(real, n))
    truncated.append(trunc[:real * n].reshape(real, n))
  # Its KV cache (n rows per prompt) would otherwise stay allocated through training.
  sampler.clear_cache()
  return (np.concatenate(scores), np.concatenate(lengths), np.concatenate(truncated),
          responses)


def boxed_frac(responses) -> float:
  """Share of responses (this host's; summed over hosts) that contain a `\\boxed{`.

  The format rate beside lenient accuracy: learning to box an answer is not learning to
  solve, so the two are reported apart."""
  counts = np.array([sum("\\boxed{" in r for r in responses), len(responses)], np.int64)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    counts = np.asarray(multihost_utils.process_allgather(counts)).reshape(-1, 2).sum(0)
  return float(counts[0] / max(int(counts[1]), 1))


def accuracy_metrics(scores_Nxk: np.ndarray, threshold: float = 1.0) -> dict[str, float]:
  """avg@k and pass@k from a [problems, k] score matrix (k = every sample of a problem)."""
  scores_Nxk = np.asarray(scores_Nxk)
  if scores_Nxk.ndim != 2 or 0 in scores_Nxk.shape:
    raise ValueError(f"scores must be a [problems, k] matrix with both >= 1, got shape "
                     f"{scores_Nxk.shape}")
  correct = scores_Nxk >= threshold
  k = correct.shape[1]
  return {f"avg@{k}": float(correct.mean()), f"pass@{k}": float(correct.any(axis=1).mean())}


def kind_metrics(scores_Nxk: np.ndarray, kinds, threshold: float = 1.0) -> dict[str, float]:
  """avg@k per kind of problem: `avg@k/<kind>` = mean correct share over that kind's rows.

  Args:
    scores_Nxk: [problems, k] scores; kinds: the kind of each problem (length problems).
  """
  scores_Nxk = np.asarray(scores_Nxk)
  if len(kinds) != scores_Nxk.shape[0]:
    raise ValueError(f"{len(kinds)} kinds for {scores_Nxk.shape[0]} problems")
  kinds = np.asarray(kinds)
  correct, k = scores_Nxk >= threshold, scores_Nxk.shape[1]
  return {f"avg@{k}/{kind}": float(correct[kinds == kind].mean())
          for kind in sorted(set(kinds.tolist()))}


def evaluate(sampled: types.RolloutSampler, greedy: types.RolloutSampler, params, examples,
             text, scorer, key, *, batch_prompts: int, threshold: float = 1.0,
             short_tokens: int = 0, kind_of=None,
             records_path: str | None = None) -> dict[str, float]:
  """avg@k / pass@k with the sampling sampler (and boxed_frac, the share of its samples with a
  `\\boxed{}`), accuracy with the greedy one; with
  short_tokens > 0 also short_frac, the share of samples of at most that many tokens; with
  kind_of (example -> its kind, e.g. `data.chain_mix.kind_of`) also avg@k per kind.

  Beside every figure, `shortcut/<name>` (`data.shortcuts.scores`: answers that ignore the
  operations, scored on the same problems; `shortcut/best` the highest): a model's accuracy
  at or below them is no evidence of solving. With `records_path`, also writes one record
  per problem there (`run.eval_records`: each sample's correctness and length, greedy's, the
  problem's operations and the shortcuts' verdicts) for paired comparisons."""
  out = {f"shortcut/{k}": v for k, v in shortcuts.scores(examples).items()}
  correct = lengths = truncated = greedy_right = greedy_lengths = None
  if sampled is not None:
    scores, lengths, truncated, responses = sample_and_score(sampled, params, examples, text,
                                                             scorer, key, batch_prompts)
    correct = scores >= threshold
    out.update(accuracy_metrics(scores, threshold))
    k = correct.shape[1]
    ci = bootstrap.interval(correct.mean(axis=1), num_samples=2000, seed=0)
    out[f"ci95_lo/avg@{k}"], out[f"ci95_hi/avg@{k}"] = ci.lo, ci.hi
    out["boxed_frac"] = boxed_frac(responses)
    if kind_of is not None:
      out.update(kind_metrics(scores, [kind_of(ex) for ex in examples], threshold))
    out["response_length"] = float(lengths.mean())
    out["truncated_frac"] = float(truncated.mean())
    if short_tokens > 0:
      out["short_frac"] = float((lengths <= short_tokens).mean())
  if greedy is not None:
    scores, glens, _, _ = sample_and_score(greedy, params, examples, text, scorer, key,
                                           batch_prompts)
    greedy_right, greedy_lengths = scores[:, 0] >= threshold, glens[:, 0]
    out["greedy_accuracy"] = float(greedy_right.mean())
  if records_path:
    eval_records.write(records_path, eval_records.build(
        examples, correct, lengths, truncated, greedy_right, greedy_lengths))
  return out
