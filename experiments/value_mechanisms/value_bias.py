"""The value model's mechanisms against Monte-Carlo ground truth (M1–M3), one command.

  python -m experiments.value_mechanisms.value_bias --config=configs/chain_or_guess.py \\
      --out=/tmp/vb_cog [--sft_workdir=<an SFT run, e.g. W/shared/stage-sft-KEY of ablate>] \\
      [--buckets=15,80] [--smoke] [--config.x=y ...]

On a fixed policy π₀ (the SFT checkpoint; without --sft_workdir the config's SFT runs first,
in-process): --prompts held-out problems, one response each, cut at every step boundary
(after each newline) and at 0; --continuations samples of π₀ from every prefix give V̂*
(`value_bias_stats`). The critics are evaluated on the same prefixes:

  zero_head        the critic VAPO's value pretraining starts from (policy + zero head)
  reward_model     the reward-model stage's outcome RM (reward_model.steps), PPO's start
  vp@N             value pretraining from the zero head after N steps (--budgets), MC targets

  M1  bias V − V̂* and EV (MC noise removed) by fifth of the response, per critic
  M2  per length bucket: bias/MSE of the token advantage at each step's first token (against
      V̂*(c + 1) − V̂*(c), so prefixes c + 1 are sampled too) for λ ∈ {0.95, 0.8, 1.0} and
      α ∈ {0.05, 0.5}, and the MSE-optimal constant λ, per critic (and M2-step, the step-sum
      variant, for comparison). Both cut where π₀ emits with p ≈ 1, so neither tests the
      length-adaptive claim (issue 45); kept for the record.
  M2d M2 where decisions are made (`m2_decision`): cuts at the first token and after each
      --decision_after token (the result digit after `=`, the boxed answer), λ scored by
      corr(Â, A*) and sign accuracy, best λ with a bootstrap interval over responses
  M1 controls: a constant head at π₀'s mean return beside the zero head, through the same
      bias-by-fifth table; and every critic's value at the final token (V after the whole
      response: the quantity a reward model is trained on) against the reward
  M3  two critics from the zero head on the same rollouts (same keys and prompts): MC targets
      (λ_c = 1, the vp@N run itself) and coupled ones (λ_c = λ_policy, value_pretrain.
      coupled_gae); per step V(s₀), V(s_last), the batch's mean return, EV

Cost: M2d adds the prefixes c and c + 1 of every decision cut to the continuations (about one
per step, so roughly twice the step-boundary sampling); --decision_after="" skips it.
Writes OUT/value_bias.json (everything) and OUT/value_bias.md (the tables). --smoke runs every
part at a few samples (the config's SMOKE overrides and tiny budgets): a check that the
command runs, not a measurement. Full sizes on 2 quiet CPU cores: 15 min (chain_or_guess, from
its band-selected SFT start, --budgets=64,128) and 18 min (longcot, its 900 SFT steps included).
"""

import dataclasses
import json
import os
import sys
import time

import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.ablation import config_file
from experiments.value_mechanisms import m2_decision
from experiments.value_mechanisms import value_bias_stats as stats
from vapo_jax import config as config_lib

CONSTANT = "constant_head"  # M1's control: V ≡ π₀'s mean return (the suite's responses)
LAMBDAS = {"λ=0.95": ("fixed", 0.95), "λ=0.8": ("fixed", 0.8), "λ=1": ("fixed", 1.0),
           "α=0.05": ("adaptive", 0.05), "α=0.5": ("adaptive", 0.5)}
SMOKE = {"prompts": 8, "continuations": 2, "budgets": "1,2", "m3_steps": 2}


def cuts_of(response, newline_id: int) -> list[int]:
  """Step starts of a response's tokens: 0 and the position after every newline (< l)."""
  l = len(response)
  return [0] + [i + 1 for i, t in enumerate(response[:-1]) if t == newline_id and i + 1 < l]


