"""The paper's ablation table as one command: every row × every seed, a table and a plot.

  python -m experiments.ablation.ablate --config=configs/longcot.py --rows=all --seeds=3 \\
      --workdir=/tmp/ablate [--config.rl.steps=60 ...]
  python -m experiments.ablation.ablate --config=configs/tiny.py --rows=vapo,no_clip_higher ...
  python -m experiments.ablation.ablate --config=configs/chain_or_guess.py --seeds=3,4,5 ...
  python -m experiments.ablation.ablate --config=configs/chain_or_guess.py --smoke ...

--seeds is a count from the config's seed ("3"), a list ("3,4,5"; one seed "7,") or a range
("3-5"); --rows defaults to the config file's ABLATION_ROWS (else all); --smoke applies the
config file's SMOKE overrides and SMOKE_BAND (every stage at a few steps).

Each row of `ROWS` is a preset of `config.PRESETS` (VAPO, each "without X", plain PPO, GRPO,
DAPO). The stages that rows share run once per seed and the rows start from them:

    W/seed<s>/stage-sft-<key>              SFT (rl.steps = 0)
    W/seed<s>/stage-value_pretrain-<key>   value pretraining of the SFT policy
    W/seed<s>/<row>                        the row: RL only, from model.init_from (the policy
                                           of the stage run) and model.critic_path (its
                                           value-pretrained critic, for rows that keep it)

When the config sets data.seed and model.init_seed (>= 0), SFT does not depend on the seed:
one SFT run serves every seed (`W/shared/stage-sft-<key>`, run at the config's own seed), and
if the config file has an SFT_BAND it is first checked on a development set (`sft_band`, in
`<that stage>/band`): outside the band no stage or row starts from it.

`<key>` hashes the config the stage reads (for SFT: model, data, sft, optim, sampling, mesh
and seed; for value pretraining also value_pretrain, reward and the critic's update
settings), so rows share a stage exactly when it would be the same run. Group sampling is an
RL change: "without group sampling" starts from VAPO's pretrained critic.

Every run is a subprocess `python -m vapo_jax.main` with its own workdir (its log in
`log.txt`), so a crash is recorded and the other rows go on. A run that finished leaves
`ablate_status.json` and is skipped next time; killed (the tool, or a run), the same command
resumes where it stopped (runs resume from their checkpoints). One line per finished run
shows the time taken and the ETA. At the end (and after every run) the tool writes

    W/ablation.md     per row: held-out avg@k mean and 95% t-interval over seeds, pass@k,
                      response length and entropy at the end, RL steps to reach VAPO's final
                      avg@k, crashes; the paper's AIME 2024 figure beside it
    W/ablation.png    held-out avg@k (and response length) over RL steps, mean and seed range
    W/ablation.jsonl  one record per run (kind "run") and per row (kind "row")
    W/metrics/        every run's per-step metrics.jsonl (<run's path under W>.jsonl) and
                      the band check's verdict

from the files the runs write (`metrics.jsonl`: the "eval" records, the last "rl" record).
"""

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Sequence

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments.ablation import ablation_report as report
from experiments.ablation import config_file
from experiments.ablation import sft_band
from vapo_jax import config as config_lib

