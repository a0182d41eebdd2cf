"""Accept an SFT start only inside a pre-set accuracy band, on a development set.

  python -m experiments.ablation.sft_band --config=configs/chain_or_guess.py --workdir=DIR \\
      --config.model.init_from=<the SFT run's workdir> --config.sft.enabled=False

The band is the config file's module-level `SFT_BAND`, fixed before any row runs:

  SFT_BAND = {"examples": 256,            # development problems
              "samples": 4,               # samples per problem at the run's temperature
              "guess_max_tokens": 15,     # a response this short is a guess
              "bounds": {"accuracy/long": (0.25, 0.40), "guess_rate": (0.12, 0.18), ...}}

The development set is disjoint from the training problems and from the held-out test set
(the held-out split's problems after the first data.num_eval). Metrics (`dev_metrics`):
`accuracy`, `accuracy/<kind>` (chain_or_guess: short, long), `guess_rate`,
`response_length`. Writes DIR/sft_band.json ({"accepted", "failures", "metrics", "band"})
and exits with status 3 when the start is outside the band (so `ablate` runs no row
from it), 0 inside.

**Selection** (the band has `"select": {"first": F, "every": E}`): an SFT run is chaotic in
float rounding, so the same config lands on different starts on different machines, and a
fixed step count cannot be trusted to land inside the band (docs/value_mechanisms.md §5.4).
The rule, set before any row runs: the SFT run goes on to its `sft.steps` keeping a
checkpoint every E steps, and the start is **the first of its checkpoints F, F + E, ...,
sft.steps that the band accepts**. Each candidate is measured on the same development set
with the same sampling key (`candidates.jsonl`, one line each as it is measured: a rerun
skips those). The accepted policy is written to DIR/checkpoints/<step> (a run of its own, so
rows start from it with `model.init_from=DIR`); `sft_band.json` then also carries
`"selected_step"` and `"candidates"`. None accepted: exit status 3, as for a single start.
"""

import dataclasses
import json
import os
import sys

import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.ablation import config_file
from vapo_jax import config as config_lib

OUT = "sft_band.json"
CANDIDATES = "candidates.jsonl"  # a selection's measured checkpoints, one line each
OUTSIDE = 3  # exit status outside the band


def dev_metrics(kinds, scores_Nxk, lengths_Nxk, *, threshold: float = 1.0,
                guess_max_tokens: int = 0) -> dict[str, float]:
  """Accuracy (overall and per kind), guess rate and length of a [problems, k] sample.

  Args:
    kinds: the kind of each problem (e.g. "short" / "long"), length N.
    scores_Nxk, lengths_Nxk: each sample's score and response length in tokens.
    threshold: a sample is correct when its score >= threshold.
    guess_max_tokens: responses of at most this many tokens count as guesses (0: none).
  """
  scores, lengths = np.asarray(scores_Nxk, float), np.asarray(lengths_Nxk)
  if scores.ndim != 2 or scores.shape != lengths.shape or len(kinds) != scores.shape[0]:
    raise ValueError(f"need [N, k] scores and lengths and N kinds; got {scores.shape}, "
                     f"{lengths.shape}, {len(kinds)}")
  correct = scores >= threshold
  out = {"accuracy": float(correct.mean()),
         "guess_rate": float((lengths <= guess_max_tokens).mean()),
         "response_length": float(lengths.mean())}
  kinds = np.asarray(kinds)
  for kind in sorted(set(kinds.tolist())):
    out[f"accuracy/{kind}"] = float(correct[kinds == kind].mean())
  return out


def check_band(metrics: dict[str, float], bounds: dict) -> list[str]:
  """The band's failures: one line per metric outside [lo, hi] (or missing); [] = accepted."""
  failures = []
  for name, (lo, hi) in sorted(bounds.items()):
    if name not in metrics:
      failures.append(f"{name} not measured (have {', '.join(sorted(metrics))})")
    elif not lo <= metrics[name] <= hi:
      failures.append(f"{name} = {metrics[name]:.3f} outside [{lo}, {hi}]")
  return failures