def buckets_of(lengths, edges: str) -> list[tuple]:
  """(name, lo, hi) length buckets: at the given edges ("15,80"), else the terciles."""
  if edges:
    cut = [int(x) for x in edges.split(",")]
  else:
    cut = [int(x) for x in np.quantile(lengths, [1 / 3, 2 / 3])]
  bounds = [0, *sorted({c for c in cut if c > 0}), 10 ** 9]  # (equal terciles: one edge)
  return [(f"{lo + 1}–{hi}" if hi < 10 ** 9 else f">{lo}", lo + 1, hi)
          for lo, hi in zip(bounds, bounds[1:])]


class Suite:
  """π₀, its responses and prefixes, and the critics, on one trainer's parts."""

  def __init__(self, cfg, args):
    import jax  # pylint: disable=import-outside-toplevel
    from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
    self.jax, self.cfg, self.args = jax, cfg, args
    self.trainer = trainer_lib.Trainer(cfg, None, progress=False)
    if cfg.sft.enabled:
      self.trainer.sft()
    self.p = self.trainer.parts
    self.pi0 = self.trainer.state.policy_params
    self.key = jax.random.key(cfg.seed + 29)

  def sampler(self, n: int, prompt_tokens: int):
    from vapo_jax.run import sampling  # pylint: disable=import-outside-toplevel
    cfg = dataclasses.replace(self.cfg, data=dataclasses.replace(
        self.cfg.data, max_prompt_tokens=prompt_tokens))
    return sampling.build_sampler(cfg, self.p.graphdef, self.p.model_cfg, self.p.mesh,
                                  self.p.rules, self.p.text, n=n)

  def sample(self, sampler, prompts: list[list[int]]):
    """(responses [list of token lists], rollout) of one sampler call per chunk."""
    from vapo_jax.rl import rollout as rollout_lib  # pylint: disable=import-outside-toplevel
    self.key, sub = self.jax.random.split(self.key)
    out = rollout_lib.sample(sampler, self.pi0, lambda i: prompts[i], len(prompts), sub)
    resp, lens = self.jax.device_get((out.response_BxR, out.lengths_B))
    return [list(r[:n]) for r, n in zip(resp, lens)], out

  def score(self, problems, texts, answers) -> np.ndarray:
    return np.asarray(self.p.scorer.score_batch(problems, texts, answers).rewards, float)

  def final_values(self, graphdef, params, rollout) -> np.ndarray:
    """The critic's scalar after each whole response [B] (`critic.last_token_values`)."""
    from flax import nnx  # pylint: disable=import-outside-toplevel
    from vapo_jax import critic as critic_lib  # pylint: disable=import-outside-toplevel
    from vapo_jax.sampler import types  # pylint: disable=import-outside-toplevel
    tokens, mask = types.rollout_tokens(rollout)
    out = critic_lib.last_token_values(nnx.merge(graphdef, params), tokens, mask,
                                       rollout.prompt_len, rollout.lengths_B)
    return np.asarray(self.jax.device_get(out), float)

  def values(self, graphdef, params, rollout) -> np.ndarray:
    from vapo_jax.run import forwards  # pylint: disable=import-outside-toplevel
    from vapo_jax.sampler import types  # pylint: disable=import-outside-toplevel
    tokens, mask = types.rollout_tokens(rollout)
    fn = forwards.values_fn(self.cfg, graphdef, self.p.mesh, self.p.rules)
    return np.asarray(self.jax.device_get(fn(params, tokens, mask,
                                             prompt_len=rollout.prompt_len)), float)


