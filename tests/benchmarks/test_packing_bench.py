"""Smoke test of benchmarks/packing_bench.py: it runs, and both sides do the same math."""

import pytest

from benchmarks import packing_bench
from benchmarks import packing_rows


def test_packing_bench_runs_and_the_first_update_matches(tmp_path, capsys):
  out = tmp_path / "bench.json"
  res = packing_bench.main(["--mix=longtail", "--rows=8", "--layers=1", "--median=8",
                            "--rounds=1", "--vocab=32", f"--json={out}"],
                           load=packing_bench.quiet.Load(settle_s=0))
  assert out.exists()
  r = res["longtail"]
  first = r["first_update"]
  for key in ("policy_loss", "policy_grad_norm", "value_loss", "critic_grad_norm"):
    assert first["packed"][key] == pytest.approx(first["padded"][key], rel=1e-5), key
  assert len(r["ratios"]["packed/padded"]["per_round"]) == 1
  assert r["efficiency"]["padded"] < 1.0
  assert "packed vs padded" in capsys.readouterr().out


def test_packing_rows_prints_each_row_length(capsys):
  packing_rows.main(["--config=configs/tiny.py", "--lengths=uniform:2,20",
                     "--prompt_lengths=uniform:4,20", "--row_factors=1,2"])
  out = capsys.readouterr().out
  lines = [line for line in out.splitlines() if "packed " in line]
  assert len(lines) == 2 and "padded" in out
  # Sequences of <= 40 tokens fill rows of 80 and 160 far better than one per padded row
  # (0.29). The rows per micro-batch are fixed (one compiled shape), so the last micro-batch
  # is part empty. An update holds the default budget's 1/16 share of its mini-batch's
  # tokens (v5p-8's 4 shards: 8 rows of 80, 4 of 160): 0.92 of their slots are real. A
  # forward pass holds a quarter of the pass (packing.FORWARD_SHARE: 64 rows of 80, 32 of
  # 160): ~74 rows of real tokens take two micro-batches of 64, 0.58 real, fewer and larger
  # calls for more padding.
  cols = [line.split() for line in lines]
  forward, steps = [float(c[-4]) for c in cols], [float(c[-3]) for c in cols]
  assert min(steps) > 0.85, out
  assert all(0.5 < f < min(steps) for f in forward), out
  assert cols[0][3:5] == ["[64,", "2,"], out  # the forward's [n, K, T]: 64 rows, 2 calls


def test_head_positions_count_the_chunks_past_each_micro_batch(capsys):
  """--head: positions per chunk size from the plans' own head tables; smaller chunks run
  fewer positions past the response tokens, never fewer than them."""
  from benchmarks import packing_fixed_n  # pylint: disable=import-outside-toplevel
  rows = packing_fixed_n.measure_head(5, 256, 512, [128, 32])
  for r in rows:
    assert 1.0 <= r["ratios"][32] < r["ratios"][128] < 2.0
  packing_fixed_n.main(["--head", "--batches=2", "--chunks=64"])
  assert "chunk 64" in capsys.readouterr().out


def test_head_chunk_bench_runs(capsys):
  from benchmarks import head_chunk  # pylint: disable=import-outside-toplevel
  head_chunk.main(["--chunks=32,16", "--counts=20", "--rounds=1", "--slots=64", "--dim=8",
                   "--vocab=64"])
  out = capsys.readouterr().out
  assert "| 20 |" in out and "(32)" in out and "(32)" in out.split("|")[-2]
