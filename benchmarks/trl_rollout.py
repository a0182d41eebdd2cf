"""The rollout alone, the last part of benchmarks/trl_bench.py: our engine, our static
sampler and transformers `generate` on TRL's model, on the same P prompts × G samples, in
response tokens/s (response tokens up to and including EOS) and their ratios per round.
Ours run in our side's process (`OurRollouts`, served by trl_ours.py), `generate` here.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import quiet
import rollout_floor


def response_tokens(ids_BxR: np.ndarray, eos_ids) -> np.ndarray:
  """Response lengths [B] of generated ids [B, R]: up to and including the first EOS, else R."""
  ids = np.asarray(ids_BxR)
  hit = np.isin(ids, np.asarray(list(eos_ids)))
  first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, ids.shape[1])
  return first.astype(np.int64)


def rollout_rounds(times_s: dict[str, list[float]], tokens: dict[str, list[float]]
                   ) -> quiet.Rounds:
  """Rounds of seconds per 1000 response tokens (so a time ratio is a tokens/s ratio)."""
  return quiet.Rounds({k: [1000.0 * t / max(n, 1.0) for t, n in zip(times_s[k], tokens[k])]
                       for k in times_s}, [])


class OurRollouts:
  """Our side of the rollout alone, in our process (benchmarks/trl_ours.py): `(name, i)`
  runs one rollout of the P prompts × G on the trainer's engine ("engine") or on the static
  sampler ("static", built on first use) and returns its seconds, response tokens and each
  response's tokens (EOS included); `floor` sets the engine's rounds against their floor."""

  def __init__(self, args, cfg, t, examples):
    import jax  # pylint: disable=import-outside-toplevel
    self.args, self.cfg, self.t, self.examples = args, cfg, t, examples
    self.key = jax.random.key(args.seed + 11)
    self._static = None

  def sampler(self, name: str):
    from vapo_jax.run import sampling  # pylint: disable=import-outside-toplevel
    p = self.t.parts
    if name == "engine":
      return p.samplers.rollout
    if name != "static":
      raise ValueError(f"no sampler {name!r} (engine, static)")
    if self._static is None:
      static_cfg = dataclasses.replace(self.cfg, sampling=dataclasses.replace(
          self.cfg.sampling, engine="static"))
      self._static = sampling.build_sampler(static_cfg, p.graphdef, p.model_cfg, p.mesh, p.rules,
                                            p.text, n=self.args.group,
                                            rows=self.args.prompts * self.args.group)
    return self._static

  def __call__(self, name: str, i: int) -> tuple[float, float, list[int]]:
    import jax  # pylint: disable=import-outside-toplevel
    from vapo_jax.rl import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
    sampler, text, ex = self.sampler(name), self.t.parts.text, self.examples
    t0 = time.perf_counter()
    roll = rollout_lib.sample(sampler, self.t.state.policy_params,
                              lambda j: text.prompt_ids(ex[j].problem), len(ex),
                              jax.random.fold_in(self.key, i))
    lengths = np.asarray(jax.block_until_ready(roll.lengths_B))
    sampler.clear_cache()
    return time.perf_counter() - t0, float(lengths.sum()), [int(x) for x in lengths]

  def floor(self, lengths, seconds, peaks) -> dict | None:
    p, text = self.t.parts, self.t.parts.text
    prompt_lens = [len(text.prompt_ids(e.problem)) for e in self.examples]
    return engine_floor(p.samplers.rollout, p.model_cfg, prompt_lens, self.args.group,
                        lengths, seconds, peaks)


def rollout_alone(args, ours, trainer, tok, rendered, eos_ids, load, results, write
                  ) -> list[str]:
  """The rollout alone: engine, static sampler (both in our process, `ours`: a
  trl_ours.OursProcess), transformers generate (here); see the doc."""
  import torch  # pylint: disable=import-outside-toplevel
  hf_model = trainer.model.eval()
  enc = tok(rendered, add_special_tokens=False, padding=True, padding_side="left",
            return_tensors="pt").to(hf_model.device)
  times, toks = {"engine": [], "static": [], "generate": []}, {"engine": [], "static": [],
                                                                "generate": []}
  engine_lengths: list[list[int]] = []  # per round: each response's tokens (EOS included)

  def ours_rollout(name, i):
    seconds, n, lengths = ours.rollout(name, i)
    times[name].append(seconds)
    toks[name].append(n)
    if name == "engine":
      engine_lengths.append(lengths)

  def hf_generate(i):
    def go():
      torch.manual_seed(args.seed + i)
      with torch.no_grad():
        out = hf_model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=args.max_new, num_return_sequences=args.group,
                                pad_token_id=tok.pad_token_id, eos_token_id=list(eos_ids))
      return float(response_tokens(out[:, enc["input_ids"].shape[1]:].cpu().numpy(),
                                   eos_ids).sum())
    return _timed_into(go, "generate", times, toks)

  round_s: list[float] = []
  for i in range(args.rollout_rounds + 1):  # round 0: compiles, first calls
    if i >= 2 and args.deadline and time.time() + max(round_s[1:]) + 5 > args.deadline:
      print(f"note: rollout alone stopped after {i - 1} timed round(s) (deadline)")
      break
    t0 = time.perf_counter()
    sides = [lambda i=i: ours_rollout("engine", i), lambda i=i: ours_rollout("static", i),
             lambda i=i: hf_generate(i)]
    for side in (reversed(sides) if i % 2 else sides):
      side()
    load.sample()
    round_s.append(time.perf_counter() - t0)
  warm = {k: v[1:] for k, v in times.items()}
  wtok = {k: v[1:] for k, v in toks.items()}
  lines = []
  results["rollout"] = {"seconds": times, "response_tokens": toks}
  if all(warm.values()):
    roll = rollout_rounds(warm, wtok)
    tps = {k: sum(wtok[k]) / sum(warm[k]) for k in warm}
    lines.append("rollout alone (same prompts x G, same max new tokens): " + ", ".join(
        f"{k} {tps[k]:.0f} response tokens/s" for k in tps))
    lines.append(roll.describe_ratio("engine", "generate", "engine vs transformers generate "
                                     "(tokens/s, ours / theirs)"))
    lines.append(roll.describe_ratio("engine", "static", "engine vs static sampler "
                                     "(tokens/s; the issue: must be >= 1)"))
    results["rollout"].update({"tokens_per_s": tps, **roll.to_json(
        [("engine", "generate"), ("engine", "static")])})
    floor = ours.floor(engine_lengths[1:], warm["engine"], results.get("machine_peaks"))
    if floor:
      lines.append(floor["line"])
      results["rollout"]["floor"] = floor
  results["stage"] = "rollout"
  write(results)
  return lines


def engine_floor(engine, mcfg, prompt_lens, group, lengths, seconds, peaks) -> dict | None:
  """The engine's rounds against their floor (benchmarks/rollout_floor.py), both dtypes."""
  if not peaks or not lengths:
    return None
  dbytes = int(np.dtype(engine.decode_dtype).itemsize)
  out = {"decode_dtype": str(np.dtype(engine.decode_dtype)), "rounds": []}
  for lens in lengths:  # response b belongs to prompt b // group (the rollout's order)
    rp = [prompt_lens[b // group] for b in range(len(lens))]
    out["rounds"].append({
        wb: rollout_floor.floor_seconds(rollout_floor.model_terms(mcfg, wb), prompt_lens, rp,
                                        lens, peaks["flops_peak"] if wb == 4
                                        else peaks.get("bf16_flops_peak", peaks["flops_peak"]),
                                        peaks["bw_peak"]) for wb in sorted({dbytes, 4})})
  floors = [r[dbytes] for r in out["rounds"]]
  out["seconds"] = list(seconds)
  out["share"] = [f["floor_s"] / s for f, s in zip(floors, seconds)]
  out["line"] = rollout_floor.describe(seconds, floors, f"engine ({out['decode_dtype']} "
                                       "decode copy) against its floor")
  if dbytes != 4:
    f32 = [r[4] for r in out["rounds"]]
    out["share_of_float32_floor"] = [f["floor_s"] / s for f, s in zip(f32, seconds)]
    out["line"] += (f"; {100 * np.mean(out['share_of_float32_floor']):.0f}% of the float32 "
                    "decode copy's floor")
  out["rounds"] = [{str(k): v for k, v in r.items()} for r in out["rounds"]]
  return out


def _timed_into(fn, name, times, toks):
  t0 = time.perf_counter()
  n = fn()
  times[name].append(time.perf_counter() - t0)
  toks[name].append(n)