def ground_truth(suite: Suite, n_prompts: int, m: int, decision_after: str = "") -> dict:
  """One response per prompt, its cuts and V̂*, ν at each cut (M continuations each); with
  decision_after (comma-separated strings, e.g. "=,{") also M2d's decision cuts
  (`m2_decision.decision_cuts`) and V̂*, ν at c and c + 1 for each."""
  text, cfg = suite.p.text, suite.cfg
  examples = suite.p.eval_examples[:n_prompts]
  if len(examples) < n_prompts:
    raise ValueError(f"--prompts={n_prompts} but only {len(examples)} held-out problems")
  prompts = [text.prompt_ids(ex.problem) for ex in examples]
  responses, rollout = suite.sample(suite.sampler(1, cfg.data.max_prompt_tokens), prompts)
  rewards = suite.score([ex.problem for ex in examples],
                        [text.decode(r) for r in responses], [ex.answer for ex in examples])
  newline = text.encode("\n")[0]
  cuts = [cuts_of(r, newline) for r in responses]
  after = [text.encode(a)[0] for a in decision_after.split(",") if a]
  dcuts = ([m2_decision.decision_cuts(r, after) for r in responses] if after
           else [[] for _ in responses])
  # Cut 0 (the prompt alone): M fresh responses per prompt, kept whole for the branch
  # calibration (V after the first token against that branch's success).
  first_outs, first_rollout = suite.sample(suite.sampler(m, cfg.data.max_prompt_tokens),
                                           prompts)
  first_scores = suite.score([ex.problem for ex in examples for _ in range(m)],
                             [text.decode(o) for o in first_outs],
                             [ex.answer for ex in examples for _ in range(m)])
  vhat, noise = {}, {}
  for i in range(len(examples)):
    vhat[(i, 0)], noise[(i, 0)] = stats.mc_value(first_scores[i * m:(i + 1) * m])
  # Every cut c > 0, and c + 1 for every cut (M2's true token advantage at c), once each.
  prefixes = sorted({(i, x) for i, cs in enumerate(cuts) for c in [*cs, *dcuts[i]]
                     for x in (c, c + 1) if 0 < x < len(responses[i])})
  long_prompt = cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens
  cont = suite.sampler(m, long_prompt)
  chunk = max(1, cfg.eval.batch_prompts)
  for s in range(0, len(prefixes), chunk):
    part = prefixes[s:s + chunk]
    real = len(part)
    part = part + [part[-1]] * (chunk - real)  # one compiled shape
    outs, _ = suite.sample(cont, [prompts[i] + responses[i][:c] for i, c in part])
    texts = [text.decode(responses[i][:c]) + text.decode(o)
             for (i, c), o in zip([p for p in part for _ in range(m)], outs)]
    scores = suite.score([examples[i].problem for i, _ in part for _ in range(m)], texts,
                         [examples[i].answer for i, _ in part for _ in range(m)])
    for j, key in enumerate(part[:real]):
      vhat[key], noise[key] = stats.mc_value(scores[j * m:(j + 1) * m])
  cont.clear_cache()
  branches = {"rollout": first_rollout, "scores": first_scores,
              "first": [text.decode(o[:1]) for o in first_outs],
              "lengths": [len(o) for o in first_outs]}
  for i, r in enumerate(responses):  # V*(end) = the reward
    vhat[(i, len(r))], noise[(i, len(r))] = float(rewards[i]), 0.0
  at = lambda cs_of, d: [[vhat[(i, c + d)] for c in cs] for i, cs in enumerate(cs_of)]  # noqa: E731
  nu = lambda cs_of, d: [[noise[(i, c + d)] for c in cs] for i, cs in enumerate(cs_of)]  # noqa: E731
  decision = {"cuts": dcuts, "vhat": at(dcuts, 0), "noise": nu(dcuts, 0),
              "vnext": at(dcuts, 1), "noise_next": nu(dcuts, 1)}
  return {"branches": branches, "examples": examples, "responses": responses, "rollout": rollout,
          "rewards": rewards, "cuts": cuts, "decision": decision,
          "vhat": [[vhat[(i, c)] for c in cs] for i, cs in enumerate(cuts)],
          "noise": [[noise[(i, c)] for c in cs] for i, cs in enumerate(cuts)],
          "vnext": [[vhat[(i, c + 1)] for c in cs] for i, cs in enumerate(cuts)],
          "noise_next": [[noise[(i, c + 1)] for c in cs] for i, cs in enumerate(cuts)]}


