"""The pod tools' old command names (`python -m vapo_jax.tools.step_model`, …) still run the
moved modules for one release, after a one-line notice on stderr naming the new one."""

import importlib.util
import os
import subprocess
import sys

from vapo_jax.tools import moved

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_old_name_is_a_shim_of_an_existing_module():
  for old, new in moved.COMMANDS.items():
    assert importlib.util.find_spec(new) is not None, new
    path = os.path.join(ROOT, *old.split(".")) + ".py"
    text = open(path, encoding="utf-8").read()
    assert f'moved.run("{old}")' in text and 'if __name__ == "__main__":' in text, path


def test_run_prints_one_line_then_runs_the_new_module(monkeypatch, capsys):
  calls = []
  monkeypatch.setattr(moved.runpy, "run_module", lambda *a, **k: calls.append((a, k)))
  moved.run("vapo_jax.tools.step_model")
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "vapo_jax.pod.step_model" in err
  assert calls == [(("vapo_jax.pod.step_model",), {"run_name": "__main__", "alter_sys": True})]


def test_the_old_command_runs_the_new_one():
  # No --config: the new module's own error, after the notice (no compile, ~1 s).
  out = subprocess.run([sys.executable, "-m", "vapo_jax.tools.step_model"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode != 0
  first = out.stderr.splitlines()[0]
  assert "has moved to vapo_jax.pod.step_model" in first
  assert "--config=configs/<experiment>.py is needed" in out.stderr
  assert "vapo_jax/pod/step_model.py" in out.stderr   # the traceback is the new module's
