"""Thread-seconds of a jax.profiler trace by event name (numeric suffixes dropped), largest
first: python trace_sum.py DIR [N]. XLA:CPU's thunks appear by their fusion's kind (e.g.
`ynn_fusion`: XNNPACK dots; `dynamic-update-slice` fusions: writes into stacked buffers);
enclosing events (`ThunkExecutor::Execute`, `while`, `cond`) also hold their children."""
import collections
import glob
import gzip
import json
import re
import sys

path = glob.glob(f"{sys.argv[1]}/plugins/profile/*/*.trace.json.gz")[-1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
seconds, calls = collections.Counter(), collections.Counter()
for e in json.load(gzip.open(path))["traceEvents"]:
  if e.get("ph") == "X":
    name = re.sub(r"[.\d]+$", "", e["name"])
    seconds[name] += e["dur"] / 1e6
    calls[name] += 1
for name, s in seconds.most_common(top):
  print(f"{s:8.3f} s {calls[name]:6d}  {name[:90]}")