def critics(suite: Suite, budgets: list[int], m3_steps: int, with_rm: bool) -> tuple:
  """({name: (graphdef, params)}, M3 per-step records). The trainer's internals are read
  only here (`state.learners[name]`: the Learner records' graphdef and state)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  jax, cfg = suite.jax, suite.cfg

  def fresh(**vp):
    c = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, enabled=False),
                            value_pretrain=dataclasses.replace(cfg.value_pretrain, **vp))
    t = trainer_lib.Trainer(c, None, progress=False)
    t.state.policy_params = suite.pi0
    return t

  copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t))
  # The MC critic trains in the suite's own trainer (π₀ is its policy; its prompts and keys
  # are untouched so far, so both critics see the same rollouts: checked per step).
  mc, coupled = suite.trainer, fresh(coupled_gae=True)
  mc.setup("critic")
  coupled.setup("critic")
  def net(trainer, name):
    learner = trainer.state.learners[name]
    return learner.graphdef, copy(learner.state.params)

  out = {"zero_head": net(mc, "critic")}
  m3 = []
  for i in range(max([*budgets, m3_steps])):
    batch, em = mc.experience(next(mc.state.prompts), for_value_pretraining=True)
    rec = {"step": i, **_m3_record("mc", batch, em)}
    if i < m3_steps:
      cb, cm = coupled.experience(next(coupled.state.prompts), for_value_pretraining=True)
      rec.update(_m3_record("coupled", cb, cm))
      rec["same_rollouts"] = bool(np.array_equal(*jax.device_get(
          (batch.tokens_BxL, cb.tokens_BxL))))
      coupled.update(cb, stage="value_pretrain", step=i, policy=False)
    mc.update(batch, stage="value_pretrain", step=i, policy=False)
    m3.append(rec)
    if i + 1 in budgets:
      out[f"vp@{i + 1}"] = net(mc, "critic")
  if with_rm:
    c = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, enabled=False),
                            model=dataclasses.replace(cfg.model, critic_start="reward_model"))
    rm = trainer_lib.Trainer(c, None, progress=False)
    rm.state.policy_params = suite.pi0
    rm.reward_model()
    out["reward_model"] = net(rm, "reward_model")
    rm.close()
  coupled.close()
  return out, m3


def _m3_record(name: str, batch, em: dict) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  v, mask, scores = jax.device_get((batch.old_values_BxR, batch.response_mask_BxR,
                                    batch.scores_B))
  last = np.maximum(mask.sum(1).astype(int) - 1, 0)
  return {f"{name}/v_s0": float(v[:, 0].mean()),
          f"{name}/v_last": float(v[np.arange(len(last)), last].mean()),
          f"{name}/mean_return": float(scores.mean()),
          f"{name}/ev": float(em["value/explained_variance"])}


def measure(suite: Suite, gt: dict, nets: dict, edges: str) -> dict:
  """M1 and M2 of every critic on the ground truth's responses."""
  lengths = [len(r) for r in gt["responses"]]
  buckets = buckets_of(lengths, edges)
  m1, m2, m2_step, m2d, final = {}, {}, {}, {}, {}
  pos = [c for cs in gt["cuts"] for c in cs]
  lens = [lengths[i] for i, cs in enumerate(gt["cuts"]) for _ in cs]
  flat = lambda key: [x for xs in gt[key] for x in xs]  # noqa: E731

  def m1_rows(name, at):
    m1[name] = stats.bias_by_fifth(at, flat("vhat"), flat("noise"), pos, lens)
    m1[name + "/all"] = {"ev": stats.explained_variance(at, flat("vhat"), flat("noise")),
                         "bias": float(np.mean(np.subtract(at, flat("vhat"))))}

  # The control beside the zero head: a constant head at π₀'s mean return (issue 45 §2).
  mean_return = float(np.mean(gt["rewards"]))
  m1_rows(CONSTANT, [mean_return] * len(pos))
  d = gt["decision"]
  for name, (graphdef, params) in nets.items():
    v = suite.values(graphdef, params, gt["rollout"])
    m1_rows(name, [v[i, c] for i, cs in enumerate(gt["cuts"]) for c in cs])
    final[name] = final_token(suite.final_values(graphdef, params, gt["rollout"]),
                              [v[i, n - 1] for i, n in enumerate(lengths)], gt["rewards"])
    responses = [{"values_T": v[i, :lengths[i]], "reward": float(gt["rewards"][i]),
                  "cuts": gt["cuts"][i], "vstar": gt["vhat"][i], "noise": gt["noise"][i],
                  "vnext": gt["vnext"][i], "noise_next": gt["noise_next"][i]}
                 for i in range(len(lengths))]
    m2[name] = stats.lambda_table(responses, LAMBDAS, buckets)
    m2_step[name] = stats.lambda_table(responses, LAMBDAS, buckets, estimator="step")
    if any(d["cuts"]):
      m2d[name] = m2_decision.lambda_scores(
          [{"values_T": v[i, :lengths[i]], "reward": float(gt["rewards"][i]),
            "cuts": d["cuts"][i], "vstar": d["vhat"][i], "noise": d["noise"][i],
            "vnext": d["vnext"][i], "noise_next": d["noise_next"][i]}
           for i in range(len(lengths))], LAMBDAS, buckets)
    b = gt["branches"]
    after_first = suite.values(graphdef, params, b["rollout"])[:, 1]
    m1[name + "/branches"] = stats.branch_calibration(b["first"], after_first, b["scores"])
  flat_v, flat_n = ([x for xs in gt[k] for x in xs] for k in ("vhat", "noise"))
  m = suite.args["continuations"]
  return {"m1": m1, "m2": m2, "m2_step": m2_step, "m2_decision": m2d, "final": final,
          "buckets": buckets, "controls": [CONSTANT],
          "oracle_ev": stats.oracle_ev(flat_v, flat_n, m),
          "decision_cuts": sum(len(c) for c in d["cuts"])}


