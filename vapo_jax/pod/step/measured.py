"""A measured efficiency in place of the assumed one (`step_model --efficiency=FILE`): the
train programs' HFU from `benchmarks/calibrate_train.py`'s JSON, extrapolated from its layer
counts to the model's.

Per program p (the trainer's policy_step, critic_step and logprobs; the step's value pass is
a forward like logprobs) with median call times t_p(L1), t_p(L2) at L1 < L2 layers, the
two largest layer counts measured:

  per layer   τ_p = (t_p(L2) − t_p(L1)) / (L2 − L1)        fixed   φ_p = t_p(L1) − L1 τ_p
  at L        t_p(L) = φ_p + L τ_p           (φ: embedding, LM head, loss, optimizer; τ: a block)
  FLOPs       F_p(L): the same line through the counted executed FLOPs (exact: they are
              linear in L at a fixed remat fraction); M_p(L) the model FLOPs
  HFU(L)      = Σ_p F_p(L) / (Σ_p t_p(L) · peak)           MFU(L) = Σ_p M_p(L) / (...)

The sum weighs each program by one call, as a step's train side roughly does (two updates
and two forwards over the same packed tokens). With one layer count, its HFU as measured
(no extrapolation; the line says so). HFU is a fraction of the measuring device's peak; the
step model applies it to the slice's own peak as `--hfu` (the fraction of peak at which the
programs run the FLOPs they execute: `efficiency`), in place of the assumed value.
"""

from __future__ import annotations

import json

PROGRAMS = ("policy_step", "critic_step", "logprobs")


def load(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _line_at(x1: float, y1: float, x2: float, y2: float, x: float) -> tuple[float, float]:
  """(value at x, slope) of the line through (x1, y1), (x2, y2); x1 == x2: (y1, 0)."""
  if x2 == x1:
    return y1, 0.0
  slope = (y2 - y1) / (x2 - x1)
  return y1 + (x - x1) * slope, slope


def extrapolate(data: dict, layers: int) -> dict:
  """{"hfu", "mfu", "how", "per_program", "platform", "device_kind", "peak"} at `layers`
  from a calibrate_train JSON (module docstring). ValueError if it holds no usable stage."""
  peak = data.get("peak_flops")
  if not peak:
    raise ValueError("the efficiency file has no peak FLOP/s (calibrate_train "
                     "--peak_tflops): no HFU to use")
  ok = {}
  for s in data.get("stages", []):
    if s.get("side") == "vapo_jax" and s.get("status") == "ok" and s["name"] in PROGRAMS:
      ok.setdefault(s["name"], {})[int(s["layers"])] = s
  per, total_t, total_f, total_m, flat = {}, 0.0, 0.0, 0.0, []
  counts = sorted({n for by in ok.values() for n in by})
  use = counts[-2:]
  for name, by in sorted(ok.items()):
    if not all(n in by for n in use):
      continue
    lo, hi = by[use[0]], by[use[-1]]
    t, tau = _line_at(use[0], lo["median_s"], use[-1], hi["median_s"], layers)
    f, _ = _line_at(use[0], lo["executed_flops"], use[-1], hi["executed_flops"], layers)
    m, _ = _line_at(use[0], lo["model_flops"], use[-1], hi["model_flops"], layers)
    if len(use) == 2 and tau <= 0:
      # More layers not slower (timing noise): the larger count's HFU, not a line.
      t, tau = hi["median_s"] * f / hi["executed_flops"], 0.0
      flat.append(name)
    per[name] = {"seconds": t, "per_layer_s": tau, "fixed_s": t - layers * tau,
                 "executed": f, "model": m, "hfu": f / (t * peak) if t > 0 else 0.0}
    total_t, total_f, total_m = total_t + t, total_f + f, total_m + m
  if not per or total_t <= 0:
    raise ValueError("the efficiency file holds no timed train program (calibrate_train "
                     "stages policy_step / critic_step / logprobs with status ok)")
  if len(use) == 2:
    how = (f"extrapolated to {layers} layers from {use[0]} and {use[1]}: per program "
           f"t(L) = t({use[0]}) + (L − {use[0]}) (t({use[1]}) − t({use[0]})) / "
           f"{use[1] - use[0]}, FLOPs likewise")
    if flat:
      how += (f"; {', '.join(flat)} not slower at {use[1]} than at {use[0]} layers (noise): "
              f"at {use[1]} layers' HFU")
  else:
    how = f"as measured at {use[0]} layers (one layer count: not extrapolated to {layers})"
  return {"hfu": total_f / (total_t * peak), "mfu": total_m / (total_t * peak), "how": how,
          "per_program": per, "platform": data.get("platform", "?"),
          "device_kind": data.get("device_kind", ""), "peak": peak,
          "toy": bool(data.get("toy")), "complete": bool(data.get("complete"))}


def line(m: dict, path: str, assumed: float) -> str:
  """The report's line: which efficiency the estimate uses and where it came from."""
  progs = ", ".join(f"{k} {v['hfu']:.1%}" for k, v in sorted(m["per_program"].items()))
  kind = m["device_kind"] if m["device_kind"] != m["platform"] else ""
  where = f"{m['platform']} {kind}".strip()
  notes = []
  if m["platform"] != "tpu":
    notes.append("not a TPU: a fraction of that device's peak")
  if m["toy"]:
    notes.append("toy shapes")
  if not m["complete"]:
    notes.append("an incomplete run")
  note = f" ({'; '.join(notes)})" if notes else ""
  return (f"efficiency: MEASURED, not assumed: --hfu={m['hfu']:.3f}, the train programs' HFU "
          f"from {path} on {where}{note} ({progs}; MFU {m['mfu']:.1%}; {m['how']}), in place "
          f"of the assumed {assumed:g}")


ASSUMED = "every efficiency (HFU, bandwidth, latency) is assumed, none measured"


def mark(report_text: str) -> str:
  """A phase's report with the "not counted" line's efficiency clause made true for a
  measured HFU (`terms.NOT_COUNTED` says every efficiency is assumed)."""
  return report_text.replace(ASSUMED, "the HFU measured (--efficiency), the bandwidth and "
                             "latency efficiencies assumed")
