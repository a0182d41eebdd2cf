"""Held-out accuracy with the run's own sampler and checker: avg@k, pass@k and greedy.

  avg@k  = mean over problems of (correct samples / k)  — the paper's AIME metric (k = 32)
  pass@k = mean over problems of [any of the k samples is correct]
  greedy = accuracy of the argmax decode (one sample)
"""

import jax
import numpy as np

from vapo_jax import rollout as rollout_lib


def sample_and_score(sampler, params, examples, text, scorer, key, batch_prompts: int):
  """Samples `sampler.cfg.n_per_prompt` responses per example and scores them.

  Returns:
    (scores [N, n] float32, lengths [N, n] int32, truncated [N, n] bool, responses list).
  """
  n = sampler.cfg.n_per_prompt
  scores, lengths, truncated, responses = [], [], [], []
  for start in range(0, len(examples), batch_prompts):
    chunk = list(examples[start:start + batch_prompts])
    real = len(chunk)
    chunk += [chunk[-1]] * (batch_prompts - real)  # keep one compiled shape
    key, sub = jax.random.split(key)
    out = sampler(params, [text.prompt_ids(ex.problem) for ex in chunk], sub)
    texts = [text.decode(r) for r in rollout_lib.response_lists(out)][:real * n]
    refs = [ex.answer for ex in chunk[:real] for _ in range(n)]
    prompts = [ex.problem for ex in chunk[:real] for _ in range(n)]
    s = scorer.score_batch(prompts, texts, refs)
    scores.append(s.rewards.reshape(real, n))
    lengths.append(np.asarray(out.lengths_B)[:real * n].reshape(real, n))
    truncated.append(np.asarray(out.truncated_B)[:real * n].reshape(real, n))
    responses += texts
  return (np.concatenate(scores), np.concatenate(lengths), np.concatenate(truncated),
          responses)


def accuracy_metrics(scores_Nxk: np.ndarray, threshold: float = 1.0) -> dict[str, float]:
  """avg@k and pass@k from a [problems, k] score matrix."""
  correct = scores_Nxk >= threshold
  k = correct.shape[1]
  return {f"avg@{k}": float(correct.mean()), f"pass@{k}": float(correct.any(axis=1).mean())}


def evaluate(sampled, greedy, params, examples, text, scorer, key, *, batch_prompts: int,
             threshold: float = 1.0) -> dict[str, float]:
  """avg@k / pass@k with the sampling sampler, accuracy with the greedy one."""
  out = {}
  if sampled is not None:
    scores, lengths, truncated, _ = sample_and_score(sampled, params, examples, text, scorer,
                                                     key, batch_prompts)
    out.update(accuracy_metrics(scores, threshold))
    out["response_length"] = float(lengths.mean())
    out["truncated_frac"] = float(truncated.mean())
  if greedy is not None:
    scores, _, _, _ = sample_and_score(greedy, params, examples, text, scorer, key,
                                       batch_prompts)
    out["greedy_accuracy"] = float((scores[:, 0] >= threshold).mean())
  return out