def final_token(after_all, before_last, rewards) -> dict:
  """A critic at the end of the response against the reward R: V after the whole response
  (an outcome reward model's output) and V(s_{l−1}) (the last value GAE reads): means, and
  the MSE ½(V − R)² of the former (the RM's training loss; ½p(1 − p) for a calibrated
  constant)."""
  a, b, r = (np.asarray(x, np.float64) for x in (after_all, before_last, rewards))
  return {"after_response": float(a.mean()), "before_last_token": float(b.mean()),
          "reward": float(r.mean()), "half_mse": float(0.5 * np.mean((a - r) ** 2)),
          "corr": (float(np.corrcoef(a, r)[0, 1]) if a.std() > 0 and r.std() > 0
                   else float("nan"))}


def markdown(result: dict) -> str:
  """The three tables."""
  lines = [f"# Value-model mechanisms: {result['config']}", "", f"`{result['command']}`", "",
           f"π₀: {result['policy']}; {result['prompts']} responses, {result['cuts']} cuts × "
           f"{result['continuations']} continuations; mean return {result['mean_return']:.3f}; "
           f"{result['wall_s']:.0f} s. A perfect critic's EV against single returns at these "
           f"cuts (the ceiling of an EV stop rule): {result['oracle_ev']:.2f}.", "",
           "## M1: bias V − V̂* by fifth of the response (EV with the MC noise removed)", "",
           "| critic | all: bias / EV | " + " | ".join(f"fifth {k + 1}" for k in range(5)) + " |",
           "|---|---|" + "---|" * 5]
  for name in [*result["critics"], *result.get("controls", [])]:
    rows = result["m1"][name]
    cells = [("—" if not r.get("cuts") else f"{r['bias']:+.3f} / {r['ev']:.2f}") for r in rows]
    whole = result["m1"][name + "/all"]
    label = f"control: {name} (V ≡ {result['mean_return']:.3f})" if name == CONSTANT else name
    lines.append(f"| {label} | {whole['bias']:+.3f} / {whole['ev']:.2f} | " + " | ".join(cells)
                 + " |")
  lines += ["", "The critic's mean value by fifth (V̂* is the bias's other half): "
            + "; ".join(f"{n} " + " / ".join(f"{r['value_mean']:.3f}" for r in result["m1"][n]
                                              if r.get("cuts"))
                        for n in result["critics"])]
  if result.get("final"):
    lines += ["", "## M1 at the final token: V after the whole response (what an outcome "
              "reward model is trained on) and V(s_{l−1}), against the reward", "",
              "| critic | mean reward | V after the response | V(s_{l−1}) | ½ MSE vs reward | "
              "corr with reward |", "|---|---|---|---|---|---|"]
    for name, r in result["final"].items():
      lines.append(f"| {name} | {r['reward']:.3f} | {r['after_response']:.3f} | "
                   f"{r['before_last_token']:.3f} | {r['half_mse']:.4f} | {r['corr']:.2f} |")
  lines += ["", "## M1, branches: V after the first token against the branch's success "
            "(π₀'s samples from the prompt)", "",
            "| critic | branch (first token) | samples | success | V(s₁) | gap |",
            "|---|---|---|---|---|---|"]
  for name in result["critics"]:
    for branch, r in result["m1"][name + "/branches"].items():
      lines.append(f"| {name} | `{branch}` | {r['samples']} | {r['success']:.3f} | "
                   f"{r['value']:.3f} | {r['gap']:+.3f} |")
  for key, title in (("m2", "M2: token-advantage MSE at each step's first token"),
                     ("m2_step", "M2-step (for comparison; favours λ = 0 by construction): "
                      "step-credit MSE")):
    if key in result:
      lines += _m2_lines(result, key, title)
  if result.get("m2_decision"):
    lines += m2_decision.markdown_lines(result["m2_decision"], list(LAMBDAS))
  lines += ["## M3: decoupled (MC, λ_c = 1) vs coupled (λ_c = λ_policy) critic from the zero "
            "head, same rollouts", "",
            "| step | mean return | MC V(s₀) | coupled V(s₀) | MC V(s_last) | coupled V(s_last) "
            "| EV MC / coupled | same rollouts |", "|---|---|---|---|---|---|---|---|"]
  for r in result["m3"]:
    if "coupled/v_s0" not in r:
      continue
    lines.append(f"| {r['step'] + 1} | {r['mc/mean_return']:.3f} | {r['mc/v_s0']:.3f} | "
                 f"{r['coupled/v_s0']:.3f} | {r['mc/v_last']:.3f} | {r['coupled/v_last']:.3f} | "
                 f"{r['mc/ev']:.2f} / {r['coupled/ev']:.2f} | {r['same_rollouts']} |")
  return "\n".join(lines) + "\n"


