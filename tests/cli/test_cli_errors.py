"""The commands' answer to a user's mistake: `error: <one line>` on stderr, exit status 2.

Each case runs the real command as a subprocess, as a user's shell would: JAX_PLATFORMS is
not set, so these runs also check that a CPU start prints nothing from libtpu (the `tpu`
extra is installed here for the compile check).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBTPU_LINES = ("host bounds", "TPU worker hostname", "unexpected worker hostname", "libtpu",
                "TPU backend")


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  env.update(extra)
  return env


def _run(module, *args, **env):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=_env(**env))


def _one_line_error(out) -> str:
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
  return lines[0]


def test_unknown_config_field_keeps_the_suggestion():
  line = _one_line_error(_run("vapo_jax.main", "--config=configs/tiny.py",
                              "--config.rl.stepz=3"))
  assert line == ('error: unknown config field in --config.rl.stepz=3: Did you mean "steps" '
                  'instead of "stepz"?'), line


def test_invalid_config_value():
  line = _one_line_error(_run("vapo_jax.main", "--config=configs/tiny.py",
                              "--config.rl.eps_high=-1"))
  assert line == "error: Invalid config: config.rl.eps_high=-1.0: must be >= 0", line


def test_missing_config_file():
  line = _one_line_error(_run("vapo_jax.main", "--config=configs/nope.py"))
  assert line == ("error: cannot load the --config file: [Errno 2] No such file or directory: "
                  "'configs/nope.py'"), line


def test_missing_checkpoint_directory_and_no_libtpu_lines(tmp_path):
  out = _run("vapo_jax.main", "--config=configs/tiny.py", f"--workdir={tmp_path / 'w'}",
             "--noprogress", "--config.model.hf_path=/no/such/ckpt")
  line = _one_line_error(out)  # after JAX started its backend: nothing else was printed
  assert "/no/such/ckpt does not exist" in line, line


def test_unknown_hub_id_offline(tmp_path):
  out = _run("vapo_jax.main", "--config=configs/tiny.py", "--noprogress",
             "--config.model.hf_path=nobody/no-such-model", HF_HUB_OFFLINE="1",
             HF_HUB_CACHE=str(tmp_path / "empty_cache"))
  line = _one_line_error(out)
  assert "nobody/no-such-model" in line and "HF_HUB_OFFLINE=1" in line, line


def test_data_that_does_not_match_its_layout_names_file_and_line(tmp_path):
  data = tmp_path / "train.jsonl"
  data.write_text('{"question": "1+1?", "answer": "#### 2"}\n'
                  '{"question": "2+2?", "solution": "4"}\n')
  out = _run("vapo_jax.main", "--config=configs/tiny.py", "--noprogress",
             "--config.data.source=jsonl", f"--config.data.train_path={data}",
             "--config.data.layout=gsm8k")
  line = _one_line_error(out)
  assert line == f"error: {data}:2: missing field 'answer'", line


def test_traceback_flag_shows_the_traceback(tmp_path):
  out = _run("vapo_jax.main", "--config=configs/tiny.py", "--noprogress", "--traceback",
             "--config.model.hf_path=/no/such/ckpt")
  assert out.returncode not in (0, 2) and "Traceback (most recent call last)" in out.stderr
  assert "/no/such/ckpt does not exist" in out.stderr


@pytest.mark.parametrize("tool", ["vapo_jax.tools.evaluate", "vapo_jax.tools.export"])
def test_tools_answer_the_same_way(tool, tmp_path):
  out = _run(tool, "--config=configs/tiny.py", f"--workdir={tmp_path}", f"--out={tmp_path}/o",
             "--config.sft.enabledd=False")
  line = _one_line_error(out)
  assert line == ("error: unknown config field in --config.sft.enabledd=False: Did you mean "
                  '"enabled" instead of "enabledd"?'), line


def test_a_cpu_run_prints_nothing_from_libtpu(tmp_path):
  """The evaluate tool on the tiny config's fresh model, end to end, JAX_PLATFORMS unset."""
  out = _run("vapo_jax.tools.evaluate", "--config=configs/tiny.py",
             "--config.eval.num_examples=2", "--config.eval.batch_prompts=2",
             "--config.eval.samples_per_problem=1", "--config.sampling.max_new_tokens=4",
             "--config.data.num_train=32", "--config.data.num_eval=2")
  assert out.returncode == 0, out.stderr[-3000:]
  bad = [l for l in out.stderr.splitlines() if any(s in l for s in LIBTPU_LINES)]
  assert not bad, out.stderr[-3000:]


HELD_BY_THE_ERROR = """
import sys
from vapo_jax import cli

class Held:  # stands for a `datasets` Arrow table in the frame that raised
  def __del__(self):
    sys.stderr.write("freed\\n")
    sys.stderr.flush()

def main(argv):
  held = Held()
  raise FileNotFoundError(2, "No such file or directory", "/no/such/rows.jsonl")

cli.run(main)
"""


def test_what_the_failing_frame_held_is_freed_before_the_exit(tmp_path):
  """A user error's frames are freed before `error:` is printed and the process exits, not
  in interpreter teardown, where an Arrow table's threads can abort it (SIGABRT, not 2)."""
  out = subprocess.run([sys.executable, "-c", HELD_BY_THE_ERROR], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=_env())
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  assert out.stderr.strip().splitlines() == [
      "freed", "error: No such file or directory: /no/such/rows.jsonl"], out.stderr[-3000:]