LOG = "log.txt"


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of the table: a preset, what the paper calls it, and its AIME 2024 score."""
  name: str
  preset: str
  label: str
  paper: float | None       # the paper's AIME 2024 avg@32 (None: not in its table)
  overrides: tuple[tuple[str, Any], ...] = ()  # fields set on top of the preset
  in_all: bool = True       # part of --rows=all (False: a sensitivity row, named only)


ROWS = (
    Row("vapo", "vapo", "VAPO", 60.4),
    Row("no_value_pretrain", "no_value_pretrain", "without value pretraining", 11),
    Row("no_decoupled_gae", "no_decoupled_gae", "without decoupled GAE", 33),
    # The paper does not say whether its value pretraining was coupled too: both readings.
    Row("no_decoupled_gae_vp", "no_decoupled_gae_vp",
        "without decoupled GAE, value pretraining coupled too", 33),
    Row("no_length_adaptive", "no_length_adaptive", "without length-adaptive GAE", 45),
    Row("no_clip_higher", "no_clip_higher", "without Clip-Higher", 46),
    Row("no_token_level_loss", "no_token_level_loss", "without token-level loss", 53),
    Row("no_positive_nll", "no_positive_nll", "without positive-example loss", 54),
    Row("no_group_sampling", "no_group_sampling", "without group sampling", 55),
    Row("ppo", "ppo", "plain PPO", 5),
    Row("grpo", "grpo", "GRPO", None),
    Row("dapo", "dapo", "DAPO", 50),
    # Plain PPO with the literal λ = 0.95 where a config's ppo row uses a κ-matched λ.
    Row("ppo_lam095", "ppo", "plain PPO, λ = 0.95 (sensitivity)", 5,
        overrides=(("rl.lam_policy", 0.95),), in_all=False),
)
ROW_NAMES = tuple(r.name for r in ROWS)

# What each shared stage reads of a row's config (sections, or section.field); the rest of a
# stage run's config is the "vapo" preset's, so rows differing only elsewhere share it.
SFT_READS = ("seed", "model", "data", "sft", "optim", "sampling", "mesh")
# With data.seed and model.init_seed set (>= 0), SFT does not read `seed`: every seed's rows
# start from one SFT run (W/shared/), checked against the config's SFT_BAND when it has one.
SHARED_SFT_READS = SFT_READS[1:]
SHARED = "shared"
CRITIC_START = ("model.critic_start", "model.critic_path")  # read by neither SFT nor the policy
VALUE_PRETRAIN_READS = SFT_READS + (
    "value_pretrain", "reward", "rl.advantage_estimator", "rl.gamma", "rl.value_clip",
    "rl.ppo_epochs", "rl.num_minibatches", "rl.micro_batch_size", "rl.gae_impl")
# The reward-model stage (model.critic_start = "reward_model") reads what the RM's rollouts
# and updates read; its model lands in <stage>/reward_model, which rows load as critic_path.
REWARD_MODEL_READS = SFT_READS + (
    "reward_model", "reward", "rl.value_clip", "rl.num_minibatches", "rl.micro_batch_size",
    "rl.prompts_per_step", "rl.responses_per_prompt")
REWARD_MODEL_DIR = "reward_model"  # = run.trainer.REWARD_MODEL_DIR (not imported: no jax here)


@dataclasses.dataclass(frozen=True)
class Run:
  """One `python -m vapo_jax.main` run of the plan.

  name: the row's name, or "sft" / "value_pretrain" for a stage run.
  overrides: config fields set on top of the preset (and the user's --config.* flags).
  needs: directories of the stage runs it starts from (they must have finished).
  """
  name: str
  kind: str                 # "row" | "stage"
  seed: int
  directory: str
  preset: str
  overrides: tuple[tuple[str, Any], ...]
  needs: tuple[str, ...] = ()
  module: str = "vapo_jax.main"  # what runs it (`python -m <module>`)
  args: tuple[str, ...] = ()     # its own flags




# ------------------------------------------------------------------------------ the plan


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
  """{"rl": {"steps": 3}} -> {"rl.steps": 3}."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _get(d: dict, dotted: str):
  for part in dotted.split("."):
    d = d[part]
  return d


def _set(d: dict, dotted: str, value) -> None:
  *head, last = dotted.split(".")
  for part in head:
    d = d[part]
  d[last] = value


def stage_key(cfg: dict) -> str:
  """A short hash of a (plain dict) config."""
  text = json.dumps(cfg, sort_keys=True, default=repr)
  return hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]


