"""Exposed and overlapped collectives of a compiled HLO text, by kind and group size.

Run: PYTHONPATH=. python benchmarks/results/train-hlo-2026-12-06-head/hlo_kinds.py FILE.hlo
(loops are walked once, not times their trip counts; the toys have none)."""
import collections
import sys

from vapo_jax.pod import hlo_stats
from vapo_jax.pod import train_hlo as th


def kinds(text: str) -> dict:
  comps = hlo_stats.parse(text)
  out = collections.defaultdict(lambda: [0, 0.0])

  def walk(name, depth=0):
    instrs = list(comps.get(name, {}).values())
    for i, ins in enumerate(instrs):
      k = hlo_stats._kind(ins.op)  # pylint: disable=protected-access
      if k:
        group = th.group_size(ins.attrs)
        wire = th.wire_bytes(k, th._result_bytes(ins), group)  # pylint: disable=protected-access
        seen = "overlapped" if th._overlapped(instrs, i) else "exposed"  # pylint: disable=protected-access
        out[(k, seen, group)][0] += 1
        out[(k, seen, group)][1] += wire / 1e9
      if depth < 20:
        for c in hlo_stats._called(ins):  # pylint: disable=protected-access
          walk(c, depth + 1)
  walk(hlo_stats.entry_name(comps, text))
  return dict(out)


if __name__ == "__main__":
  with open(sys.argv[1], encoding="utf-8") as f:
    for (kind, seen, group), (n, gb) in sorted(kinds(f.read()).items()):
      print(f"{kind:20s} {seen:10s} group {group:3d}: {n:4d} collectives, {gb:.3f} GB sent")
