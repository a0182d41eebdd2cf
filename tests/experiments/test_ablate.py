"""The ablation tool: its plan, its statistics, its reports, and the command end to end.

The end-to-end test runs `python -m experiments.ablation.ablate` as users do, on a few steps of
the tiny config: first one row, then two (the first row and the shared stages are not run
again), then the same command again (nothing runs, the table is unchanged); and one row
stopped with SIGTERM while it trains, then resumed to its end by the same command.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.ablation import ablate
from experiments.ablation import ablation_report as report
from experiments.ablation import config_file
from experiments.ablation import sft_band
from vapo_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "tiny.py")
PAPER_ROWS = ("vapo", "no_value_pretrain", "no_decoupled_gae", "no_length_adaptive",
              "no_clip_higher", "no_token_level_loss", "no_positive_nll", "no_group_sampling",
              "ppo", "grpo", "dapo")


# ------------------------------------------------------------------------ statistics


def test_t_interval_against_hand_values():
  assert report.t_quantile_975(1) == 12.706 and report.t_quantile_975(2) == 4.303
  # Beyond the table: Student's t 97.5% quantiles 2.0211 (df 40) and 1.9840 (df 100).
  assert abs(report.t_quantile_975(40) - 2.0211) < 1e-3
  assert abs(report.t_quantile_975(100) - 1.9840) < 1e-3
  mean, half = report.mean_interval([0.1, 0.2, 0.3])
  assert math.isclose(mean, 0.2) and math.isclose(half, 4.303 * 0.1 / math.sqrt(3))
  assert report.mean_interval([0.5]) == (0.5, None)
  assert report.first_step_reaching([(0, 0.1), (10, 0.6), (20, 0.5)], 0.6) == 10
  assert report.first_step_reaching([(0, 0.1), (10, 0.5)], 0.6) is None


def test_paired_difference_cancels_the_seeds_starts():
  # Seeds whose starts differ by 20 points, the row 2 points below VAPO in each: the plain
  # intervals overlap widely, the paired difference is -2 with no spread.
  row = ablate.ROWS[1]
  vapo = {0: 0.50, 1: 0.70, 2: 0.60}
  recs = [{"state": "finished", "seed": s, "avg": v - 0.02, "pass": v, "curve": [(0, v)],
           "response_length": 10.0, "entropy": 0.1} for s, v in vapo.items()]
  recs.append({"state": "crashed", "seed": 3})
  out = report.row_summary(row, recs, 0.6, vapo)
  assert math.isclose(out["avg_minus_vapo"], -0.02) and out["avg_minus_vapo_ci95"] < 1e-9
  assert out["paired_seeds"] == 3 and out["avg_ci95"] > 0.2
  # A seed VAPO did not finish is left out of the pairs.
  out = report.row_summary(row, recs, 0.6, {0: 0.50, 1: 0.75})
  assert out["paired_seeds"] == 2
  mean, half = report.mean_interval([-0.02, -0.07])
  assert math.isclose(out["avg_minus_vapo"], mean) and math.isclose(
      out["avg_minus_vapo_ci95"], half)


def test_outcome():
  assert ablate.outcome(0, "... {", False) == "finished"
  assert ablate.outcome(0, '"preempted": "stopped by SIGTERM after rl step 3"', False) == (
      "interrupted")
  assert ablate.outcome(1, "NonFiniteError", False) == "crashed"
  assert ablate.outcome(1, "KeyboardInterrupt", True) == "interrupted"
  assert ablate.outcome(-15, "", False) == "interrupted"   # SIGTERM from outside: resumes
  assert ablate.outcome(-9, "", False) == "crashed"        # the OOM killer: recorded
  assert ablate.outcome(-11, "", False) == "crashed"       # a segfault: recorded
  assert ablate.outcome(-9, "", True) == "interrupted"     # while the tool was stopping


def test_a_resumed_run_that_finishes_is_finished(tmp_path):
  """The log is appended to across attempts; only this attempt's output decides."""
  run = ablate.Run("vapo", "row", 0, str(tmp_path / "vapo"), "vapo", ())
  say = lambda text, code=0: [sys.executable, "-c",  # noqa: E731
                              f"import sys; print({text!r}); sys.exit({code})"]
  runner = ablate.Runner()
  first = runner.run(run, say('"preempted": "stopped by SIGTERM after rl step 3"'))
  assert first["state"] == "interrupted" and report.read_status(run) is None
  second = runner.run(run, say('{"wall_s": 1.0}'))
  assert second["state"] == "finished" and report.read_status(run)["state"] == "finished"
  log = (tmp_path / "vapo" / ablate.LOG).read_text()
  assert "stopped by SIGTERM" in log and log.count("$ ") == 2  # both attempts kept
  crashed = ablate.Run("ppo", "row", 0, str(tmp_path / "ppo"), "ppo", ())
  third = runner.run(crashed, say("Traceback: NonFiniteError", 3))
  assert third["state"] == "crashed" and "NonFiniteError" in third["log_tail"]


def test_runs_stay_in_the_tools_process_group_only_when_asked(tmp_path):
  """Default: each run in its own session (Ctrl-C reaches only the tool); same_group: the
  tool's group, so `kill -STOP -PGID` of a background tool pauses its run as well."""
  cmd = [sys.executable, "-c", "import os; print('pgid', os.getpgrp())"]
  for same, expect_ours in ((False, False), (True, True)):
    run = ablate.Run("vapo", "row", 0, str(tmp_path / f"same{same}"), "vapo", ())
    assert ablate.Runner(same_group=same).run(run, cmd)["state"] == "finished"
    log = (tmp_path / f"same{same}" / ablate.LOG).read_text()
    pgid = int(log.split("pgid ")[1].split()[0])
    assert (pgid == os.getpgrp()) == expect_ours, (same, pgid, os.getpgrp())


def test_rows_are_the_papers_and_presets():
  assert set(ablate.ROW_NAMES) == {*PAPER_ROWS, "no_decoupled_gae_vp", "ppo_lam095"}
  assert {r.name for r in ablate.parse_rows("all")} == {*PAPER_ROWS, "no_decoupled_gae_vp"}
  assert all(r.preset in config_lib.PRESETS for r in ablate.ROWS)
  paper = {r.name: r.paper for r in ablate.ROWS}
  assert (paper["vapo"], paper["ppo"], paper["dapo"], paper["no_value_pretrain"]) == (
      60.4, 5, 50, 11)
  assert [r.name for r in ablate.parse_rows("ppo,vapo")] == ["vapo", "ppo"]
  with pytest.raises(ValueError, match="unknown rows"):
    ablate.parse_rows("vapo,no_such_row")


