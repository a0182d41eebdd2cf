"""The compile of a run, a line of its own (once per run, not in the step): the bounded
program set the run compiles and what each takes.

The set: per train pass (old log-probs, values, policy and critic updates) one program with
padded rows, or with packed rows one per row length its plans may use
(`rl.layout.Packed.programs`, named `policy_step[rows=nxT]` as the compile check names them);
the engine's decode copy, prefill per prompt bucket (`run.pass_sizes.prompt_buckets`), insert
and a decode chunk per row bucket (`sampling.decode_buckets`), and the evaluation engine's
insert and chunks; or the static sampler's
prefill and decode step (and the evaluation's). Each program's seconds: the compile check's
own measured time for it (`Setup.compile_times`; a probed check's is the two probes' sum),
else one of the same name's family (`prefill[256]` takes `prefill`'s), else the assumed
`Knobs.compile_s`, printed as such:

  compile = Σ_programs seconds;  per step = compile / rl.steps
"""

from __future__ import annotations

import collections


def program_set(st) -> list[str]:
  """The names of the programs one run compiles, each once (module docstring)."""
  from vapo_jax.rl import layout as layout_lib  # pylint: disable=import-outside-toplevel
  upd = st.rows // max(1, st.minibatches)
  passes = ([("logprobs", st.pack_forward, st.rows)] if st.old_logprobs_pass else [])
  passes += [("values", st.pack_forward, st.rows)] if st.use_critic else []
  passes += [("policy_step", st.pack_steps, upd)]
  passes += [("critic_step", st.pack_steps, upd)] if st.use_critic else []
  out = []
  for name, spec, rows in passes:
    if st.knobs.train == "packed" and spec is not None:
      out += [f"{name}[{label}]" for label in layout_lib.Packed(spec).programs(rows).values()]
    else:
      out.append(name)
  if st.knobs.rollout == "continuous":
    out += ["decode_copy"] + [f"prefill[{b}]" for b in st.prompt_buckets]
    out += ["insert"] + _chunks("decode_chunk", st.engine)
    out += (["eval_insert"] + _chunks("eval_decode_chunk", st.eval_engine)
            if st.eval_rows else [])
  else:
    out += ["prefill", "decode_step"] + (["eval_decode_step"] if st.eval_rows else [])
  return out


def _chunks(name: str, engine) -> list[str]:
  """The decode chunk's programs: one per row bucket (`EngineShape.row_buckets`), the
  smaller ones named by their rows per replica (`decode_chunk[64]`)."""
  rows = engine.row_buckets() if engine is not None else ()
  return [name] + [f"{name}[{r}]" for r in rows[1:]]


def from_check(reports, slice_name: str = "") -> dict:
  """{"compile_times", "compile_note"} for `Setup` from compile check reports (its --json: a
  list, one per slice; the one of `slice_name`, else the first that compiled)."""
  reports = [r for r in ([reports] if isinstance(reports, dict) else reports)
             if r.get("programs")]
  mine = [r for r in reports if r.get("slice") == slice_name] or reports
  if not mine:
    return {}
  r = mine[0]
  probes = r.get("extrapolated_from_layers")
  note = (f" (probes of {' and '.join(str(k) for k in probes)} layers, summed)" if probes
          else "")
  return {"compile_times": {k: float(v["compile_s"]) for k, v in r["programs"].items()
                            if not v.get("error")}, "compile_note": note}


def seconds(st, name: str) -> tuple[float, bool]:
  """(compile seconds of program `name`, whether measured)."""
  times = st.compile_times or {}
  if name in times:
    return float(times[name]), True
  family = [v for k, v in times.items() if k.split("[")[0] == name.split("[")[0]]
  if family:
    return float(sum(family) / len(family)), True
  return float(st.knobs.compile_s), False


def line(st) -> tuple[float, str]:
  """(seconds once per run, the report's compile line)."""
  names = program_set(st)
  got = [(n, *seconds(st, n)) for n in names]
  total = sum(s for _, s, _ in got)
  measured = sum(s for _, s, m in got if m)
  n_measured = sum(m for _, _, m in got)
  kinds = collections.Counter(n.split("[")[0] for n in names)
  what = ", ".join(f"{k} ×{c}" if c > 1 else k for k, c in kinds.items())
  parts = []
  if n_measured:
    parts.append(f"{n_measured} timed by the compile check{st.compile_note} {measured:,.0f} s")
  if n_measured < len(got):
    parts.append(f"{len(got) - n_measured} at an assumed {st.knobs.compile_s:g} s each "
                 "(no measured time: --compile_times=<compile_check --json>)")
  per = (f"; over rl.steps={st.run_steps}: {total / st.run_steps:.1f} s per step"
         if st.run_steps else "")
  return total, (f"compile, once per run (not in the step): {len(names)} programs ({what}); "
                 + " + ".join(parts) + f" = {total:,.0f} s{per}")
