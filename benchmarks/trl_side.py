"""TRL's side of benchmarks/trl_bench.py: the GRPOTrainer it builds, the timer that splits
its steps, and the callback that runs our step beside each of TRL's (see trl_bench's doc).

Per TRL step the timer keeps the phases' seconds and what the step generated: each
completion's length (its `completion_mask`, EOS included, as ours counts) and the padded
widths TRL computed on ([rows, longest prompt + longest completion]); the callback keeps TRL's
own logged metrics (`completions/mean_length`, ...) per step.
"""

from __future__ import annotations

import time

# TRL's logged metrics kept per step (its own account of the lengths it generated).
TRL_LOGGED = ("completions/mean_length", "completions/min_length", "completions/max_length",
              "completions/clipped_ratio", "completions/mean_terminated_length",
              "num_tokens")


def completion_facts(output) -> dict:
  """From `_generate_and_score_completions`'s output dict: the generated lengths per
  completion and the padded shape TRL ran its passes on ({} where the keys are missing)."""
  if not isinstance(output, dict) or "completion_mask" not in output:
    return {}
  mask = output["completion_mask"]
  lengths = [int(x) for x in mask.sum(dim=1).tolist()]
  out = {"generated_lengths": lengths,
         "padded": {"rows": int(mask.shape[0]), "completion_len": int(mask.shape[1])}}
  if "prompt_ids" in output:
    out["padded"]["prompt_len"] = int(output["prompt_ids"].shape[1])
  return out


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
      out = None
      try:
        out = inner(*a, **k)
        return out
      finally:
        self._cur[key] = self._cur.get(key, 0.0) + time.perf_counter() - t0
        if flag:
          self._in_experience = False
          self._cur.update(completion_facts(out))
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
  """A GRPOTrainer over exactly these prompts with the settings of trl_bench's doc."""
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


def should_stop(now: float, deadline: float | None, round_s: list[float],
                reserve_s: float) -> bool:
  """Whether another round would run past `deadline` (epoch s; None: never stop early):
  the next round is taken to last as long as the longest timed one so far (the warm-up's
  compiles left out once a timed round exists), and `reserve_s` stays for what follows."""
  if deadline is None or not round_s:
    return False
  longest = max(round_s[1:]) if len(round_s) > 1 else round_s[0]
  return now + longest + reserve_s > deadline


def make_callback(state: dict):
  """The callback that times TRL's steps and runs ours beside them, alternating the order.

  state: "round" (int), "ours" (runs our step), "timer" (TRLTimer), "load" (quiet.Load),
  optional "after_round" (called after each round, e.g. to write the JSON), "deadline"
  (epoch s) with "reserve_s", and "logs" (a list that receives TRL's logged metrics)."""
  import transformers  # pylint: disable=import-outside-toplevel

  class Interleave(transformers.TrainerCallback):
    def on_step_begin(self, args, s, control, **kw):
      state["t_round"] = time.perf_counter()
      if state["round"] % 2:
        state["ours"]()
      state["timer"].begin()

    def on_step_end(self, args, s, control, **kw):
      state["timer"].end()
      if not state["round"] % 2:
        state["ours"]()
      state["round"] += 1
      state["load"].sample()
      state.setdefault("round_s", []).append(time.perf_counter() - state["t_round"])
      if state.get("after_round"):
        state["after_round"]()
      if should_stop(time.time(), state.get("deadline"), state["round_s"],
                     state.get("reserve_s", 0.0)):
        print(f"note: stopping after {state['round']} round(s): the next would pass the "
              "deadline (GPU_CHECK_DEADLINE / --deadline)", flush=True)
        control.should_training_stop = True

    def on_log(self, args, s, control, logs=None, **kw):
      if logs and any(k in logs for k in TRL_LOGGED):
        state.setdefault("logs", []).append({k: logs[k] for k in TRL_LOGGED if k in logs})
  return Interleave()