def _stage(name: str, row_cfg: dict, base_cfg: dict, reads: Sequence[str], settings: dict,
           seed: int, workdir: str, needs: tuple[str, ...], shared: bool = False) -> Run:
  base_cfg = json.loads(json.dumps(base_cfg))  # (tuples become lists, as in `cfg`)
  base_cfg["seed"] = seed
  cfg = json.loads(json.dumps(base_cfg))
  for path in reads:
    _set(cfg, path, json.loads(json.dumps(_get(row_cfg, path))))
  if name == "sft":
    for path in CRITIC_START:
      _set(cfg, path, _get(base_cfg, path))
  for path, value in settings.items():
    _set(cfg, path, value)
  base = flatten(base_cfg)
  fields = {k: v for k, v in flatten(cfg).items() if base.get(k) != v}
  fields["seed"] = seed
  # The key names the run it starts from by its directory's name, not its full path, so a
  # moved workdir keeps its keys.
  hashed = json.loads(json.dumps(cfg))
  if hashed["model"].get("init_from"):
    hashed["model"]["init_from"] = start_name(hashed["model"]["init_from"])
  directory = os.path.join(workdir, SHARED if shared else f"seed{seed}",
                           f"stage-{name}-{stage_key(hashed)}")
  return Run(name, "stage", seed, directory, "vapo", tuple(sorted(fields.items())), needs)


def start_name(directory: str) -> str:
  """A start's name in a stage key: its directory's name (a selected start, `<SFT>/band`,
  with its SFT run's)."""
  name = os.path.basename(os.path.normpath(directory))
  if name == report.BAND_DIR:
    return os.path.basename(os.path.dirname(os.path.normpath(directory))) + "/" + name
  return name


def selection_settings(band: dict | None, sft_steps: int) -> dict[str, Any]:
  """What a band with a "select" rule adds to the shared SFT stage: a checkpoint at every
  candidate step, all of them kept ({} without a rule)."""
  if not band or "select" not in band:
    return {}
  steps = sft_band.candidate_steps(band["select"], sft_steps)  # (checks the rule)
  return {"checkpoint.every": int(band["select"]["every"]),
          "checkpoint.keep": len(steps) + 1, "checkpoint.keep_best": False}


def shares_sft(cfg: dict) -> bool:
  """True when the config's SFT stage does not depend on `seed` (data and init seeds set)."""
  return cfg["data"]["seed"] >= 0 and cfg["model"]["init_seed"] >= 0


def band_run(sft: Run, band_name: str = "SFT_BAND") -> Run:
  """The check of a shared SFT start against the config's SFT_BAND (`sft_band`): it
  fails (and the rows that start from it are skipped) outside the band."""
  directory = os.path.join(sft.directory, report.BAND_DIR)
  return Run("sft_band", "stage", sft.seed, directory, "vapo",
             tuple(sorted({**dict(sft.overrides), "model.init_from": sft.directory,
                           "sft.enabled": False}.items())), (sft.directory,),
             module=sft_band.__name__, args=(f"--band={band_name}",))


