"""Calibrate the step model's efficiency on one accelerator: the trainer's own packed train
programs at one TPU chip's share of `configs/qwen32b.py`, timed, with their HFU and MFU beside
a plain-JAX reference at identical shapes.

  python benchmarks/calibrate_train.py --out=calibrate.json               # one chip / GPU
  python benchmarks/calibrate_train.py --peak_tflops=989 --out=...        # a GPU's bf16 peak
  python benchmarks/calibrate_train.py --toy --peak_tflops=1 --out=...    # CPU, 1-2 min
  python -m vapo_jax.pod.step_model ... --efficiency=calibrate.json      # the step model at
                                                                          # the measured HFU

Shapes (one chip of qwen32b on v5p-128: mesh 16 fsdp x 4 tensor, rl.micro_batch_size = 16,
so a chip runs one packed row per micro-batch with a quarter of the heads, the MLP and the
vocabulary): D 5,120, H 40 / 4 = 10 query and K 8 / 4 = 2 kv heads of Dh 128, F 27,648 / 4 =
6,912, V 152,064 / 4 = 38,016; L in --layers (default 4 and 8), the config's mix of
rematerialised blocks scaled to L as the compile check's probes are (`pod.fitting.probe_model`:
model.remat_layers, of them the last model.remat_selective keep their matmul outputs); one
packed row of T = P + R = 1,024 + 20,480 =
21,504 slots (--tokens). fp32 master weights, bf16 matmuls, the config's attention
(model.attention_kernel auto: splash on a TPU, the blocked scan elsewhere).

Programs: `vapo_jax.pod.programs.build` of the config on a one-device mesh (the trainer's
own `policy_step`, `critic_step` and `logprobs`, packed; the plan holds --segments in one
row): "one" (default) one sequence of P + R tokens filling the row, or a length spec of
`pod.lengths` (e.g. lognormal:2600,0.8, the review's mid phase) drawn until the row is full.
The reference (`calibrate_reference.py`): a minimal dense decoder at the same dims, remat and
vocabulary, attention by the platform's fused kernel, causal over the whole row.

Per program and layer count: compile seconds, one warm-up call, --steps timed calls
(`block_until_ready`), their median s; FLOPs per call (`vapo_jax.pod.step.efficiency`):

  executed  what the program computes: `pod.step.train_side`'s count at these shapes
            (remat's recompute, the LM head at every slot of its chunks, the kernel's
            computed attention pairs)
  model     MaxText's: Σ_b n_b m + n_b (n_b + 1) / 2 a + l_b head, x3 for an update
  HFU = executed / (median s · peak)           MFU = model / (median s · peak)

peak: the TPU generation's bf16 peak (`pod.slices`), else --peak_tflops (none: FLOP/s only).
The JSON (--out) is rewritten after every stage, so a run stopped by a time limit keeps what
it measured; `complete` is true once every stage ran. XLA's cost analysis of each compile is
recorded beside the counts (`xla_flops`; it counts a loop body once).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

PROGRAMS = ("logprobs", "policy_step", "critic_step")
REFERENCE = {"logprobs": "forward_lm", "policy_step": "update_lm",
             "critic_step": "update_value"}
# --toy: a few-second CPU run of the same code paths.
TOY = {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
       "intermediate_size": 128, "vocab_size": 512, "attention_block": 128}
TOY_TOKENS, TOY_PROMPT = 128, 32


def flags(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--layers", default="4,8", help="Layer counts, comma-separated.")
  p.add_argument("--tokens", type=int, default=0, help="Slots of the packed row, T = P + R "
                 "(default: the config's data.max_prompt_tokens + sampling.max_new_tokens).")
  p.add_argument("--steps", type=int, default=5, help="Timed calls per program.")
  p.add_argument("--segments", default="one", help='"one" sequence filling the row, or a '
                 "pod.lengths spec of response lengths (prompts uniform:80,400).")
  p.add_argument("--toy", action="store_true", help="Tiny dims (CPU, CI).")
  p.add_argument("--peak_tflops", type=float, default=0.0, help="Dense bf16 peak per "
                 "device, TFLOP/s (GPUs, CPUs); a TPU's comes from pod.slices.")
  p.add_argument("--no_reference", action="store_true", help="Skip the reference.")
  p.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen32b.py"))
  p.add_argument("--out", default="calibrate_train.json")
  return p.parse_args(argv)


# ---------------------------------------------------------------------------- shapes


def base_config(path: str, toy: bool, tokens: int, rows: int):
  """(config, tensor) of the run on one device: the experiment's config with mesh 1 x 1 x 1,
  one row per padded micro-batch and one row length (rl.packing_row_steps = 1), `rows`
  sequences in one mini-batch; tensor is the config's mesh.tensor (the per-chip split)."""
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("calibrate_cfg", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  tensor = max(1, c.mesh.tensor)
  p = TOY_PROMPT if toy else c.data.max_prompt_tokens
  t = tokens or (TOY_TOKENS if toy else p + c.sampling.max_new_tokens)
  p = min(p, t // 4)
  c.data.max_prompt_tokens, c.sampling.max_new_tokens = p, t - p
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
  c.rl.packing, c.rl.packing_row_steps = True, 1
  c.rl.prompts_per_step, c.rl.responses_per_prompt = rows, 1
  c.rl.num_minibatches, c.rl.micro_batch_size = 1, 1
  c.sampling.prompts_per_call, c.sampling.slots = 1, rows
  c.eval.batch_prompts, c.eval.samples_per_problem = 1, 1
  if toy:   # (rl.alpha auto: qwen32b's 0.05 is sized for 20k-token responses)
    c.model.attention_block, c.rl.alpha = TOY["attention_block"], 0.0
  return config_lib.from_config_dict(c), tensor


def model_config(cfg, tensor: int, layers: int, toy: bool):
  """The per-chip ModelConfig: heads, MLP and vocabulary / tensor; `layers` blocks with the
  config's mix of rematerialised blocks (model.remat_layers, model.remat_selective), scaled
  as the compile check's probes scale it (`pod.fitting.probe_model`)."""
  from vapo_jax.pod import archs  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import fitting  # pylint: disable=import-outside-toplevel
  full = archs.model_config(cfg).replace(remat=True)
  if toy:
    over = {k: v for k, v in TOY.items() if k != "attention_block"}
  else:
    over = {"num_heads": full.num_heads // tensor, "num_kv_heads": full.num_kv_heads // tensor,
            "head_dim": full.head_dim, "intermediate_size": full.intermediate_size // tensor,
            "vocab_size": full.vocab_size // tensor}
  return fitting.probe_model(full.replace(**over, real_vocab_size=None), layers)


def segments(spec: str, prompt: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
  """(p_B, l_B) of the sequences packed into one row of `tokens` slots: "one" fills it with
  one sequence; a length spec draws 256 responses (prompts uniform:80,400) and keeps, in
  order, each that still fits."""
  if spec == "one":
    return np.array([prompt]), np.array([tokens - prompt])
  from vapo_jax.pod import lengths  # pylint: disable=import-outside-toplevel
  resp = lengths.sample(spec, 256, tokens - prompt)
  prom = lengths.sample("uniform:80,400", 256, prompt, seed=2, prefix="prompt/length_")
  keep, used = [], 0
  for i, n in enumerate(resp + prom):   # first fit, in the draws' order
    if used + n <= tokens:
      keep.append(i)
      used += int(n)
  return prom[keep], resp[keep]


# ---------------------------------------------------------------------------- counts


def model_flops(arch, p_B, l_B) -> dict:
  """MaxText's model FLOPs per call (`pod.step.efficiency`): body = Σ_b n_b m + n_b (n_b + 1)
  / 2 a, n_b = p_b + l_b; forwards add Σ l_b head (the policy's LM head; the critic's value
  head 2 D); an update is 3 forwards."""
  n = np.asarray(p_B, np.float64) + np.asarray(l_B, np.float64)
  body = float(n.sum()) * arch.matmul + float((n * (n + 1) / 2).sum()) * arch.pair
  resp = float(np.sum(l_B))
  policy, critic = body + resp * arch.head, body + resp * 2.0 * arch.d
  return {"logprobs": policy, "values": critic, "policy_step": 3.0 * policy,
          "critic_step": 3.0 * critic}


def counts(cfg, mcfg, p_B, l_B, platform: str):
  """(step-model Setup, {program: executed FLOPs per call}, {program: model FLOPs}) on one
  device: `pod.step.train_side` on the config's packed passes with the kernel the platform
  runs (a TPU: as `model.attention_kernel` picks it; elsewhere the pure-JAX path)."""
  from vapo_jax.pod import slices  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import step  # pylint: disable=import-outside-toplevel
  kernel = step.train_kernel(mcfg, 1) if platform == "tpu" else "jax"
  st = step.Setup.of(cfg, mcfg, slices.parse("v5p-8"),
                     step.Knobs(train="packed", train_attention=kernel))
  st = dataclasses.replace(st, chips=1, tensor=1, train_tensor=1)
  executed = {p.name: p.flops for p in step.train_side(st, np.asarray(l_B), np.asarray(p_B))}
  return st, executed, model_flops(st.arch, p_B, l_B)


def peak_of(platform: str, kind: str, tflops: float) -> tuple[float | None, str]:
  """(peak bf16 FLOP/s per device, where it came from)."""
  if tflops > 0:
    return tflops * 1e12, "--peak_tflops"
  if platform == "tpu":
    from vapo_jax.pod import slices  # pylint: disable=import-outside-toplevel
    k = kind.lower().replace(" ", "")
    gen = ("v5p" if "v5p" in k else "v5e" if "v5" in k else "v6e" if "v6" in k
           else "v4" if "v4" in k else None)
    if gen:
      return slices.GENERATIONS[gen].bf16_flops, f"pod.slices ({gen})"
  return None, "unknown (pass --peak_tflops)"


# ---------------------------------------------------------------------------- arguments


def _put(tree, abstract):
  import jax  # pylint: disable=import-outside-toplevel
  return jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), tree, abstract)


def random_params(abstract, seed: int = 0):
  """Parameters of the abstract tree's shapes: float leaves normal(0, 0.02), others 0."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  leaves, tree = jax.tree.flatten(abstract)
  keys = jax.random.split(jax.random.key(seed), len(leaves))

  def one(k, a):
    if jnp.issubdtype(a.dtype, jnp.floating):
      return (0.02 * jax.random.normal(k, a.shape, jnp.float32)).astype(a.dtype)
    return jnp.zeros(a.shape, a.dtype)
  return _put(jax.tree.unflatten(tree, [one(k, a) for k, a in zip(keys, leaves)]), abstract)


def rollout_batch(abstract, p_B, l_B, vocab: int, seed: int = 0):
  """A RolloutBatch of the abstract one's fields: prompts left-padded in P columns,
  responses from column P, random tokens, advantages and returns."""
  from vapo_jax.rl import batch as batch_lib  # pylint: disable=import-outside-toplevel
  b, length = abstract.tokens_BxL.shape
  r = abstract.response_mask_BxR.shape[1]
  p = length - r
  rng = np.random.default_rng(seed)
  col = np.arange(length)[None, :]
  mask = ((col >= p - np.asarray(p_B)[:, None]) & (col < p + np.asarray(l_B)[:, None]))
  resp = mask[:, p:].astype(np.float32)
  vals = {"tokens_BxL": np.where(mask, rng.integers(1, vocab, (b, length)), 0).astype(np.int32),
          "mask_BxL": mask.astype(np.float32), "response_mask_BxR": resp,
          "advantages_BxR": (rng.standard_normal((b, r)) * resp).astype(np.float32),
          "old_logp_BxR": (-2.0 * resp).astype(np.float32),
          "old_values_BxR": np.zeros((b, r), np.float32),
          "returns_BxR": (rng.standard_normal((b, r)) * resp).astype(np.float32),
          "ref_logp_BxR": (-2.0 * resp).astype(np.float32),
          "scores_B": np.ones((b,), np.float32)}
  fields = {f.name: getattr(abstract, f.name) for f in dataclasses.fields(abstract)
            if getattr(abstract, f.name) is not None}
  return batch_lib.RolloutBatch(**_put({k: vals[k] for k in fields}, fields))


def concrete(prog, cfg, mesh, p_B, l_B, vocab: int):
  """(args, kwargs) of one `pod.programs.Program` with real arrays: a fresh TrainState of
  random parameters (`train_state.init_state`; the log-prob pass: the parameters alone), the
  batch and its packing plan (`rl.layout.plan_arrays` with the pass's PackSpec)."""
  from vapo_jax.rl import layout as layout_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import train_state  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import learners, meshes  # pylint: disable=import-outside-toplevel
  name = prog.name.split("[")[0]
  learner = {"policy_step": "policy", "critic_step": "critic"}.get(name, name)
  spec = learners.pass_spec(cfg, learner, mesh, meshes.train_rules_of(cfg))
  p, length = cfg.data.max_prompt_tokens, cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens
  plan = layout_lib.plan_arrays(p_B, l_B, spec, p, length)[0]
  if name == "logprobs":
    abs_params, abs_tok, abs_mask, abs_plan = prog.args
    batch = rollout_batch(_batch_like(abs_tok, abs_mask, cfg), p_B, l_B, vocab)
    return (random_params(abs_params), batch.tokens_BxL, batch.mask_BxL,
            _put(plan, abs_plan)), prog.kwargs
  abs_state, packed = prog.args
  state = train_state.init_state(random_params(abs_state.params),
                                 learners.optimizer(cfg, learner))
  batch = rollout_batch(packed.batch, p_B, l_B, vocab)
  return (state, layout_lib.PackedBatch(batch, _put(plan, packed.plan))), {}


def _batch_like(abs_tok, abs_mask, cfg):
  from vapo_jax.rl import batch as batch_lib  # pylint: disable=import-outside-toplevel
  b = batch_lib.abstract(abs_tok.shape[0], cfg.data.max_prompt_tokens,
                         cfg.sampling.max_new_tokens, abs_tok.sharding)
  return dataclasses.replace(b, tokens_BxL=abs_tok, mask_BxL=abs_mask)


# ---------------------------------------------------------------------------- timing


def time_program(fn, args, kwargs, steps: int, carry: int | None) -> dict:
  """Compile (AOT), one warm-up call, `steps` timed calls. carry: the output index that is
  the next call's argument 0 (a donated state), or None."""
  import jax  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  compiled = fn.lower(*args, **kwargs).compile()
  compile_s = time.perf_counter() - t0
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  xla = float(cost.get("flops", 0.0)) if cost else 0.0
  args = list(args)
  times = []
  for i in range(steps + 1):
    t0 = time.perf_counter()
    out = compiled(*args)
    jax.block_until_ready(out)
    if i:
      times.append(time.perf_counter() - t0)
    if carry is not None:
      args[0] = out[carry]
  return {"compile_s": compile_s, "step_s": times, "median_s": float(np.median(times)),
          "xla_flops": xla}


def rates(rec: dict, peak: float | None) -> dict:
  s = rec["median_s"]
  out = {"executed_tflops_per_s": rec["executed_flops"] / s / 1e12,
         "model_tflops_per_s": rec["model_flops"] / s / 1e12}
  if peak:
    out.update(hfu=rec["executed_flops"] / (s * peak), mfu=rec["model_flops"] / (s * peak))
  return out


# ---------------------------------------------------------------------------- stages


class Report:
  """The JSON file, rewritten (atomically) after every stage."""

  def __init__(self, path: str, meta: dict):
    self.path, self.data = path, {**meta, "stages": [], "complete": False}

  def add(self, stage: dict) -> None:
    self.data["stages"].append(stage)
    self.data["summary"] = summary(self.data["stages"])
    self.write()

  def write(self) -> None:
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(self.data, f, indent=1)
    os.replace(tmp, self.path)


def summary(stages: list[dict]) -> list[dict]:
  """Per program and layer count: vapo_jax's median s against the reference's."""
  ok = {(s["side"], s["name"], s["layers"]): s for s in stages if s["status"] == "ok"}
  out = []
  for (side, name, layers), s in ok.items():
    ref = ok.get(("reference", REFERENCE.get(name), layers))
    if side == "vapo_jax" and ref:
      out.append({"program": name, "layers": layers, "reference": ref["name"],
                  "time_ratio": s["median_s"] / ref["median_s"],
                  "hfu": s.get("hfu"), "reference_hfu": ref.get("hfu")})
  return out


def run_stage(report: Report, side: str, name: str, layers: int, make) -> None:
  """make() -> the stage's record (compile, timing, FLOPs); an exception is recorded."""
  t0 = time.perf_counter()
  print(f"[calibrate] {side} {name}, {layers} layers ...", flush=True)
  try:
    rec = {"side": side, "name": name, "layers": layers, **make(), "status": "ok"}
  except Exception as e:  # pylint: disable=broad-except  (OOM on a device: keep going)
    rec = {"side": side, "name": name, "layers": layers,
           "status": f"error: {type(e).__name__}: {str(e)[:400]}"}
  rec["wall_s"] = time.perf_counter() - t0
  extra = (f"compile {rec['compile_s']:.1f} s, step {rec['median_s'] * 1e3:.1f} ms"
           + (f", HFU {rec['hfu']:.1%}, MFU {rec['mfu']:.1%}" if "hfu" in rec else "")
           if rec["status"] == "ok" else rec["status"])
  print(f"[calibrate]   {extra}", flush=True)
  report.add(rec)


def ours(report, cfg, mcfg, layers, p_B, l_B, args, platform, peak) -> None:
  """The trainer's programs (`pod.programs.build`) at `layers` layers."""
  import jax  # pylint: disable=import-outside-toplevel
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  plan = programs.build(cfg, mcfg, mesh, PROGRAMS, lengths=(p_B, l_B))
  by = {p.name.split("[")[0]: p for p in plan.programs if p.trips}
  st, executed, model = counts(cfg, mcfg, p_B, l_B, platform)
  for name in ("policy_step", "logprobs", "critic_step"):
    prog = by[name]

    def make(prog=prog, name=name):
      a, kw = concrete(prog, cfg, mesh, p_B, l_B, mcfg.vocab_size)
      rec = time_program(prog.fn, a, kw, args.steps, None if name == "logprobs" else 0)
      rec.update(program=prog.name, kernel=st.arch.kernel, executed_flops=executed[name],
                 model_flops=model[name])
      return {**rec, **rates(rec, peak)}
    run_stage(report, "vapo_jax", name, layers, make)


def reference(report, mcfg, layers, t, p, args, platform, peak) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  import calibrate_reference as ref  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod.step import counts as step_counts  # pylint: disable=import-outside-toplevel
  dims = ref.Dims(layers, mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_heads,
                  mcfg.num_kv_heads, mcfg.head_dim, mcfg.vocab_size, mcfg.num_remat, t, p,
                  selective=mcfg.remat_selective)
  arch = step_counts.Arch.of(mcfg)
  model = model_flops(arch, [p], [t - p])   # one causal sequence over the row
  model = {"update_lm": model["policy_step"], "update_value": model["critic_step"],
           "forward_lm": model["logprobs"]}
  progs = ref.programs(dims, platform, jax.random.key(1))
  for name in ("update_lm", "forward_lm", "update_value"):
    fn, build = progs[name]

    def make(fn=fn, build=build, name=name):
      rec = time_program(fn, build(), {}, args.steps, None)
      rec.update(attention=ref.attention_impl(platform) or "xla",
                 executed_flops=ref.flops(dims, name), model_flops=model[name])
      return {**rec, **rates(rec, peak)}
    run_stage(report, "reference", name, layers, make)


def main(argv=None) -> dict:
  args = flags(argv)
  import jax  # pylint: disable=import-outside-toplevel
  dev = jax.devices()[0]
  platform, kind = dev.platform, getattr(dev, "device_kind", "")
  peak, peak_from = peak_of(platform, kind, args.peak_tflops)
  layer_counts = [int(x) for x in args.layers.split(",") if x]
  cfg, tensor = base_config(args.config, args.toy, args.tokens, 1)
  p, t = cfg.data.max_prompt_tokens, cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens
  p_B, l_B = segments(args.segments, p, t)
  if len(p_B) > 1:
    cfg, _ = base_config(args.config, args.toy, args.tokens, len(p_B))
  mcfg0 = model_config(cfg, tensor, layer_counts[0], args.toy)
  meta = {"what": "calibrate_train: the trainer's packed train programs at one chip's shapes",
          "argv": sys.argv[1:] if argv is None else list(argv), "platform": platform,
          "device_kind": kind, "jax": jax.__version__, "peak_flops": peak,
          "peak_from": peak_from, "toy": args.toy, "tokens": t, "prompt": p,
          "segments": {"spec": args.segments, "prompt": p_B.tolist(), "response": l_B.tolist()},
          "dims": {"d": mcfg0.hidden_size, "f": mcfg0.intermediate_size,
                   "heads": mcfg0.num_heads, "kv_heads": mcfg0.num_kv_heads,
                   "head_dim": mcfg0.head_dim, "vocab": mcfg0.vocab_size,
                   "tensor_split": tensor, "remat_fraction": mcfg0.num_remat / mcfg0.num_layers,
                   "selective_fraction": mcfg0.remat_selective / mcfg0.num_layers},
          "layers": layer_counts, "steps": args.steps, "target_layers": None}
  from vapo_jax.pod import archs  # pylint: disable=import-outside-toplevel
  meta["target_layers"] = archs.model_config(cfg).num_layers
  report = Report(args.out, meta)
  report.write()
  # Ours at every layer count first (what the step model needs), then the reference.
  for layers in layer_counts:
    ours(report, cfg, model_config(cfg, tensor, layers, args.toy), layers, p_B, l_B, args,
         platform, peak)
    jax.clear_caches()
  for layers in layer_counts * (not args.no_reference):
    reference(report, model_config(cfg, tensor, layers, args.toy), layers, t, p, args,
              platform, peak)
    jax.clear_caches()
  report.data["complete"] = True
  for r in report.data["summary"]:
    print(f"[calibrate] {r['program']:12s} {r['layers']} layers: {r['time_ratio']:.2f}x the "
          f"reference's time" + (f"; HFU {r['hfu']:.1%} against its {r['reference_hfu']:.1%}"
                                  if r["hfu"] is not None else ""))
  from vapo_jax.pod.step import measured  # pylint: disable=import-outside-toplevel
  try:
    m = measured.extrapolate(report.data, meta["target_layers"])
    report.data["extrapolated"] = {k: m[k] for k in ("hfu", "mfu", "how", "per_program")}
    print(f"[calibrate] at {meta['target_layers']} layers: HFU {m['hfu']:.1%}, MFU "
          f"{m['mfu']:.1%} ({m['how']}); the step model takes it with --efficiency={args.out}")
  except ValueError as e:   # no peak, or nothing measured
    print(f"[calibrate] no extrapolation: {e}")
  report.write()
  print(f"[calibrate] wrote {args.out}", flush=True)
  return report.data


if __name__ == "__main__":
  main()
