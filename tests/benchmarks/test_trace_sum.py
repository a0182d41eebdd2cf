"""benchmarks/trace_sum.py: a profiler trace summed by event name, on a hand-made trace, and
the command run on it."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from benchmarks import trace_sum

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVENTS = [
    {"ph": "X", "name": "ynn_fusion.12", "dur": 2_000_000},
    {"ph": "X", "name": "ynn_fusion.3", "dur": 1_500_000},
    {"ph": "X", "name": "while", "dur": 4_000_000},
    {"ph": "X", "name": "copy.1", "dur": 250_000},
    {"ph": "M", "name": "thread_name"},          # metadata: not counted
]


def test_events_are_summed_by_name_without_their_number():
  assert trace_sum.summarize(EVENTS) == [("while", 4.0, 1), ("ynn_fusion", 3.5, 2),
                                         ("copy", 0.25, 1)]
  assert trace_sum.summarize(EVENTS, top=1) == [("while", 4.0, 1)]
  assert trace_sum.lines([("copy", 0.25, 1)]) == ["   0.250 s      1  copy"]


def test_no_trace_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError):
    trace_sum.newest_trace(str(tmp_path))


def test_the_command_reads_a_profiler_folder(tmp_path):
  run = tmp_path / "plugins" / "profile" / "2026_12_07_10_00_00"
  run.mkdir(parents=True)
  with gzip.open(run / "host.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": EVENTS}, f)
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "trace_sum.py"),
                        f"--trace_dir={tmp_path}", "--top=2"],
                       capture_output=True, text=True, check=True, cwd=REPO).stdout
  assert out.splitlines() == ["   4.000 s      1  while", "   3.500 s      2  ynn_fusion"]
