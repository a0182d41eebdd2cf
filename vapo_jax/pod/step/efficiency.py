"""The two efficiencies of a step's train programs (old log-probs, values, policy and critic
updates), per chip, over the programs' time (exposed collectives included):

  MFU = model FLOPs / (time · peak)            HFU = executed FLOPs / (time · peak)

Model FLOPs as MaxText counts them (its `performance_metrics` guide): the real tokens only,
no rematerialisation, causal attention at the pairs n (n + 1) / 2 of a sequence of n tokens
(MaxText's n² / 2 and the diagonal), the LM head at the response positions (the critic's
value head, 2 D each); a forward once, an update three times (forward, and the backward's two
products per matmul, attention's too):

  fwd_b   = n_b m + n_b (n_b + 1) / 2 · a + l_b · head         n_b = p_b + l_b
  model   = Σ_passes (1 forward | 3 · epochs update) Σ_b fwd_b / chips

(m, a, head: `counts.Arch`.) Executed FLOPs are what the programs compute (`Program.flops`:
remat's recompute, padded and empty slots, the head at every slot of its chunks, the
kernel's extra pairs and its attention backward). The knobs `--mfu` (the estimate) and
`--mfu_ceiling` (the floor) are both the fraction of peak at which a program runs the FLOPs
it executes, i.e. the HFU of its compute alone: with no collectives exposed a program's HFU
is its knob. The floor executes its model FLOPs but for the attention backward's score
recompute (3.5 a per pair against MaxText's 3), so its MFU sits a little below its HFU.
"""

from __future__ import annotations

import numpy as np

TRAIN = ("logprobs", "values", "policy_step", "critic_step")


def model_flops(st, resp: np.ndarray, prompts: np.ndarray) -> float:
  """MaxText's model FLOPs per chip of one step's train programs (module docstring)."""
  a = st.arch
  l = np.asarray(resp, np.float64)
  n = np.asarray(prompts, np.float64) + l
  body = float(n.sum()) * a.matmul + float((n * (n + 1) / 2).sum()) * a.pair
  policy, critic = body + float(l.sum()) * a.head, body + float(l.sum()) * 2.0 * a.d
  total = 3.0 * st.epochs * policy + (policy if st.old_logprobs_pass else 0.0)
  if st.use_critic:
    total += 3.0 * st.epochs * critic + critic
  return total / st.chips


def of(st, programs: list, model: float) -> dict:
  """{"mfu", "hfu", "seconds", "executed"} of the train programs among `programs`."""
  train = [p for p in programs if p.name in TRAIN]
  secs = sum(p.time for p in train)
  executed = sum(p.flops for p in train)
  rate = max(secs, 1e-30) * st.peak
  return {"mfu": model / rate, "hfu": executed / rate, "seconds": secs, "executed": executed,
          "model": model}


def line(est: dict, flo: dict) -> str:
  return (f"efficiency of the train programs (MFU: model FLOPs as MaxText counts them; HFU: "
          f"the FLOPs executed; over their time, exposed collectives included): estimate "
          f"MFU {est['mfu']:.1%}, HFU {est['hfu']:.1%} ({est['executed'] / est['model']:.2f}× "
          f"the model FLOPs executed); floor MFU {flo['mfu']:.1%}, HFU {flo['hfu']:.1%}")