# ------------------------------------------------------------------------------ plan


def test_plan_shares_each_stage_once_per_seed(tmp_path):
  load = ablate.config_loader(TINY, {"rl.steps": 3})
  runs = ablate.plan(load, ablate.parse_rows(",".join(PAPER_ROWS)), [0, 1], str(tmp_path))
  for seed in (0, 1):
    mine = [r for r in runs if r.seed == seed]
    sft = [r for r in mine if r.name == "sft"]
    vp = [r for r in mine if r.name == "value_pretrain"]
    rm = [r for r in mine if r.name == "reward_model"]
    assert len(sft) == 1 and len(vp) == 1 and len(rm) == 1, [r.directory for r in mine]
    assert sorted(r.name for r in mine if r.kind == "row") == sorted(PAPER_ROWS)
    fields = {r.name: dict(r.overrides) for r in mine}
    assert fields["value_pretrain"]["model.init_from"] == sft[0].directory
    assert fields["sft"]["rl.steps"] == 0 and not fields["sft"]["value_pretrain.enabled"]
    # The reward model trains once per seed, from the SFT policy, and saves itself.
    assert fields["reward_model"]["model.init_from"] == sft[0].directory
    assert fields["reward_model"]["model.critic_start"] == "reward_model"
    assert load("vapo", fields["reward_model"])["checkpoint"]["save_critic"] is True
    assert fields["reward_model"]["rl.steps"] == 0
    assert not fields["reward_model"]["value_pretrain.enabled"]
    from_rm = {"no_value_pretrain", "ppo"}
    keeps_vp = {"vapo", "no_decoupled_gae", "no_length_adaptive", "no_clip_higher",
                "no_token_level_loss", "no_positive_nll", "no_group_sampling"}
    for r in mine:
      if r.kind != "row":
        continue
      f = fields[r.name]
      assert f["seed"] == seed and f["sft.enabled"] is False
      if r.name in keeps_vp:
        assert f["model.init_from"] == vp[0].directory and r.needs == (vp[0].directory,)
        assert f["model.critic_path"] == os.path.join(vp[0].directory, "critic")
        assert f["model.critic_start"] == "path"
      elif r.name in from_rm:  # the paper's rows whose critic starts from the reward model
        assert f["model.init_from"] == sft[0].directory and r.needs == (rm[0].directory,)
        assert f["model.critic_path"] == os.path.join(rm[0].directory, "reward_model")
        assert f["model.critic_start"] == "path"
      else:
        assert f["model.init_from"] == sft[0].directory and "model.critic_path" not in f
      # Stages come before the rows that start from them.
      assert all(runs.index(next(x for x in runs if x.directory == d)) < runs.index(r)
                 for d in r.needs)
  # Each stage run's command builds exactly the config its key hashes.
  for r in runs:
    if r.kind == "stage":
      cfg = load(r.preset, dict(r.overrides))
      if cfg["model"]["init_from"]:
        cfg["model"]["init_from"] = os.path.basename(cfg["model"]["init_from"])
      assert r.directory.endswith(ablate.stage_key(json.loads(json.dumps(cfg))))
  cmd = ablate.command(runs[-1], TINY, {"rl.steps": 3})
  assert cmd[1:4] == ["-m", "vapo_jax.main", f"--config={TINY}:dapo"]
  assert "--config.rl.steps=3" in cmd and "--config.sft.enabled=False" in cmd


def test_plan_separates_a_stage_when_a_row_changes_what_it_reads(tmp_path):
  real = ablate.config_loader(TINY, {})

  def load(preset, overrides):
    cfg = real(preset, overrides)
    if preset == "ppo":
      cfg["optim"]["sft_lr"] = 1e-4  # SFT reads it: ppo gets its own SFT stage
    if preset == "no_clip_higher":
      cfg["rl"]["eps_low"] = 0.1     # neither stage reads it
    return cfg

  runs = ablate.plan(load, ablate.parse_rows("vapo,no_clip_higher,ppo"), [0], str(tmp_path))
  assert [r.name for r in runs] == ["sft", "value_pretrain", "vapo", "no_clip_higher", "sft",
                                    "reward_model", "ppo"]
  assert dict(runs[4].overrides)["optim.sft_lr"] == 1e-4


