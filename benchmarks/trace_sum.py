"""Thread-seconds of a jax.profiler trace by event name, largest first.

  python benchmarks/trace_sum.py --trace_dir=DIR [--top=30]

DIR is what `jax.profiler.start_trace(DIR)` wrote; the newest
`DIR/plugins/profile/*/*.trace.json.gz` is read. Complete events (`"ph": "X"`) are summed by
name, with a trailing number dropped (`fusion.12` and `fusion.3` count as `fusion`). On
XLA:CPU a thunk appears under its fusion's kind (e.g. `ynn_fusion`: XNNPACK dots;
`dynamic-update-slice` fusions: writes into stacked buffers). Enclosing events
(`ThunkExecutor::Execute`, `while`, `cond`) hold their children's time too, so the column
does not add up to the wall time. Each line: seconds, calls, name (cut at 90 characters).
"""

import collections
import glob
import gzip
import json
import os
import re


def newest_trace(trace_dir: str) -> str:
  """The newest trace file under a profiler output folder."""
  paths = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz"))
  if not paths:
    raise FileNotFoundError(f"no plugins/profile/*/*.trace.json.gz under {trace_dir}")
  return max(paths, key=os.path.getmtime)


def summarize(events, top: int = 30) -> list[tuple[str, float, int]]:
  """(name, seconds, calls) of the complete events, by name without a trailing number,
  the `top` largest by seconds (event durations are in microseconds)."""
  seconds, calls = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X":
      name = re.sub(r"[.\d]+$", "", e["name"])
      seconds[name] += e.get("dur", 0) / 1e6
      calls[name] += 1
  return [(name, s, calls[name]) for name, s in seconds.most_common(top)]


def lines(rows) -> list[str]:
  return [f"{s:8.3f} s {n:6d}  {name[:90]}" for name, s, n in rows]


def main(argv) -> None:
  del argv
  with gzip.open(newest_trace(_DIR.value), "rt", encoding="utf-8") as f:
    events = json.load(f)["traceEvents"]
  print("\n".join(lines(summarize(events, _TOP.value))))


if __name__ == "__main__":
  from absl import app
  from absl import flags
  _DIR = flags.DEFINE_string("trace_dir", None, "The folder jax.profiler.start_trace wrote.",
                             required=True)
  _TOP = flags.DEFINE_integer("top", 30, "How many names to print.")
  app.run(main)