def plan(load, rows: Sequence[Row], seeds: Sequence[int], workdir: str,
         band: dict | None = None, band_name: str = "SFT_BAND") -> list[Run]:
  """Every run, in order: per seed, each row after the stage runs it needs (once each).

  Args:
    load: load(preset, overrides) -> the config (a plain dict) of that preset with the
      user's flags and `overrides` applied.
    rows: the rows.
    seeds: the seeds (config field `seed`).
    workdir: the tool's workdir.
    band: the config's SFT_BAND: a shared SFT start is checked against it before any row
      starts from it (None: no check); band_name: its name in the config file.
  """
  runs, seen = [], set()

  def add(run: Run) -> Run:
    if run.directory not in seen:
      seen.add(run.directory)
      runs.append(run)
    return run

  sft_seed = load("vapo", {})["seed"]  # the config's own: the seed of a shared SFT run
  for seed in seeds:
    base = load("vapo", {"seed": seed})
    for row in rows:
      cfg = load(row.preset, {**dict(row.overrides), "seed": seed})
      overrides: dict[str, Any] = {**dict(row.overrides), "seed": seed}
      needs: tuple[str, ...] = ()
      if cfg["sft"]["enabled"]:
        small_eval = {"eval.num_examples": cfg["eval"]["batch_prompts"],
                      "eval.samples_per_problem": 1, "eval.every": 0}
        shared = shares_sft(cfg)
        checked = shared and band is not None
        sft = add(_stage("sft", cfg, load("vapo", {"seed": sft_seed}) if shared else base,
                         SHARED_SFT_READS if shared else SFT_READS, {
                             "value_pretrain.enabled": False, "rl.steps": 0,
                             "metrics.plot": False, **small_eval,
                             **selection_settings(band if checked else None,
                                                  cfg["sft"]["steps"])},
                         sft_seed if shared else seed, workdir, (), shared=shared))
        start = sft.directory
        needs = (sft.directory,)
        if checked:
          needs = (add(band_run(sft, band_name)).directory,)
          if "select" in band:  # the selected checkpoint, saved by the band run
            start = needs[0]
        overrides.update({"sft.enabled": False, "model.init_from": start})
        critic_from: dict[str, Any] = {}  # how the critic starts, where it is not the policy
        critic = config_lib.uses_critic(cfg["rl"]["advantage_estimator"])
        if critic and cfg["model"]["critic_start"] == "reward_model":
          rm = add(_stage("reward_model", cfg, base, REWARD_MODEL_READS, {
              "sft.enabled": False, "model.init_from": start, "rl.steps": 0,
              "value_pretrain.enabled": False, "model.critic_start": "reward_model",
              "checkpoint.save_critic": True, "metrics.plot": False, **small_eval},
                          seed, workdir, needs))
          critic_from = {"model.critic_start": "path",
                         "model.critic_path": os.path.join(rm.directory, REWARD_MODEL_DIR)}
          needs = (rm.directory,)
        if cfg["value_pretrain"]["enabled"] and critic:
          vp = add(_stage("value_pretrain", cfg, base, VALUE_PRETRAIN_READS, {
              "sft.enabled": False, "model.init_from": start, "rl.steps": 0,
              "checkpoint.save_critic": True, "metrics.plot": False, **critic_from,
              **small_eval}, seed, workdir, needs))
          overrides.update({"value_pretrain.enabled": False, "model.init_from": vp.directory,
                            "model.critic_start": "path",
                            "model.critic_path": os.path.join(vp.directory, "critic")})
          needs = (vp.directory,)
        else:
          overrides.update(critic_from)
      add(Run(row.name, "row", seed, os.path.join(workdir, f"seed{seed}", row.name),
              row.preset, tuple(sorted(overrides.items())), needs))
  return runs


# ------------------------------------------------------------------------------ running


def flag_value(value: Any) -> str:
  """A config value as `--config.x=` text that ml_collections parses back to it."""
  if isinstance(value, bool):
    return str(value)
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, (int, str)):
    return str(value)
  raise ValueError(f"cannot pass {value!r} on a command line")


def command(run: Run, config_path: str, user: dict[str, Any]) -> list[str]:
  """The `python -m vapo_jax.main` command line of a run."""
  fields = {**user, **dict(run.overrides)}
  return ([sys.executable, "-m", run.module, f"--config={config_path}:{run.preset}",
           "--noprogress", f"--workdir={run.directory}", *run.args]
          + [f"--config.{k}={flag_value(v)}" for k, v in sorted(fields.items())])




