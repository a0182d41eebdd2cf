"""Accept an SFT start only inside a pre-set accuracy band, on a development set.

  python -m vapo_jax.tools.sft_band --config=configs/chain_or_guess.py --workdir=DIR \\
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
and exits with status 3 when the start is outside the band (so `tools.ablate` runs no row
from it), 0 inside.
"""

import dataclasses
import json
import os
import sys

import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from vapo_jax import config as config_lib

OUT = "sft_band.json"
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


def measure(cfg, band: dict) -> dict[str, float]:
  """dev_metrics of the config's policy (model.init_from) on the development set."""
  import jax  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import evaluation  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  examples = dev_examples(cfg, band["examples"])
  if "samples" in band:  # (the SFT stage's own small evaluation takes 1)
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(
        cfg.eval, samples_per_problem=int(band["samples"])))
  trainer = trainer_lib.Trainer(cfg, None, progress=False, read_only=True)
  try:
    p = trainer.parts
    scores, lengths, _, _ = evaluation.sample_and_score(
        p.samplers.eval, trainer.state.policy_params, examples, p.text, p.eval_scorer,
        jax.random.key(cfg.seed + 11), cfg.eval.batch_prompts)
  finally:
    trainer.close()
  return dev_metrics([kind_of(ex) for ex in examples], scores, lengths,
                     threshold=cfg.eval.correct_threshold,
                     guess_max_tokens=band.get("guess_max_tokens", 0))


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "Experiment config file (with SFT_BAND).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Where sft_band.json goes.")
  flags.DEFINE_string("band", "SFT_BAND", "The band's name in the config file.")
  flags.DEFINE_bool("progress", False, "(accepted for tools.ablate's command line; unused)")


def main(argv):
  del argv
  f = flags.FLAGS
  if f.config is None or not f.workdir:
    raise app.UsageError("--config and --workdir are required")
  path = config_flags.get_config_filename(f["config"]).split(":")[0]
  from vapo_jax.tools import ablate  # pylint: disable=import-outside-toplevel
  band = getattr(ablate.config_module(path), f.band, None)
  if band is None:
    raise app.UsageError(f"{path} defines no {f.band}")
  cfg = config_lib.from_command_line(f.config)
  if not cfg.model.init_from:
    raise app.UsageError("--config.model.init_from=<the SFT run's workdir> is required")
  metrics = measure(cfg, band)
  failures = check_band(metrics, band["bounds"])
  verdict = {"accepted": not failures, "failures": failures, "metrics": metrics,
             "band": band, "init_from": cfg.model.init_from}
  os.makedirs(f.workdir, exist_ok=True)
  with open(os.path.join(f.workdir, OUT), "w", encoding="utf-8") as out:
    json.dump(verdict, out, indent=1)
  print(json.dumps(verdict), flush=True)
  if failures:
    sys.stderr.write("SFT start outside SFT_BAND: " + "; ".join(failures) + "\n")
    sys.exit(OUTSIDE)


if __name__ == "__main__":
  define_flags()
  app.run(main)