def dev_examples(cfg, num: int) -> list:
  """`num` development problems of a synthetic task: held-out-split problems after the
  test set's data.num_eval (the same data seed)."""
  from vapo_jax import data as data_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import inputs  # pylint: disable=import-outside-toplevel
  d = cfg.data
  if d.source != "synthetic" or d.synthetic_task == "arithmetic":
    raise ValueError("sft_band needs data.source = synthetic with a chain task "
                     f"(got {d.source}, {d.synthetic_task})")
  if d.synthetic_task == "chain_or_guess":
    return data_lib.chain_mix.dev_set(num, d.num_eval, cfg.data_seed, inputs.mix_spec(d))
  spec = data_lib.chain.ChainSpec(min_steps=d.synthetic_min_steps,
                                  max_steps=d.synthetic_max_steps,
                                  max_operand=d.synthetic_max_operand,
                                  max_value=d.synthetic_max_value, ops=d.synthetic_ops)
  return data_lib.chain.chains(d.num_eval + num, "test", cfg.data_seed, spec)[d.num_eval:]


def kind_of(example) -> str:
  kind = example.uid.rsplit("/", 1)[-1]
  return kind if kind in ("short", "long") else "all"


def candidate_steps(select: dict, last: int) -> list[int]:
  """The SFT steps a selection checks, in order: first, first + every, ..., up to `last`
  (the SFT run's sft.steps, which is always a candidate)."""
  first, every = int(select["first"]), int(select["every"])
  # (first a multiple of every: the SFT run saves its checkpoints at multiples of every)
  if every < 1 or first % every or not 1 <= first <= last:
    raise ValueError(f"SFT_BAND select {select}: need every >= 1, first a multiple of every, "
                     f"and 1 <= first <= sft.steps = {last}")
  return sorted(set(range(first, last + 1, every)) | {last})


def _sampling_cfg(cfg, band: dict):
  if "samples" in band:  # (the SFT stage's own small evaluation takes 1)
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(
        cfg.eval, samples_per_problem=int(band["samples"])))
  return cfg


def measure_steps(cfg, band: dict, steps):
  """Yields (step, dev_metrics, params) for each checkpoint `step` of the run in
  model.init_from (None: its newest), one model and sampler for all of them, the same
  development problems and sampling key for each (so candidates differ by their weights
  only)."""
  import jax  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint as run_checkpoint  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import evaluation  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  examples = dev_examples(cfg, band["examples"])
  kinds = [kind_of(ex) for ex in examples]
  cfg = _sampling_cfg(cfg, band)
  trainer = trainer_lib.Trainer(cfg, None, progress=False, read_only=True)
  try:
    p = trainer.parts
    for step in steps:
      params = trainer.state.policy_params
      if step is not None:
        params, _ = run_checkpoint.initial_policy(cfg.model.init_from, params, step)
      scores, lengths, _, _ = evaluation.sample_and_score(
          p.samplers.eval, params, examples, p.text, p.eval_scorer,
          jax.random.key(cfg.seed + 11), cfg.eval.batch_prompts)
      yield step, dev_metrics(kinds, scores, lengths, threshold=cfg.eval.correct_threshold,
                              guess_max_tokens=band.get("guess_max_tokens", 0)), params
  finally:
    trainer.close()


def measure(cfg, band: dict) -> dict[str, float]:
  """dev_metrics of the config's policy (model.init_from's newest checkpoint)."""
  return next(measure_steps(cfg, band, [None]))[1]


def save_policy(directory: str, step: int, params, source: str) -> None:
  """The selected policy as a run of its own (DIR/checkpoints/<step>, group policy_params):
  `model.init_from=DIR` starts from it."""
  from vapo_jax.run import checkpoint as run_checkpoint  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint_store  # pylint: disable=import-outside-toplevel
  store = checkpoint_store.CheckpointStore(
      os.path.join(directory, run_checkpoint.CHECKPOINTS), keep=1, keep_best=False,
      async_save=False)
  try:
    store.save(step, {"policy_params": params}, {"selected_from": source, "step": step})
    store.wait()
  finally:
    store.close()