# Signals that stop a run on purpose (the tool's own SIGTERM, Ctrl-C, a closed terminal, a
# scheduler's preemption): the run resumes next time. Any other death (SIGKILL from the
# out-of-memory killer, SIGSEGV, SIGABRT, ...) is a crash, recorded like a non-zero exit.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def outcome(returncode: int, log_text: str, stopping: bool) -> str:
  """"finished", "interrupted" (stopped on purpose: resumes next time) or "crashed".

  `log_text` is this attempt's output only: an earlier attempt's preemption line must not
  make a resumed run that finished look interrupted again.
  """
  if returncode == 0:
    return "interrupted" if "stopped by SIGTERM after" in log_text else "finished"
  if stopping or -returncode in _STOP_SIGNALS:
    return "interrupted"
  return "crashed"


def state_label(run: Run, status: dict) -> str:
  """A run's outcome as the tool prints it: a band check that exits with `sft_band`'s
  status 3 refused the start (its verdict says why); it did not crash."""
  if (run.module == sft_band.__name__ and status["state"] == "crashed"
      and status["returncode"] == sft_band.OUTSIDE):
    return f"refused ({report.band_verdict(run.directory) or 'outside the band'})"
  return status["state"]


@dataclasses.dataclass
class _Child:
  run: Run
  cmd: list[str]
  popen: subprocess.Popen
  log_path: str
  start: int                # this attempt's output begins here in the log
  t0: float


class Runner:
  """Runs the plan's subprocesses (up to `jobs` at once, `ablate`); SIGTERM / SIGINT stop
  every live one at its next step boundary (it checkpoints) and end the tool; rerunning
  resumes.

  same_group: each run stays in the tool's process group (default: its own session, so a
  terminal's Ctrl-C reaches only the tool, which stops the run cleanly). With it,
  `kill -STOP -PGID` / `kill -CONT -PGID` of the tool's group pause and resume the run too
  (a tool started under `setsid` in the background, sharing its cores).
  env: variables set on top of the tool's environment in every run (the compile cache).
  """

  def __init__(self, same_group: bool = False, env: dict[str, str] | None = None,
               deadline: float | None = None):
    self.children: list[_Child] = []
    self.stopping = False
    self.same_group = same_group
    self.env = env or {}
    self.deadline = deadline   # epoch seconds: then every run is stopped as by SIGTERM

  def stop(self) -> None:
    """Tells every live run to stop (SIGTERM: it checkpoints at its next step boundary and
    exits) and starts nothing more."""
    self.stopping = True
    for c in self.children:
      if c.popen.poll() is None:
        c.popen.send_signal(signal.SIGTERM)

  def install(self) -> None:
    def handler(signum, frame):
      del signum, frame
      self.stop()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)

  def start(self, run: Run, cmd: list[str]) -> _Child:
    """Starts one run in the background (its output appended to its log)."""
    os.makedirs(run.directory, exist_ok=True)
    path = os.path.join(run.directory, LOG)
    # This attempt's output begins here: a resumed run appends to the earlier attempts' log.
    start = os.path.getsize(path) if os.path.exists(path) else 0
    with open(path, "a", encoding="utf-8") as log:
      log.write(f"\n$ {' '.join(cmd)}\n")
      log.flush()
      popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=_die_with_parent,
                               start_new_session=not self.same_group,
                               env={**os.environ, **self.env} if self.env else None)
    child = _Child(run, cmd, popen, path, start, time.time())
    self.children.append(child)
    return child

  def finish(self, child: _Child) -> dict:
    """The status of a child that has exited (saved unless it was interrupted)."""
    self.children.remove(child)
    returncode = child.popen.returncode
    with open(child.log_path, "rb") as f:
      f.seek(child.start)
      text = f.read().decode("utf-8", errors="replace")
    state = outcome(returncode, text[-20000:], self.stopping)
    status = {"state": state, "returncode": returncode, "wall_s": time.time() - child.t0,
              "command": child.cmd}
    if state == "crashed":
      status["log_tail"] = text[-3000:]
    if state != "interrupted":
      _write_json(os.path.join(child.run.directory, report.STATUS), status)
    return status

  def wait_any(self, poll_s: float = 0.5) -> tuple[_Child, dict]:
    """Waits for one of the live runs to exit; returns it and its status."""
    while True:
      for c in self.children:
        if c.popen.poll() is not None:
          return c, self.finish(c)
      if self.deadline is not None and not self.stopping and time.time() >= self.deadline:
        print("[ablate] the deadline (--stop_after) has come: stopping the runs; rerun the "
              "same command to resume", flush=True)
        self.stop()
      time.sleep(poll_s)

  def run(self, run: Run, cmd: list[str]) -> dict:
    """Runs one command to its end; returns (and, unless interrupted, saves) its status."""
    child = self.start(run, cmd)
    child.popen.wait()
    return self.finish(child)


