"""What one RL step's lengths cost: the per-step metrics the step model reads back.

Pure numpy on host arrays of one rollout of B rows (B = calls · rows_per_call, rows of call c
contiguous, as `rl.rollout.sample` concatenates them):

  response/length_{min,p10,p50,p90,p99,max}    quantiles of the response lengths ℓ
  response/length_hist/le_E                    share of rows with ℓ <= E, fixed edges
                                               `HIST_EDGES` (and the cap R)
  prompt/length_{min,p10,p50,p90,p99,max}      quantiles of the real (unpadded) prompt lengths
  rollout/decode_steps_per_call_{mean,max}     steps the sampler's while loops ran per call:
                                               max ℓ of the call − 1 (token 0 comes from the
                                               prefill; the loop exits when every row stopped)
  perf/rollout_token_efficiency                Σ ℓ / Σ_calls rows_per_call · max ℓ of the call:
                                               response tokens kept / decode slots computed
  perf/<pass>_token_efficiency                 Σ (prompt + ℓ) / tokens the pass computed, for
                                               the passes logprobs, values, policy, critic
                                               (today every row is P + R tokens)

`pod.lengths` reads the quantiles back (`--lengths=metrics.jsonl`).
"""

from __future__ import annotations

import numpy as np

QUANTILES = (("min", 0.0), ("p10", 0.10), ("p50", 0.50), ("p90", 0.90), ("p99", 0.99),
             ("max", 1.0))
HIST_EDGES = (256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
PASSES = ("logprobs", "values", "policy", "critic")


def quantiles(x: np.ndarray, prefix: str) -> dict[str, float]:
  x = np.asarray(x, np.float64)
  return {f"{prefix}{k}": float(np.quantile(x, q)) for k, q in QUANTILES}


def length_metrics(lengths_B, prompt_lengths_B, *, prompt_len: int, max_new_tokens: int,
                   rows_per_call: int, computed_tokens: dict[str, float] | None = None
                   ) -> dict[str, float]:
  """The metrics above. computed_tokens: {pass: tokens it computed} (default: B · (P + R))."""
  ell = np.asarray(lengths_B, np.int64).reshape(-1)
  pr = np.asarray(prompt_lengths_B, np.int64).reshape(-1)
  if ell.size == 0 or ell.shape != pr.shape:
    raise ValueError(f"lengths {ell.shape} and prompt lengths {pr.shape}: need the same "
                     "non-empty shape")
  b = ell.size
  per = max(1, min(int(rows_per_call or b), b))
  calls = -(-b // per)
  cmax = np.array([ell[c * per:(c + 1) * per].max() for c in range(calls)])
  out = {**quantiles(ell, "response/length_"), **quantiles(pr, "prompt/length_")}
  for e in (*HIST_EDGES, max_new_tokens):
    if e <= max_new_tokens:
      out[f"response/length_hist/le_{e}"] = float((ell <= e).mean())
  out["rollout/decode_steps_per_call_mean"] = float((cmax - 1).mean())
  out["rollout/decode_steps_per_call_max"] = float((cmax - 1).max())
  sizes = np.array([min(per, b - c * per) for c in range(calls)])
  out["perf/rollout_token_efficiency"] = float(ell.sum() / max(1, (sizes * cmax).sum()))
  real = float((ell + pr).sum())
  padded = float(b * (prompt_len + max_new_tokens))
  computed = computed_tokens or {}
  for name in PASSES:
    out[f"perf/{name}_token_efficiency"] = real / max(1.0, float(computed.get(name, padded)))
  return out