def test_init_from_takes_the_policy_of_another_runs_newest_checkpoint(tmp_path):
  """The hook the rows start with (`model.init_from`): the newest checkpoint's policy
  weights (a TrainState's params, or the frozen policy of a stage that trains none)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vapo_jax.rl import train_state  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint as run_checkpoint  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint_store  # pylint: disable=import-outside-toplevel
  like = {"b": jnp.zeros((3,)), "w": jnp.zeros((2, 3))}
  older = {"b": jnp.full((3,), 2.0), "w": jnp.ones((2, 3))}
  newest = {"b": jnp.arange(3.0), "w": jnp.arange(6.0).reshape(2, 3)}
  store = checkpoint_store.CheckpointStore(str(tmp_path / "run" / "checkpoints"),
                                           async_save=False)
  store.save(1, {"policy_params": older}, {})
  zero = jnp.zeros((), jnp.int32)
  store.save(5, {"policy": train_state.TrainState(newest, {"mu": older}, zero),
                 "critic": train_state.TrainState(older, {}, zero)}, {})
  store.close()
  for where in ("run", "run/checkpoints"):
    got, note = run_checkpoint.initial_policy(str(tmp_path / where), like)
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in newest.items()}
    assert note.endswith("step 5 (policy)")
  # A named checkpoint (the band's selection reads its candidates so).
  got, note = run_checkpoint.initial_policy(str(tmp_path / "run"), like, step=1)
  assert got["w"].tolist() == older["w"].tolist() and note.endswith("step 1 (policy_params)")
  with pytest.raises(checkpoint_store.CheckpointError, match="no checkpoint 3"):
    run_checkpoint.initial_policy(str(tmp_path / "run"), like, step=3)
  with pytest.raises(checkpoint_store.CheckpointMismatch, match="w"):
    run_checkpoint.initial_policy(str(tmp_path / "run"), {**like, "w": jnp.zeros((3, 3))})
  with pytest.raises(checkpoint_store.CheckpointError, match="model.init_from"):
    run_checkpoint.initial_policy(str(tmp_path / "elsewhere"), like)


# --------------------------------------------------------------------------- reports


def _fake_run(tmp_path, name, seed, curve, entropy, state="finished", kinds=None):
  run = ablate.Run(name, "row", seed, str(tmp_path / f"seed{seed}" / name), name, ())
  os.makedirs(run.directory)
  with open(os.path.join(run.directory, "metrics.jsonl"), "w") as f:
    for step, avg in curve:
      if step:
        f.write(json.dumps({"stage": "rl", "step": step, "entropy": entropy + step}) + "\n")
      per_kind = {f"avg@4/{kind}": avg + off for kind, off in (kinds or {}).items()}
      f.write(json.dumps({"stage": "eval", "step": step, "avg@4": avg, "pass@4": avg + 0.2,
                          "response_length": 100 + step, "greedy_accuracy": avg,
                          **per_kind}) + "\n")
  with open(os.path.join(run.directory, report.STATUS), "w") as f:
    json.dump({"state": state, "wall_s": 60.0}, f)
  return run


def test_a_run_record_keeps_the_per_kind_scores_apart_from_avg_at_k(tmp_path):
  run = ablate.Run("vapo", "row", 0, str(tmp_path / "r"), "vapo", ())
  os.makedirs(run.directory)
  with open(os.path.join(run.directory, "metrics.jsonl"), "w") as f:
    for step, avg in ((0, 0.2), (40, 0.5)):  # the per-kind keys first: k must still be 4
      f.write(json.dumps({"stage": "eval", "step": step, "avg@4/long": avg - 0.1,
                          "avg@4/short": avg + 0.1, "avg@4": avg, "pass@4": 0.9}) + "\n")
  rec = report.run_record(run, {"state": "finished"})
  assert (rec["k"], rec["avg"], rec["curve"]) == (4, 0.5, [(0, 0.2), (40, 0.5)])
  assert math.isclose(rec["avg/long"], 0.4) and math.isclose(rec["avg/short"], 0.6)


def test_the_report_pairs_each_kind_of_problem_with_vapo(tmp_path):
  runs = [_fake_run(tmp_path, "vapo", s, [(0, .1), (20, a)], 1.0, kinds={"long": -.1})
          for s, a in ((0, .5), (1, .6))]
  runs += [_fake_run(tmp_path, "no_length_adaptive", s, [(0, .1), (20, a)], 1.0,
                     kinds={"long": off}) for s, a, off in ((0, .5, -.2), (1, .7, -.2))]
  vapo, nla = report.write_reports(str(tmp_path), runs,
                                   ablate.parse_rows("vapo,no_length_adaptive"),
                                   {"config": "c.py", "seeds": [0, 1], "command": "x"})
  assert math.isclose(vapo["avg/long"], 0.45) and math.isclose(nla["avg/long"], 0.4)
  # Long half per seed: 0.3 vs 0.4 and 0.5 vs 0.5, so Δ -0.1 and 0 (overall: 0 and +0.1).
  assert math.isclose(nla["avg/long_minus_vapo"], -0.05)
  assert math.isclose(nla["avg_minus_vapo"], 0.05)
  md = (tmp_path / "ablation.md").read_text()
  assert "| row | long | Δ long |" in md, md
  assert "| no_length_adaptive | 40.0 ± 127.1 | -5.0 ± 63.5 |" in md, md


def test_reports_from_the_runs_files(tmp_path):
  runs = [
      _fake_run(tmp_path, "vapo", 0, [(0, .1), (10, .6), (20, .5)], 1.0),
      _fake_run(tmp_path, "vapo", 1, [(0, .1), (10, .3), (20, .6)], 2.0),
      _fake_run(tmp_path, "vapo", 2, [(0, .1), (10, .7), (20, .7)], 3.0),
      _fake_run(tmp_path, "no_clip_higher", 0, [(0, .1), (10, .2), (20, .4)], 1.0),
      _fake_run(tmp_path, "no_clip_higher", 1, [(0, .1), (10, .6), (20, .6)], 1.0),
      _fake_run(tmp_path, "no_clip_higher", 2, [(0, .1), (10, .9)], 1.0, state="crashed"),
  ]
  rows = ablate.parse_rows("vapo,no_clip_higher")
  summaries = report.write_reports(str(tmp_path), runs, rows,
                                   {"config": "c.py", "seeds": [0, 1, 2], "command": "x"})
  vapo, nch = summaries
  assert math.isclose(vapo["avg"], 0.6) and math.isclose(vapo["avg_ci95"],
                                                         4.303 * 0.1 / math.sqrt(3))
  assert math.isclose(vapo["entropy"], 22.0) and math.isclose(vapo["response_length"], 120)
  assert math.isclose(vapo["steps_to_vapo"], 40 / 3) and vapo["reached_vapo"] == 3
  assert (nch["finished"], nch["crashed"], nch["reached_vapo"]) == (2, 1, 1)
  assert math.isclose(nch["avg"], 0.5) and math.isclose(nch["steps_to_vapo"], 10)
  assert math.isclose(nch["avg_ci95"], 12.706 * math.sqrt(0.02) / math.sqrt(2))
  md = (tmp_path / "ablation.md").read_text()
  assert ("| vapo (VAPO) | 60.4 | 60.0 ± 24.8 | 0.0 ± 0.0 | 80.0 ± 24.8 | 120.0 ± 0.0 | — | "
          "22.000 ± 2.484 "
          "| 13 (3/3) | 0/3 | 3/3 |") in md, md
  # Paired: seeds 0 and 1 finished, 0.4 and 0.6 against VAPO's 0.5 and 0.6: Δ -0.1 and 0.
  assert math.isclose(nch["avg_minus_vapo"], -0.05) and nch["paired_seeds"] == 2
  assert math.isclose(nch["avg_minus_vapo_ci95"], 12.706 * math.sqrt(0.005) / math.sqrt(2))
  assert ("| no_clip_higher (without Clip-Higher) | 46 | 50.0 ± 127.1 | -5.0 ± 63.5 | "
          "70.0 ± 127.1 | "
          "120.0 ± 0.0 | — | 21.000 ± 0.000 | 10 (1/2) | 1/3 | 2/3 |") in md, md
  lines = [json.loads(x) for x in (tmp_path / "ablation.jsonl").read_text().splitlines()]
  assert [x["kind"] for x in lines] == ["run"] * 6 + ["row"] * 2
  assert lines[5]["state"] == "crashed" and lines[5]["curve"] == [[0, .1], [10, .9]]
  png = (tmp_path / "ablation.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


# ------------------------------------------------------------------------ end to end

FLAGS = ["--config.sft.steps=4", "--config.sft.batch_size=16",
         "--config.value_pretrain.max_steps=2", "--config.value_pretrain.min_steps=2",
         "--config.rl.steps=4", "--config.rl.prompts_per_step=8",
         "--config.rl.responses_per_prompt=4", "--config.eval.num_examples=8",
         "--config.eval.batch_prompts=8", "--config.eval.every=2",
         "--config.data.num_train=256", "--config.data.num_eval=8",
         "--config.checkpoint.every=0", "--config.metrics.tensorboard=False",
         "--config.metrics.plot=False"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu",
       "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def _ablate(workdir, rows, *extra) -> str:
  out = subprocess.run([sys.executable, "-m", "experiments.ablation.ablate",
                        "--config=configs/tiny.py", f"--rows={rows}", "--seeds=1",
                        f"--workdir={workdir}", *FLAGS, *extra],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


def _records(directory):
  with open(os.path.join(directory, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_the_command_runs_rows_from_shared_stages_and_resumes(tmp_path):
  """SIGTERM to the tool while its first row trains: the row checkpoints and is not
  recorded, and the same command resumes it to the end. Then a second row reuses the shared
  stages, finished runs are never run again, and the reports come from the runs' files."""
  w = tmp_path / "w"
  steps = ["--config.rl.steps=6"]  # room for the SIGTERM to land mid-row
  tool = subprocess.Popen([sys.executable, "-m", "experiments.ablation.ablate",
                           "--config=configs/tiny.py", "--rows=vapo", "--seeds=1",
                           f"--workdir={w}", *FLAGS, *steps],
                          cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  metrics = w / "seed0" / "vapo" / "metrics.jsonl"
  deadline = time.time() + 600
  while not (metrics.exists() and '"stage": "rl"' in metrics.read_text()):
    assert tool.poll() is None and time.time() < deadline, tool.stdout.read()[-3000:]
    time.sleep(0.2)
  tool.send_signal(signal.SIGTERM)
  out = tool.communicate(timeout=300)[0]
  assert tool.returncode == 0, out[-3000:]
  assert "3 runs (1 rows × seeds, 2 shared stages): 0 done before, 3 to run" in out, out
  assert "seed 0 vapo: interrupted; rerun the same command to resume" in out, out
  assert report.read_status(ablate.Run("vapo", "row", 0, str(w / "seed0" / "vapo"), "vapo",
                                       ())) is None
  stopped_at = max(r["step"] for r in _records(w / "seed0" / "vapo") if r["stage"] == "rl")
  assert stopped_at < 6

  out = _ablate(w, "vapo", *steps)
  assert "2 done before, 1 to run" in out and "1/1 seed 0 vapo: finished in" in out, out
  assert "ETA 0m00s" in out, out
  rl_steps = [r["step"] for r in _records(w / "seed0" / "vapo") if r["stage"] == "rl"]
  assert sorted(rl_steps) == sorted(set(rl_steps)) and max(rl_steps) == 6, rl_steps
  vapo = w / "seed0" / "vapo"
  first = {p: os.stat(vapo / p).st_mtime_ns for p in ("metrics.jsonl", report.STATUS)}
  md_one = (w / "ablation.md").read_text()

  out = _ablate(w, "vapo,no_clip_higher", *steps)
  assert "4 runs (2 rows × seeds, 2 shared stages): 3 done before, 1 to run" in out, out
  assert "[ablate] 1/1 seed 0 no_clip_higher: finished in" in out, out
  assert {p: os.stat(vapo / p).st_mtime_ns for p in first} == first  # not run again
  stages = sorted(os.listdir(w / "seed0"))
  assert [s.split("-")[:2] for s in stages if s.startswith("stage")] == [
      ["stage", "sft"], ["stage", "value_pretrain"]]
  # Value pretraining says what ended it (here the cap: tiny's rule cannot hold in 2
  # steps), and every run's per-step metrics are kept under W/metrics.
  vp_dir = next(s for s in stages if s.startswith("stage-value_pretrain"))
  vp_last = [r for r in _records(w / "seed0" / vp_dir) if r["stage"] == "value_pretrain"][-1]
  assert vp_last["value_pretrain/stopped_by"] in ("cap", "explained_variance", "plateau")
  assert "value pretraining ended after step" in (w / "seed0" / vp_dir / "log.txt").read_text()
  assert (w / "metrics" / "seed0" / "vapo.jsonl").read_text() == (
      vapo / "metrics.jsonl").read_text()
  assert (w / "metrics" / "seed0" / f"{vp_dir}.jsonl").exists()

  # Both rows start from the shared stages: no SFT or value pretraining of their own, the
  # value-pretrained critic, and the same policy (the same held-out figures before RL).
  rows = {}
  for name in ("vapo", "no_clip_higher"):
    recs = _records(w / "seed0" / name)
    assert {r["stage"] for r in recs} == {"rl", "eval"}
    log = (w / "seed0" / name / "log.txt").read_text()
    assert "model.init_from: starting from the policy of" in log
    assert "--config.model.critic_path=" in log
    rows[name] = {r["step"]: {k: v for k, v in r.items() if k != "time"}
                  for r in recs if r["stage"] == "eval"}
    assert sorted(rows[name]) == [0, 2, 4, 6]
  assert rows["vapo"][0] == rows["no_clip_higher"][0]

  lines = [json.loads(x) for x in (w / "ablation.jsonl").read_text().splitlines()]
  runs = {x["row"]: x for x in lines if x["kind"] == "run"}
  summary = {x["row"]: x for x in lines if x["kind"] == "row"}
  md = (w / "ablation.md").read_text()
  for name, paper in (("vapo", "60.4"), ("no_clip_higher", "46")):
    assert runs[name]["state"] == "finished"
    assert runs[name]["avg"] == rows[name][6]["avg@4"]
    assert runs[name]["curve"] == [[s, rows[name][s]["avg@4"]] for s in (0, 2, 4, 6)]
    assert summary[name]["finished"] == 1 and summary[name]["paper"] == float(paper)
    label = next(r.label for r in ablate.ROWS if r.name == name)
    assert f"| {name} ({label}) | {paper} | {100 * runs[name]['avg']:.1f} |" in md, md
  vapo_line = next(x for x in md_one.splitlines() if x.startswith("| vapo "))
  assert vapo_line in md
  png = (w / "ablation.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

  out = _ablate(w, "vapo,no_clip_higher", *steps)
  assert "3 done before" not in out and "4 done before, 0 to run" in out, out
  assert (w / "ablation.md").read_text() == md


def test_rows_that_start_from_the_reward_model_share_its_stage(tmp_path):
  """no_value_pretrain and ppo start their critic from one reward model per seed: the tool
  trains it once (its own stage run) and both rows load it as their critic."""
  w = tmp_path / "w"
  out = _ablate(w, "no_value_pretrain,ppo", "--config.reward_model.steps=2")
  assert "4 runs (2 rows × seeds, 2 shared stages): 0 done before, 4 to run" in out, out
  stage = [p for p in (w / "seed0").iterdir() if p.name.startswith("stage-reward_model-")]
  assert len(stage) == 1, list((w / "seed0").iterdir())
  rm_steps = [r["step"] for r in _records(stage[0]) if r["stage"] == "reward_model"]
  assert rm_steps == [1, 2]
  assert (stage[0] / "reward_model" / "config.json").exists()
  for name in ("no_value_pretrain", "ppo"):
    recs = _records(w / "seed0" / name)
    assert not [r for r in recs if r["stage"] in ("reward_model", "value_pretrain", "sft")]
    assert [r["step"] for r in recs if r["stage"] == "rl"] == [1, 2, 3, 4]
    status = json.loads((w / "seed0" / name / report.STATUS).read_text())
    assert status["state"] == "finished"
    assert f"--config.model.critic_path={stage[0] / 'reward_model'}" in status["command"]


# -------------------------------------------------------------- protocol (issue 29)

COG = os.path.join(ROOT, "configs", "chain_or_guess.py")


def test_seeds_by_count_list_or_range():
  assert ablate.parse_seeds("3", 0) == [0, 1, 2] and ablate.parse_seeds("2", 5) == [5, 6]
  assert ablate.parse_seeds("3,4,5", 0) == [3, 4, 5] and ablate.parse_seeds("7,", 0) == [7]
  assert ablate.parse_seeds("3-5", 0) == [3, 4, 5]
  for bad in ("0", "x", "3,3", "-1,2", ""):
    with pytest.raises(ValueError, match="--seeds"):
      ablate.parse_seeds(bad, 0)


def test_one_sft_start_for_every_seed_checked_against_the_band(tmp_path):
  """With data.seed and model.init_seed set, every seed's rows start from one SFT run (under
  W/shared, the config's own seed), checked by the band run before any stage starts from
  it; the reward model and value pretraining still run once per seed."""
  module = config_file.config_module(COG)
  load = ablate.config_loader(COG, {})
  rows = ablate.parse_rows(module.ABLATION_ROWS)
  runs = ablate.plan(load, rows, [3, 4, 5], str(tmp_path), band=module.SFT_BAND)
  sft = [r for r in runs if r.name == "sft"]
  band = [r for r in runs if r.name == "sft_band"]
  assert len(sft) == 1 and len(band) == 1
  assert sft[0].directory.startswith(str(tmp_path / "shared" / "stage-sft-"))
  assert dict(sft[0].overrides)["seed"] == 0
  assert band[0].directory == os.path.join(sft[0].directory, report.BAND_DIR)
  assert band[0].needs == (sft[0].directory,) and band[0].module == "experiments.ablation.sft_band"
  assert dict(band[0].overrides)["model.init_from"] == sft[0].directory
  cmd = ablate.command(band[0], COG, {})
  assert cmd[2] == "experiments.ablation.sft_band" and "--band=SFT_BAND" in cmd
  for seed in (3, 4, 5):
    mine = [r for r in runs if r.seed == seed]
    assert {r.name for r in mine if r.kind == "row"} == set(module.ABLATION_ROWS.split(","))
    vps = [r for r in mine if r.name == "value_pretrain"]
    rm = [r for r in mine if r.name == "reward_model"]
    # Two value pretrainings (Monte Carlo, and coupled for no_decoupled_gae_vp), one RM.
    assert len(vps) == 2 and len(rm) == 1
    coupled = [dict(v.overrides).get("value_pretrain.coupled_gae") for v in vps]
    assert sorted(map(bool, coupled)) == [False, True]
    for r in [*vps, *rm]:
      assert r.needs == (band[0].directory,) and dict(r.overrides)["seed"] == seed
      # The config selects its start (SFT_BAND["select"]): stages start from the band
      # run's saved checkpoint, not from the SFT run's newest.
      assert dict(r.overrides)["model.init_from"] == band[0].directory
  # The SFT run keeps every candidate checkpoint of the selection.
  first, every = module.SFT_BAND["select"]["first"], module.SFT_BAND["select"]["every"]
  sft_fields = {**ablate.flatten(load("vapo", {})), **dict(sft[0].overrides)}
  assert sft_fields["checkpoint.every"] == every
  assert sft_fields["checkpoint.keep"] > (module.SFT_STEPS - first) // every
  # The same SFT key whatever the seeds: a fresh-seed rerun starts from the same start.
  again = ablate.plan(load, rows, [0, 1, 2], str(tmp_path), band=module.SFT_BAND)
  assert [r.directory for r in again if r.name == "sft"] == [sft[0].directory]
  # Without data and init seeds, each seed has its own SFT and no band check.
  split = ablate.config_loader(COG, {"data.seed": -1, "model.init_seed": -1})
  runs = ablate.plan(split, rows, [3, 4], str(tmp_path), band=module.SFT_BAND)
  assert sorted(r.seed for r in runs if r.name == "sft") == [3, 4]
  assert not [r for r in runs if r.name == "sft_band"]


def test_selection_candidates_and_the_sft_stages_checkpoints(tmp_path):
  """A band's "select" rule: the candidates are first, first + every, ... and the SFT run's
  last step; the SFT stage keeps a checkpoint at each; a band without it changes nothing;
  a rule whose candidates would miss the checkpoints is refused."""
  assert sft_band.candidate_steps({"first": 1000, "every": 20}, 1060) == [1000, 1020, 1040,
                                                                            1060]
  assert sft_band.candidate_steps({"first": 4, "every": 4}, 10) == [4, 8, 10]
  assert sft_band.candidate_steps({"first": 5, "every": 1}, 5) == [5]
  for bad in ({"first": 11, "every": 5}, {"first": 5, "every": 0}):
    with pytest.raises(ValueError):
      sft_band.candidate_steps(bad, 10)
  settings = ablate.selection_settings({"select": {"first": 1000, "every": 20}}, 1600)
  assert settings == {"checkpoint.every": 20, "checkpoint.keep": 32,
                      "checkpoint.keep_best": False}
  assert ablate.selection_settings({"bounds": {}}, 1600) == {}
  assert ablate.selection_settings(None, 1600) == {}
  with pytest.raises(ValueError, match="multiple of every"):
    ablate.selection_settings({"select": {"first": 1010, "every": 20}}, 1600)
  # A selected start's name in a stage key is its SFT run's (so two SFT runs' selections
  # never share a key).
  assert ablate.start_name(str(tmp_path / "stage-sft-abc" / report.BAND_DIR)) == (
      "stage-sft-abc/band")
  assert ablate.start_name(str(tmp_path / "stage-sft-abc")) == "stage-sft-abc"


def test_a_row_with_overrides_and_the_sensitivity_row():
  row = next(r for r in ablate.ROWS if r.name == "ppo_lam095")
  assert not row.in_all and row.preset == "ppo"
  load = ablate.config_loader(COG, {})
  runs = ablate.plan(load, [row], [0], "/w")
  assert dict(runs[-1].overrides)["rl.lam_policy"] == 0.95
  assert load("ppo", dict(runs[-1].overrides))["rl"]["lam_policy"] == 0.95
  assert load("ppo", {})["rl"]["lam_policy"] == 0.8


def test_metrics_are_kept_and_a_refused_start_says_why(tmp_path):
  w = tmp_path / "w"
  (w / "seed0" / "vapo").mkdir(parents=True)
  (w / "seed0" / "vapo" / "metrics.jsonl").write_text('{"stage": "rl", "step": 1}\n')
  band_dir = w / "shared" / "stage-sft-abc" / report.BAND_DIR
  band_dir.mkdir(parents=True)
  (band_dir / report.BAND_FILE).write_text(json.dumps(
      {"accepted": False, "failures": ["guess_rate = 0.300 outside [0.12, 0.18]"]}))
  runs = [ablate.Run("vapo", "row", 0, str(w / "seed0" / "vapo"), "vapo", ()),
          ablate.Run("sft_band", "stage", 0, str(band_dir), "vapo", ())]
  report.keep_metrics(str(w), runs)
  assert (w / "metrics" / "seed0" / "vapo.jsonl").read_text() == '{"stage": "rl", "step": 1}\n'
  assert json.loads((w / "metrics" / "shared" / "stage-sft-abc" / "band.json").read_text())[
      "accepted"] is False
  assert report.band_verdict(str(band_dir)) == (
      "SFT start outside SFT_BAND: guess_rate = 0.300 outside [0.12, 0.18]")
  assert report.band_verdict(str(w / "seed0" / "vapo")) == ""


def test_a_refused_start_is_printed_as_refused_not_crashed(tmp_path):
  band_dir = tmp_path / report.BAND_DIR
  band_dir.mkdir()
  (band_dir / report.BAND_FILE).write_text(json.dumps(
      {"accepted": False, "failures": ["accuracy/long = 0.145 outside [0.25, 0.4]"]}))
  band = ablate.Run("sft_band", "stage", 0, str(band_dir), "vapo", (),
                    module="experiments.ablation.sft_band")
  assert sft_band.OUTSIDE == 3  # the exit status sft_band's docstring promises
  refused = {"state": "crashed", "returncode": sft_band.OUTSIDE}
  assert ablate.state_label(band, refused) == (
      "refused (SFT start outside SFT_BAND: accuracy/long = 0.145 outside [0.25, 0.4])")
  assert ablate.state_label(band, {"state": "crashed", "returncode": 1}) == "crashed"
  row = ablate.Run("vapo", "row", 0, str(tmp_path / "vapo"), "vapo", ())
  assert ablate.state_label(row, refused) == "crashed"
  assert ablate.state_label(row, {"state": "finished", "returncode": 0}) == "finished"


def test_the_band_metrics_and_check_by_hand():
  kinds = ["short", "short", "long", "long"]
  scores = [[1, 1], [1, 0], [0, 0], [1, 0]]
  lengths = [[40, 10], [45, 50], [150, 10], [160, 120]]
  m = sft_band.dev_metrics(kinds, scores, lengths, guess_max_tokens=15)
  assert m == {"accuracy": 0.5, "accuracy/short": 0.75, "accuracy/long": 0.25,
               "guess_rate": 0.25, "response_length": 73.125}
  assert sft_band.check_band(m, {"accuracy/long": (0.2, 0.3), "guess_rate": (0.1, 0.2)}) == [
      "guess_rate = 0.250 outside [0.1, 0.2]"]
  assert sft_band.check_band(m, {"accuracy/short": (0.6, 0.8)}) == []
  assert "not measured" in sft_band.check_band(m, {"accuracy/medium": (0, 1)})[0]
  with pytest.raises(ValueError, match="N kinds"):
    sft_band.dev_metrics(kinds[:3], scores, lengths)


def test_the_registered_rg_comparison_shares_one_sft_and_one_heldout_set(tmp_path):
  """configs/smollm2_rg.py's rows (vapo, grpo) over 3 seeds: one SFT run for every seed,
  value pretraining per seed for VAPO only, and every row and seed drawing the same problems
  (data.seed fixed), so the paired bootstrap runs over problems and seeds."""
  pytest.importorskip("reasoning_gym")
  path = os.path.join(ROOT, "configs", "smollm2_rg.py")
  module = config_file.config_module(path)
  load = ablate.config_loader(path, dict(module.SMOKE))
  rows = ablate.parse_rows(module.ABLATION_ROWS)
  runs = ablate.plan(load, rows, [0, 1, 2], str(tmp_path))
  assert [r.name for r in rows] == ["vapo", "grpo"]
  assert sum(r.name == "sft" for r in runs) == 1
  assert sum(r.name == "value_pretrain" for r in runs) == 3
  data = set()
  for r in runs:
    if r.kind == "row":
      cfg = load(r.preset, dict(r.overrides))
      data.add((cfg["data"]["seed"], cfg["data"]["num_eval"], cfg["data"]["rg_arms"]))
  assert len(data) == 1 and next(iter(data))[0] == 0
  full = module.get_config()
  assert full.rl.steps >= 40 and full.rl.prompts_per_step * full.rl.responses_per_prompt >= 64
  assert full.eval.num_examples >= 256 and full.eval.samples_per_problem >= 4


@pytest.mark.parametrize("name", ["chain_or_guess.py", "longcot.py"])
def test_smoke_overrides_plan_every_row(name, tmp_path):
  """--smoke: the config's SMOKE overrides give valid configs for every row and stage (the
  loader checks each), and its SMOKE_BAND accepts any start."""
  path = os.path.join(ROOT, "configs", name)
  module = config_file.config_module(path)
  assert module.SMOKE_BAND["bounds"] == {} and module.SFT_BAND["bounds"]
  load = ablate.config_loader(path, dict(module.SMOKE))
  runs = ablate.plan(load, ablate.parse_rows("all"), [0, 1], str(tmp_path),
                     band=module.SMOKE_BAND, band_name="SMOKE_BAND")
  band = [r for r in runs if r.name == "sft_band"]
  assert len(band) == 1 and "--band=SMOKE_BAND" in ablate.command(band[0], path, {})
  for r in runs:
    if r.module == "vapo_jax.main":
      load(r.preset, dict(r.overrides))


def test_smoke_command_shares_one_sft_start_checked_by_the_band(tmp_path):
  """`--smoke` on chain_or_guess end to end: one shared SFT run, its band check (SMOKE_BAND
  accepts any start; the verdict and metrics are kept), a coupled value pretraining that says
  what ended it, and the row from them."""
  w = tmp_path / "w"
  out = subprocess.run(
      [sys.executable, "-m", "experiments.ablation.ablate", f"--config={COG}", "--smoke",
       "--rows=no_decoupled_gae_vp", "--seeds=3,", f"--workdir={w}",
       "--config.sampling.max_new_tokens=24", "--config.eval.samples_per_problem=1",
       # The smallest budgets that still run every stage: the shared-stage plumbing, resume
       # and the plateau rule are test_the_command_runs_rows_from_shared_stages_and_resumes'
       # and test_stopping's; this test adds the band, coupled targets and chain_or_guess.
       "--config.sft.steps=4", "--config.value_pretrain.max_steps=1", "--config.rl.steps=1"],
      cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "4 runs (1 rows × seeds, 3 shared stages)" in out.stdout, out.stdout
  assert "shared stage sft_band: finished" in out.stdout, out.stdout
  (sft,) = [p for p in (w / "shared").iterdir() if p.name.startswith("stage-sft-")]
  verdict = json.loads((sft / report.BAND_DIR / report.BAND_FILE).read_text())
  assert verdict["accepted"] and verdict["band"]["bounds"] == {}
  # SMOKE_BAND's selection (candidates 2 and 4; no bounds): the first, saved as a run of
  # its own that the stages start from.
  assert verdict["selected_step"] == 2 and [c["step"] for c in verdict["candidates"]] == [2]
  assert (sft / report.BAND_DIR / "checkpoints" / "2").is_dir()
  assert (sft / "checkpoints" / "2").is_dir() and (sft / "checkpoints" / "4").is_dir()
  assert {"accuracy", "accuracy/short", "accuracy/long", "guess_rate"} <= set(verdict["metrics"])
  (vp,) = [p for p in (w / "seed3").iterdir() if p.name.startswith("stage-value_pretrain-")]
  vp_log = (vp / "log.txt").read_text()
  assert "--config.value_pretrain.coupled_gae=True" in vp_log
  assert f"starting from the policy of {sft / report.BAND_DIR / 'checkpoints'} step 2" in vp_log
  last = [r for r in _records(vp) if r["stage"] == "value_pretrain"][-1]
  assert last["value_pretrain/stopped_by"] == "cap" and "value/s0_minus_return" in last
  assert (w / "metrics" / "seed3" / "no_decoupled_gae_vp.jsonl").exists()
  # chain_or_guess's held-out score per kind of chain (the long-chain half is a criterion's).
  row_eval = [r for r in _records(w / "seed3" / "no_decoupled_gae_vp") if r["stage"] == "eval"]
  assert {"avg@1/short", "avg@1/long"} <= set(row_eval[-1]), row_eval[-1]
  (rec,) = [r for r in map(json.loads, (w / "ablation.jsonl").read_text().splitlines())
            if r.get("kind") == "run" and r["row"] == "no_decoupled_gae_vp"]
  assert rec["k"] == 1 and "avg/long" in rec and "avg/short" in rec
  assert (w / "metrics" / "shared" / sft.name / "band.json").exists()
  md = (w / "ablation.md").read_text()
  assert "| no_decoupled_gae_vp (without decoupled GAE, value pretraining coupled too) |" in md


def _fake_runs(monkeypatch, fail=()):
  """Each run's command is a short Python process that records when it ran (and fails for
  the run names in `fail`), instead of `python -m vapo_jax.main`."""
  def command(run, config_path, user):
    del config_path, user
    code = ("import json, os, sys, time; t = time.time(); time.sleep(0.4); "
            f"json.dump([t, time.time()], open(os.path.join({run.directory!r}, 'ran.json'), "
            f"'w')); sys.exit({1 if run.name in fail else 0})")
    return [sys.executable, "-c", code]
  monkeypatch.setattr(ablate, "command", command)


def _ran(run):
  path = os.path.join(run.directory, "ran.json")
  return json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None


@pytest.mark.parametrize("jobs", [1, 2])
def test_jobs_run_at_once_only_after_the_stages_they_need(jobs, tmp_path, monkeypatch):
  """--jobs: every run starts after each stage it needs has ended; with 2, runs of different
  seeds overlap; a stage that crashed skips (only) the runs that need it; the status of
  each run is the same as with one job."""
  _fake_runs(monkeypatch, fail=("reward_model",) if jobs == 2 else ())
  rows = ablate.parse_rows("vapo,no_value_pretrain")
  ablate.ablate(TINY, rows, [0, 1], str(tmp_path), {}, jobs=jobs)
  runs = ablate.plan(ablate.config_loader(TINY, {}), rows, [0, 1], str(tmp_path))
  by_dir = {r.directory: r for r in runs}
  for run in runs:
    ran = _ran(run)
    needs_crashed = any(report.read_status(by_dir[d])["state"] != "finished"
                        for d in run.needs)
    if needs_crashed:
      assert ran is None and report.read_status(run) is None, run
      continue
    assert ran is not None, run
    for d in run.needs:
      assert _ran(by_dir[d])[1] <= ran[0], (run.directory, d)
  spans = sorted(_ran(r) for r in runs if _ran(r))
  overlap = any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
  assert overlap == (jobs == 2)
  if jobs == 2:  # the reward-model stage crashed: no_value_pretrain never ran, vapo did
    assert {r.name for r in runs if _ran(r) is None} == {"no_value_pretrain"}
    assert all(report.read_status(r)["state"] == "finished" for r in runs
               if r.name == "vapo")


def test_jobs_are_all_stopped_by_sigterm(tmp_path, monkeypatch):
  """SIGTERM to the tool while 2 jobs run: each run is told to stop (it checkpoints and
  exits, as with one job), neither is recorded, and nothing starts after them."""
  def command(run, config_path, user):
    del config_path, user
    code = ("import os, signal, sys, time\n"
            "def stop(*a):\n"
            "  print('stopped by SIGTERM after rl step 1', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"open(os.path.join({run.directory!r}, 'started'), 'w').close()\n"
            "time.sleep(60)\n")
    return [sys.executable, "-c", code]
  monkeypatch.setattr(ablate, "command", command)
  rows = ablate.parse_rows("grpo")  # no critic: one SFT stage and the row per seed
  runs = ablate.plan(ablate.config_loader(TINY, {}), rows, [0, 1], str(tmp_path))
  sfts = [r for r in runs if r.name == "sft"]
  assert len(sfts) == 2

  def kill_when_both_started():
    deadline = time.time() + 60
    while not all(os.path.exists(os.path.join(r.directory, "started")) for r in sfts):
      if time.time() > deadline:
        return
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  import threading  # pylint: disable=import-outside-toplevel
  killer = threading.Thread(target=kill_when_both_started)
  killer.start()
  t0 = time.time()
  try:
    ablate.ablate(TINY, rows, [0, 1], str(tmp_path), {}, jobs=2)
  finally:
    signal.signal(signal.SIGTERM, old[0])
    signal.signal(signal.SIGINT, old[1])
    killer.join()
  assert time.time() - t0 < 50  # the runs stopped, not slept out
  for r in runs:
    assert report.read_status(r) is None, r
    assert os.path.exists(os.path.join(r.directory, "started")) == (r.name == "sft")


def test_the_deadline_stops_the_runs_as_sigterm_does_and_the_command_resumes(tmp_path,
                                                                             monkeypatch):
  """--stop_after: at the deadline every live run gets SIGTERM (it checkpoints and exits),
  nothing is recorded or started after it; the same command without a deadline then runs
  everything to its end."""
  def command(run, config_path, user):
    del config_path, user
    marker = os.path.join(run.directory, "started")
    code = ("import os, signal, sys, time\n"
            "def stop(*a):\n"
            # (split: the log's command line must not read as a preemption itself)
            "  print('stopped by SIGTERM ' + 'after rl step 1', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"open({marker!r}, 'w').close()\n"
            f"time.sleep(60 if os.path.exists({hold!r}) else 0)\n")
    return [sys.executable, "-c", code]
  hold = str(tmp_path / "hold")   # while it exists, a run sleeps until it is stopped
  open(hold, "w").close()
  monkeypatch.setattr(ablate, "command", command)
  rows = ablate.parse_rows("grpo")
  runs = ablate.plan(ablate.config_loader(TINY, {}), rows, [0], str(tmp_path / "w"))
  old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  t0 = time.time()
  try:
    ablate.ablate(TINY, rows, [0], str(tmp_path / "w"), {}, stop_after=3.0)
    assert time.time() - t0 < 40   # stopped at the deadline, not slept out
    assert all(report.read_status(r) is None for r in runs)
    assert [os.path.exists(os.path.join(r.directory, "started")) for r in runs] == [
        r.name == "sft" for r in runs]
    os.remove(hold)
    ablate.ablate(TINY, rows, [0], str(tmp_path / "w"), {})
  finally:
    signal.signal(signal.SIGTERM, old[0])
    signal.signal(signal.SIGINT, old[1])
  assert all(report.read_status(r)["state"] == "finished" for r in runs)
  with pytest.raises(ValueError, match="stop_after"):
    ablate.ablate(TINY, rows, [0], str(tmp_path / "w"), {}, stop_after=-1)


def test_selection_takes_the_first_accepted_checkpoint_and_resumes(tmp_path, monkeypatch):
  """sft_band.select: candidates are measured in order until the band accepts one, whose
  policy is saved; each is logged as it is measured, so a rerun measures none again; none
  accepted is a refusal that names the range and the last failure."""
  # guess rate by checkpoint: only 1040 and 1060 are inside [0.12, 0.18]
  rates = {1000: 0.30, 1020: 0.25, 1040: 0.15, 1060: 0.13}
  measured, saved = [], []

  def measure_steps(cfg, band, steps):
    del cfg, band
    for s in steps:
      measured.append(s)
      yield s, {"guess_rate": rates[s]}, f"params@{s}"

  def save_policy(directory, step, params, source):
    del source
    saved.append((step, params))
    os.makedirs(os.path.join(directory, "checkpoints", str(step)))

  monkeypatch.setattr(sft_band, "measure_steps", measure_steps)
  monkeypatch.setattr(sft_band, "save_policy", save_policy)
  band = {"bounds": {"guess_rate": (0.12, 0.18)}, "select": {"first": 1000, "every": 20}}
  cfg = config_lib.from_config_dict(config_lib.default_config_dict())
  cfg = _with(cfg, steps=1060)
  verdict = sft_band.select(cfg, band, str(tmp_path))
  assert measured == [1000, 1020, 1040] and saved == [(1040, "params@1040")]
  assert verdict["accepted"] and verdict["selected_step"] == 1040 and not verdict["failures"]
  assert [c["step"] for c in verdict["candidates"]] == [1000, 1020, 1040]
  assert verdict["metrics"] == {"guess_rate": 0.15}
  # A rerun measures nothing again and keeps the selection.
  again = sft_band.select(cfg, band, str(tmp_path))
  assert measured == [1000, 1020, 1040] and again["selected_step"] == 1040
  # A rerun under another band judges the logged metrics again (measuring nothing).
  narrower = {**band, "bounds": {"guess_rate": (0.12, 0.14)}}
  (tmp_path / "checkpoints" / "1040").rmdir()
  again = sft_band.select(cfg, narrower, str(tmp_path))
  assert measured == [1000, 1020, 1040, 1060] and again["selected_step"] == 1060
  # No candidate inside: refused, with the range and the last checkpoint's failure.
  measured.clear()
  refused = sft_band.select(cfg, {**band, "bounds": {"guess_rate": (0.0, 0.1)}},
                            str(tmp_path / "none"))
  assert measured == [1000, 1020, 1040, 1060] and not refused["accepted"]
  assert refused["selected_step"] is None
  assert "1000..1060" in refused["failures"][0] and "guess_rate = 0.130" in (
      refused["failures"][0])


def _with(cfg, steps):
  import dataclasses  # pylint: disable=import-outside-toplevel
  return dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=steps),
                             model=dataclasses.replace(cfg.model, init_from="/sft"))


def test_stages_only_runs_the_stages_and_no_row_then_the_table_reuses_them(
    tmp_path, monkeypatch):
  """--stages_only (a pilot): every stage the rows start from, no row and no table; the
  table's command in the same workdir then runs only the rows."""
  _fake_runs(monkeypatch)
  rows = ablate.parse_rows("vapo,no_value_pretrain")
  ablate.ablate(TINY, rows, [0], str(tmp_path), {}, stages_only=True)
  runs = ablate.plan(ablate.config_loader(TINY, {}), rows, [0], str(tmp_path))
  assert {r.kind for r in runs if _ran(r)} == {"stage"}
  assert all(_ran(r) for r in runs if r.kind == "stage")
  assert not (tmp_path / "ablation.md").exists()
  stage_times = {r.directory: _ran(r) for r in runs if r.kind == "stage"}
  ablate.ablate(TINY, rows, [0], str(tmp_path), {})
  assert all(_ran(r) for r in runs if r.kind == "row")
  assert {d: _ran(by) for d, by in ((r.directory, r) for r in runs if r.kind == "stage")} == (
      stage_times)
  assert (tmp_path / "ablation.md").exists()