def _die_with_parent() -> None:
  """In the child: SIGTERM when the tool dies (Linux), so no run is left training alone."""
  try:
    import ctypes  # pylint: disable=import-outside-toplevel
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def _write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)




# ------------------------------------------------------------------------------ command


def parse_rows(text: str) -> list[Row]:
  if text == "all":
    return [r for r in ROWS if r.in_all]
  names = [n.strip() for n in text.split(",") if n.strip()]
  unknown = [n for n in names if n not in ROW_NAMES]
  if unknown or not names:
    raise ValueError(f"unknown rows {unknown}; choose from all, {', '.join(ROW_NAMES)}")
  return [r for r in ROWS if r.name in names]


def parse_seeds(text: str, first: int) -> list[int]:
  """--seeds: a count ("3": first, first + 1, first + 2), a list ("3,4,5") or a range
  ("3-5"); a single named seed is "7,"."""
  text = text.strip()
  try:
    if "," in text:
      seeds = [int(x) for x in text.split(",") if x.strip()]
    elif "-" in text[1:]:
      lo, hi = (int(x) for x in text.split("-", 1))
      seeds = list(range(lo, hi + 1))
    else:
      count = int(text)
      if count < 1:
        raise ValueError
      seeds = [first + i for i in range(count)]
  except ValueError:
    seeds = []
  if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
    raise ValueError(f"--seeds={text!r}: a count >= 1, a list of distinct seeds >= 0 "
                     '("3,4,5"; one seed: "7,") or a range ("3-5")')
  return seeds


def config_loader(path: str, user: dict[str, Any]):
  """load(preset, overrides) -> the config file's config as a plain dict (checked)."""
  module = config_file.config_module(path)

  def load(preset: str, overrides: dict[str, Any]) -> dict:
    c = module.get_config(preset)
    c.update_from_flattened_dict({**user, **overrides})
    config_lib.from_config_dict(c)  # a bad field fails here, before any run starts
    return c.to_dict()

  return load


COMPILE_CACHE = "jax_cache"  # W/jax_cache: the runs' shared jax compilation cache