def _m2_lines(result: dict, key: str, title: str) -> list[str]:
  lines = ["", f"## {title} (MC noise removed) by length bucket, MSE (bias) per setting, and "
           "the MSE-optimal constant λ", ""]
  for name in result["critics"]:
    table = result[key][name]
    lines += [f"**{name}**", "", "| bucket (tokens) | responses | " + " | ".join(LAMBDAS)
              + " | optimal λ (MSE) |", "|---|---|" + "---|" * (len(LAMBDAS) + 1)]
    for bucket, row in table.items():
      if not row["responses"]:
        lines.append(f"| {bucket} | 0 |" + " — |" * (len(LAMBDAS) + 1))
        continue
      cells = [f"{row['settings'][s]['mse']:.4f} ({row['settings'][s]['bias']:+.3f})"
               for s in LAMBDAS]
      lines.append(f"| {bucket} | {row['responses']} | " + " | ".join(cells)
                   + f" | {row['optimal_lambda']:.3f} ({row['optimal_mse']:.4f}) |")
    lines.append("")
  return lines


def run(cfg, args, command_text: str = "") -> dict:
  t0 = time.time()
  suite = Suite(cfg, args)
  gt = ground_truth(suite, args["prompts"], args["continuations"],
                    args.get("decision_after", ""))
  budgets = [int(x) for x in str(args["budgets"]).split(",") if x]
  nets, m3 = critics(suite, budgets, args["m3_steps"], args["reward_model"])
  result = measure(suite, gt, nets, args["buckets"])
  suite.trainer.close()
  result.update({
      "config": args["config_path"], "command": command_text,
      "policy": cfg.model.init_from or f"in-process SFT ({cfg.sft.steps} steps)",
      "prompts": len(gt["responses"]), "cuts": sum(len(c) for c in gt["cuts"]),
      "continuations": args["continuations"], "mean_return": float(np.mean(gt["rewards"])),
      "critics": list(nets), "m3": m3, "wall_s": time.time() - t0,
      "response_lengths": [len(r) for r in gt["responses"]]})
  os.makedirs(args["out"], exist_ok=True)
  with open(os.path.join(args["out"], "value_bias.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1, default=float)
  with open(os.path.join(args["out"], "value_bias.md"), "w", encoding="utf-8") as f:
    f.write(markdown(result))
  return result


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  flags.DEFINE_string("out", None, "Where value_bias.json / .md go.")
  flags.DEFINE_string("sft_workdir", "", "π₀: this SFT run's policy (else SFT runs here).")
  flags.DEFINE_integer("prompts", 48, "Held-out prompts (one response each).")
  flags.DEFINE_integer("continuations", 16, "Continuations of π₀ per prefix.")
  flags.DEFINE_string("budgets", "8,32,64", "Value-pretraining steps at which vp@N is taken.")
  flags.DEFINE_integer("m3_steps", 14, "Steps of the coupled critic beside the MC one.")
  flags.DEFINE_bool("reward_model", True, "Also the reward-model start (reward_model.steps).")
  flags.DEFINE_string("buckets", "", 'M2 length bucket edges ("15,80"; "": terciles).')
  flags.DEFINE_string("decision_after", "=,{", "M2d: cut after each of these tokens "
                      '(comma-separated; "": no M2d).')
  flags.DEFINE_bool("smoke", False, "Tiny sizes and the config's SMOKE overrides.")


def main(argv):
  del argv
  f = flags.FLAGS
  if f.config is None or not f.out:
    raise app.UsageError("--config and --out are required")
  path = config_flags.get_config_filename(f["config"]).split(":")[0]
  c = f.config
  args = {"prompts": f.prompts, "continuations": f.continuations, "budgets": f.budgets,
          "m3_steps": f.m3_steps, "reward_model": f.reward_model, "buckets": f.buckets,
          "out": f.out, "config_path": path, "decision_after": f.decision_after}
  if f.smoke:
    module = config_file.config_module(path)
    user = dict(config_flags.get_override_values(f["config"]))
    c = module.get_config()
    c.update_from_flattened_dict({**getattr(module, "SMOKE", {}), **user})
    args.update({k: v for k, v in SMOKE.items() if not f[k].present})
  c.rl.steps = 0
  if f.sft_workdir:
    c.model.init_from, c.sft.enabled = f.sft_workdir, False
  cfg = config_lib.from_command_line(c)
  command = ["python -m experiments.value_mechanisms.value_bias", *sys.argv[1:]]
  result = run(cfg, args, " ".join(command))
  print(markdown(result))


if __name__ == "__main__":
  define_flags()
  app.run(main)