def select(cfg, band: dict, workdir: str) -> dict:
  """The first candidate checkpoint of model.init_from that the band accepts (module
  docstring); its policy is saved in workdir. Returns the verdict (see `main`)."""
  steps = candidate_steps(band["select"], cfg.sft.steps)
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, CANDIDATES)
  done = {}
  if os.path.exists(log_path):
    with open(log_path, encoding="utf-8") as f:
      done = {r["step"]: r for r in map(json.loads, f) if r.get("step") in steps}
    for r in done.values():  # (judged by this band: the logged metrics are what was measured)
      r["failures"] = check_band(r["metrics"], band["bounds"])
      r["accepted"] = not r["failures"]
  chosen = next((s for s in steps if s in done and not done[s]["failures"]), None)
  todo = [s for s in steps if s not in done]
  if chosen is not None:  # a rerun: measure it again only if its policy was not saved
    saved = os.path.isdir(os.path.join(workdir, "checkpoints", str(chosen)))
    todo, chosen = ([], chosen) if saved else ([chosen], None)
  for step, metrics, params in measure_steps(cfg, band, todo):
    failures = check_band(metrics, band["bounds"])
    done[step] = {"step": step, "accepted": not failures, "failures": failures,
                  "metrics": metrics}
    with open(log_path, "a", encoding="utf-8") as f:
      f.write(json.dumps(done[step]) + "\n")
    print(f"[sft_band] step {step}: " + ("accepted" if not failures else
                                         "refused: " + "; ".join(failures)), flush=True)
    if not failures:
      save_policy(workdir, step, params, cfg.model.init_from)
      chosen = step
      break
  candidates = [done[s] for s in steps if s in done]
  verdict = {"accepted": chosen is not None, "selected_step": chosen,
             "candidates": candidates, "band": band, "init_from": cfg.model.init_from}
  if chosen is not None:
    verdict.update(failures=[], metrics=done[chosen]["metrics"])
  else:
    verdict.update(metrics=candidates[-1]["metrics"] if candidates else {}, failures=[
        f"none of the {len(steps)} checkpoints {steps[0]}..{steps[-1]} (every "
        f"{band['select']['every']}) inside the band; the last: "
        + "; ".join(candidates[-1]["failures"] if candidates else ["none measured"])])
  return verdict


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "Experiment config file (with SFT_BAND).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Where sft_band.json goes.")
  flags.DEFINE_string("band", "SFT_BAND", "The band's name in the config file.")
  flags.DEFINE_bool("progress", False, "(accepted for ablate's command line; unused)")


def main(argv):
  del argv
  f = flags.FLAGS
  if f.config is None or not f.workdir:
    raise app.UsageError("--config and --workdir are required")
  path = config_flags.get_config_filename(f["config"]).split(":")[0]
  band = getattr(config_file.config_module(path), f.band, None)
  if band is None:
    raise app.UsageError(f"{path} defines no {f.band}")
  cfg = config_lib.from_command_line(f.config)
  if not cfg.model.init_from:
    raise app.UsageError("--config.model.init_from=<the SFT run's workdir> is required")
  os.makedirs(f.workdir, exist_ok=True)
  if "select" in band:
    verdict = select(cfg, band, f.workdir)
    failures = verdict["failures"]
  else:
    metrics = measure(cfg, band)
    failures = check_band(metrics, band["bounds"])
    verdict = {"accepted": not failures, "failures": failures, "metrics": metrics,
               "band": band, "init_from": cfg.model.init_from}
  with open(os.path.join(f.workdir, OUT), "w", encoding="utf-8") as out:
    json.dump(verdict, out, indent=1)
  print(json.dumps(verdict), flush=True)
  if failures:
    sys.stderr.write("SFT start outside SFT_BAND: " + "; ".join(failures) + "\n")
    sys.exit(OUTSIDE)


if __name__ == "__main__":
  define_flags()
  app.run(main)
