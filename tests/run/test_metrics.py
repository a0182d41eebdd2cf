"""Metrics files: JSONL + TensorBoard, cut back on resume; the plot; the new config fields."""

import glob
import json
import os

import pytest

from vapo_jax import config as config_lib
from vapo_jax.run import metrics as metrics_lib
from vapo_jax.run import control as run_control


@pytest.mark.floor
def test_jsonl_and_tensorboard_and_truncate(tmp_path):
  w = metrics_lib.MetricsWriter(str(tmp_path))
  for step in (1, 2, 3):
    w.write("rl", step, {"reward/mean": step / 10, "value_loss": float("nan")})
  w.close()
  events = glob.glob(str(tmp_path / "tensorboard" / "rl" / "events.*"))
  assert events and os.path.getsize(events[0]) > 0
  with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
    f.write('{"stage": "rl", "step": 4, "rew')  # a line torn by a kill
  recs = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in recs] == [1, 2, 3] and recs[0]["value_loss"] == "nan"

  w = metrics_lib.MetricsWriter(str(tmp_path))   # a resumed run: checkpoint saw 2 records
  w.truncate(2, {"rl": 3})
  w.write("rl", 3, {"reward/mean": 0.5})
  w.close()
  recs = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [(r["step"], r["reward/mean"]) for r in recs] == [(1, 0.1), (2, 0.2), (3, 0.5)]


def test_no_workdir_writes_nothing(tmp_path):
  w = metrics_lib.MetricsWriter(None)
  w.write("rl", 1, {"x": 1.0})
  assert w.path is None and w.lines == 0


def test_plot_two_runs(tmp_path):
  pytest.importorskip("matplotlib")
  from vapo_jax.run import plotting  # pylint: disable=import-outside-toplevel
  for name, scale in (("a", 1.0), ("b", 2.0)):
    w = metrics_lib.MetricsWriter(str(tmp_path / name), tensorboard=False)
    for step in range(1, 6):
      w.write("rl", step, {"reward/mean": scale * step, "entropy": 1 / step,
                           "clip_frac_low": 0.0, "clip_frac_high": 0.01})
    w.write("eval", 5, {"avg@4": 0.5 * scale / 2, "pass@4": 0.9})
  out = plotting.plot_runs([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "c.png"))
  assert os.path.getsize(out) > 10_000
  assert set(plotting.series(metrics_lib.read_jsonl(str(tmp_path / "a" / "metrics.jsonl")),
                             "eval", "avg@")) == {"avg@4"}


@pytest.mark.parametrize("field,value,message", [
    ("checkpoint.keep", 0, "config.checkpoint.keep=0: must be >= 1"),
    ("checkpoint.every", -1, "config.checkpoint.every=-1: must be >= 0"),
    ("faults.max_consecutive_nonfinite", 0, "config.faults.max_consecutive_nonfinite=0"),
])
def test_new_config_fields_are_checked(field, value, message):
  c = config_lib.default_config_dict()
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(config_lib.ConfigError, match=message.replace(".", r"\.")):
    config_lib.from_config_dict(c)


def test_stage_order_and_nonfinite_counter():
  c = config_lib.default_config_dict()
  c.sft.update(enabled=True, steps=1)
  cfg = config_lib.from_config_dict(c)
  assert run_control.stages_of(cfg) == ["sft", "value_pretrain", "rl", "done"]
  c.rl.advantage_estimator = "group"
  c.value_pretrain.enabled, c.sft.enabled = False, False
  assert run_control.stages_of(config_lib.from_config_dict(c)) == ["rl", "done"]
  ctl = run_control.RunControl(max_in_a_row=3)
  assert ctl.count_skipped([True, True, False], "x")["nonfinite/skipped_total"] == 2
  ctl.count_skipped([True, True], "x")
  with pytest.raises(run_control.NonFiniteError, match="3 updates in a row"):
    ctl.count_skipped([True], "rl step 9")
  assert json.loads(json.dumps(ctl.state()))["skipped_total"] == 5


@pytest.mark.floor
def test_wandb_offline_run_holds_the_metrics(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  import wandb_files  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  w = metrics_lib.MetricsWriter(str(tmp_path), tensorboard=False,
                                wandb={"project": "proj", "name": "tiny-1",
                                       "config": {"rl": {"steps": 3}}})
  for step in (1, 2, 3):
    w.write("rl", step, {"reward/mean": step / 10, "done": True, "note": "x"})
  w.write("eval", 3, {"avg@4": 0.5})
  w.close()
  run = wandb_files.offline_run(str(tmp_path))
  assert (run["project"], run["name"]) == ("proj", "tiny-1")
  rl = [(h["rl/step"], h["rl/reward/mean"]) for h in run["history"] if "rl/step" in h]
  assert rl == [(1, 0.1), (2, 0.2), (3, 0.3)]
  assert [(h["eval/step"], h["eval/avg@4"]) for h in run["history"] if "eval/step" in h] == [
      (3, 0.5)]
  assert not any("rl/done" in h or "rl/note" in h for h in run["history"])  # numbers only
  assert (tmp_path / "wandb_id").read_text().strip() in str(list(tmp_path.glob("wandb/*")))


def test_wandb_missing_is_one_line(tmp_path, monkeypatch):
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel
  monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # `import wandb` fails
  with pytest.raises(ImportError) as e:
    metrics_lib.MetricsWriter(str(tmp_path), wandb={"project": "p"})
  line = cli.user_error(e.value)
  assert line == ("metrics.wandb=True needs the wandb package: pip install wandb "
                  "(or set --config.metrics.wandb=False)")
  metrics_lib.MetricsWriter(str(tmp_path / "off"), tensorboard=False).close()  # off: no import


def test_wandb_config_fields():
  c = config_lib.default_config_dict()
  cfg = config_lib.from_config_dict(c)
  assert (cfg.metrics.wandb, cfg.metrics.wandb_project) == (False, "vapo_jax")
  c.metrics.update(wandb=True, wandb_project=" ")
  with pytest.raises(config_lib.ConfigError, match=r"config\.metrics\.wandb_project=' '"):
    config_lib.from_config_dict(c)
  c.metrics.wandb_project, c.metrics.wandb_name = "p", "run-a"
  assert config_lib.to_dict(config_lib.from_config_dict(c))["metrics"]["wandb_name"] == "run-a"