def ablate(config_path: str, rows: Sequence[Row], seeds: Sequence[int], workdir: str,
           user: dict[str, Any], *, rerun_crashed: bool = False, command_text: str = "",
           smoke: bool = False, same_group: bool = False, jobs: int = 1,
           compile_cache: bool = True, stages_only: bool = False,
           stop_after: float = 0.0) -> list[dict]:
  """Runs (or resumes) the plan and writes the reports; returns the row summaries.

  smoke: the config file's SMOKE overrides under the user's, and its SMOKE_BAND (every
  stage at a few steps: a check that the whole command runs, not a measurement).
  same_group: the runs stay in the tool's process group (`Runner`).
  jobs: runs at once. A run starts once the stage runs it needs have finished, the first
  ready one in the plan's order first; the runs are the same processes as with jobs = 1,
  so the results are too (each run's numbers depend on its config alone).
  compile_cache: the runs share jax's persistent compilation cache in W/jax_cache (unless
  JAX_COMPILATION_CACHE_DIR is set): a row compiles the same programs as the one before.
  stages_only: run only the stages the rows start from (a pilot: the shared SFT start, its
  band check, value pretraining), no row; the table's command then reuses them.
  stop_after: seconds (0: none) after which the live runs are stopped as by SIGTERM (each
  checkpoints at its next step boundary) and nothing more starts: a sitting that must end
  at a known time ends cleanly, and the same command resumes every run where it stopped.
  """
  if jobs < 1:
    raise ValueError(f"--jobs={jobs}: need >= 1")
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  module = config_file.config_module(config_path)
  band_name = "SFT_BAND"
  if smoke:
    if not hasattr(module, "SMOKE"):
      raise ValueError(f"--smoke: {config_path} defines no SMOKE overrides")
    user = {**module.SMOKE, **user}
    band_name = "SMOKE_BAND"
  runs = plan(config_loader(config_path, user), rows, seeds, workdir,
              band=getattr(module, band_name, None), band_name=band_name)
  header = {"config": config_path, "seeds": list(seeds), "command": command_text}
  by_dir = {r.directory: r for r in runs}
  if stages_only:
    runs = [r for r in runs if r.kind == "stage"]

  def done(run):
    status = report.read_status(run)
    return status is not None and (status["state"] == "finished" or (
        status["state"] == "crashed" and not rerun_crashed))

  todo = [r for r in runs if not done(r)]
  print(f"[ablate] {len(runs)} runs ({sum(r.kind == 'row' for r in runs)} rows × seeds, "
        f"{sum(r.kind == 'stage' for r in runs)} shared stages): {len(runs) - len(todo)} "
        f"done before, {len(todo)} to run" + (f", {jobs} at once" if jobs > 1 else ""),
        flush=True)
  env = {}
  if compile_cache and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(workdir, COMPILE_CACHE)
  if stop_after < 0:
    raise ValueError(f"--stop_after={stop_after}: need >= 0 (0: no deadline)")
  runner = Runner(same_group, env, deadline=time.time() + stop_after if stop_after else None)
  runner.install()
  t0, times, count = time.time(), [], 0
  pending, skipped = list(todo), set()

  def where(run: Run) -> str:
    shared = os.sep + SHARED + os.sep in run.directory
    return (f"{'shared' if shared else f'seed {run.seed}'} "
            f"{run.name if run.kind == 'row' else 'stage ' + run.name}")

  def blocked(run: Run) -> str | None:
    """The first of its stages that cannot finish now (failed or skipped), else None."""
    for d in run.needs:
      if d in skipped:
        return d
      if any(p.directory == d for p in pending) or any(
          c.run.directory == d for c in runner.children):
        continue
      if (report.read_status(by_dir[d]) or {}).get("state") != "finished":
        return d
    return None

  def ready(run: Run) -> bool:
    return not any(p.directory in run.needs for p in pending) and not any(
        c.run.directory in run.needs for c in runner.children)

  interrupted = False
  while pending or runner.children:
    # Start what can start: skip the runs whose stages failed; launch the ready ones.
    while pending and not runner.stopping and not interrupted:
      failed = next(((r, blocked(r)) for r in pending if blocked(r)), None)
      if failed:
        run, stage = failed
        pending.remove(run)
        skipped.add(run.directory)
        count += 1
        why = report.band_verdict(stage)
        print(f"[ablate] {count}/{len(todo)} {where(run)}: skipped, its stage {stage} did "
              "not finish" + (f" ({why})" if why else ""), flush=True)
        continue
      if len(runner.children) >= jobs:
        break
      run = next((r for r in pending if ready(r)), None)
      if run is None:
        break
      pending.remove(run)
      runner.start(run, command(run, config_path, user))
    if not runner.children:
      break
    child, status = runner.wait_any()
    run = child.run
    count += 1
    if status["state"] == "interrupted":
      print(f"[ablate] {where(run)}: interrupted; rerun the same command to resume",
            flush=True)
      interrupted = True
      continue
    times.append(status["wall_s"])
    left = len(pending) + len(runner.children)
    eta = sum(times) / len(times) * left / jobs
    extra = ""
    if run.kind == "row":
      rec = report.run_record(run, status)
      if "avg" in rec:
        extra = f", avg@{rec['k']} {rec['avg']:.3f}"
    print(f"[ablate] {count}/{len(todo)} {where(run)}: {state_label(run, status)} in "
          f"{report.hms(status['wall_s'])}{extra} | elapsed {report.hms(time.time() - t0)}, ETA "
          f"{report.hms(eta)}", flush=True)
    if run.kind == "row":
      report.write_reports(workdir, runs, rows, header)
  if stages_only:  # (no table: one written by the rows' command stays as it is)
    report.keep_metrics(workdir, runs)
    kept = os.path.join(workdir, report.METRICS_DIR)
    print(f"[ablate] stages only: kept their metrics in {kept}", flush=True)
    return []
  summaries = report.write_reports(workdir, runs, rows, header)
  print(f"[ablate] wrote {os.path.join(workdir, 'ablation.md')}", flush=True)
  return summaries


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "Experiment config file (no preset: the "
                                  "rows choose them); --config.x=y applies to every run.",
                                  lock_config=True)
  flags.DEFINE_string("rows", "", "all, or a comma list of: " + ", ".join(ROW_NAMES)
                      + " (default: the config file's ABLATION_ROWS, else all)")
  flags.DEFINE_string("seeds", "3", 'Seeds: a count from the config\'s seed ("3"), a list '
                      '("3,4,5") or a range ("3-5").')
  flags.DEFINE_string("workdir", None, "Where the runs and the reports go.")
  flags.DEFINE_bool("rerun_crashed", False, "Run again the runs that crashed last time.")
  flags.DEFINE_bool("smoke", False, "The config file's SMOKE overrides and SMOKE_BAND: every "
                    "stage at a few steps (a check that the command runs end to end).")
  flags.DEFINE_integer("jobs", 1, "Runs at once (2 on a 2-core machine: a run keeps about "
                       "one core busy); a run starts when the stages it needs have finished.")
  flags.DEFINE_bool("compile_cache", True, "Share jax's persistent compilation cache between "
                    "the runs (W/jax_cache, unless JAX_COMPILATION_CACHE_DIR is set).")
  flags.DEFINE_float("stop_after", 0.0, "Seconds after which the runs are stopped as by "
                     "SIGTERM (they checkpoint; the same command resumes them); 0: none.")
  flags.DEFINE_bool("stages_only", False, "Run only the stages the rows start from (shared "
                    "SFT, its band check, reward model, value pretraining), no row: a pilot "
                    "that the table's command, in the same workdir, then reuses.")
  flags.DEFINE_bool("same_group", False, "Keep every run in the tool's process group, so "
                    "that kill -STOP/-CONT -PGID of the tool pauses and resumes its run too "
                    "(default: each run in its own session; Ctrl-C reaches only the tool).")


def main(argv):
  del argv
  f = flags.FLAGS
  if f.config is None or not f.workdir:
    raise app.UsageError("--config=configs/<experiment>.py and --workdir are required")
  path = config_flags.get_config_filename(f["config"])
  if ":" in path:
    raise app.UsageError(f"--config={path}: give the file without a preset; --rows picks them")
  user = dict(config_flags.get_override_values(f["config"]))
  first = int(user.pop("seed", f.config.seed))
  try:
    rows = parse_rows(f.rows or getattr(config_file.config_module(path), "ABLATION_ROWS", "all"))
    seeds = parse_seeds(f.seeds, first)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  ablate(path, rows, seeds, f.workdir, user,
         rerun_crashed=f.rerun_crashed, smoke=f.smoke, same_group=f.same_group,
         jobs=f.jobs, compile_cache=f.compile_cache, stages_only=f.stages_only,
         stop_after=f.stop_after,
         command_text=" ".join(["python -m experiments.ablation.ablate", *sys.argv[1:]]))


if __name__ == "__main__":
  define_flags()
  app.run(main)
