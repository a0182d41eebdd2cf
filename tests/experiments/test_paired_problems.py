"""The ablation's problem-paired comparison (`experiments.ablation.paired_problems`): rows and
their starts read from the runs' per-problem records, against hand-computed means and an
independent bootstrap of the same design."""

import numpy as np
import pytest

from experiments.ablation import paired_problems as pp
from vapo_jax.data import sources
from vapo_jax.run import eval_records

N, K = 40, 4


def _examples(seed=None):
  """N problems; with a seed, problems of that seed's own (uids p<seed>/<i>, other texts), as
  a held-out split drawn per seed is."""
  tag, extra = ("", 0) if seed is None else (f"{seed}/", 100 * (seed + 1))
  return [sources.Example(problem=f"Ana has {i + 2 + extra} cards. She buys 3 more cards. "
                          "How many?", answer=str(i + 5 + extra),
                          solution=f"{i + 2 + extra} + 3 = {i + 5 + extra}",
                          uid=f"p{tag}{i}") for i in range(N)]


def _write(directory, step, correct_NxK, seed=None):
  eval_records.write(eval_records.run_path(str(directory), step),
                     eval_records.build(_examples(seed), correct_Nxk=correct_NxK,
                                        greedy_N=correct_NxK[:, 0]))


def _runs(tmp_path, rng, rows=(("vapo", 0.55), ("grpo", 0.35)), seeds=(0, 1, 2),
          final=20, own_problems=False):
  """Run records as ablation_report makes them; every seed starts at 0.2 correct; with
  own_problems each seed is evaluated on problems of its own."""
  records, truth = [], {}
  difficulty = rng.uniform(0, 1, N)          # shared by every row: what pairing cancels
  for name, level in rows:
    for s in seeds:
      d = tmp_path / f"seed{s}" / name
      start = (rng.uniform(0, 1, (N, K)) < 0.2 * difficulty[:, None] * 2).astype(int)
      end = (rng.uniform(0, 1, (N, K)) < level * difficulty[:, None] * 2).astype(int)
      _write(d, 0, start, s if own_problems else None)
      _write(d, final, end, s if own_problems else None)
      truth[(name, s)] = (start, end)
      records.append({"kind": "run", "row": name, "seed": s, "directory": str(d),
                      "state": "finished"})
  return records, truth


def test_gain_and_difference_equal_the_hand_means(tmp_path):
  records, truth = _runs(tmp_path, np.random.default_rng(0))
  out = {r["row"]: r for r in pp.paired(records, ["vapo", "grpo"], num_samples=2000)}
  for name in ("vapo", "grpo"):
    start = np.mean([truth[(name, s)][0].mean() for s in range(3)])
    end = np.mean([truth[(name, s)][1].mean() for s in range(3)])
    assert out[name]["gain"]["avg"]["estimate"] == pytest.approx(end - start)
    assert out[name]["final_step"] == 20 and out[name]["seeds"] == [0, 1, 2]
  vapo = np.mean([truth[("vapo", s)][1].mean() for s in range(3)])
  grpo = np.mean([truth[("grpo", s)][1].mean() for s in range(3)])
  diff = out["grpo"]["vapo_minus_row"]["avg"]
  assert diff["estimate"] == pytest.approx(vapo - grpo)      # the sign: VAPO − row
  assert diff["lo"] < vapo - grpo < diff["hi"]
  assert "vapo_minus_row" not in out["vapo"]
  text = pp.markdown(list(out.values()))
  assert "| grpo | 20 | 3 |" in text and f"{100 * (vapo - grpo):+.1f}" in text


def test_the_interval_is_the_paired_one(tmp_path):
  """An independent bootstrap of the documented design (problems once for both rows, seeds
  per row) gives the same spread; an unpaired one (problems drawn per row) is wider, so a
  mutant that unpaired the rows would fail the first check."""
  rng = np.random.default_rng(1)
  records, truth = _runs(tmp_path, rng)
  got = pp.paired(records, ["vapo", "grpo"], num_samples=4000)[1]["vapo_minus_row"]["avg"]
  a = np.stack([truth[("vapo", s)][1].mean(1) for s in range(3)])   # [seeds, problems]
  b = np.stack([truth[("grpo", s)][1].mean(1) for s in range(3)])
  r = np.random.default_rng(7)

  def rep(paired):
    i = r.integers(0, N, N)
    j = i if paired else r.integers(0, N, N)
    sa, sb = r.integers(0, 3, 3), r.integers(0, 3, 3)
    return a[sa][:, i].mean() - b[sb][:, j].mean()

  se_paired = np.std([rep(True) for _ in range(4000)])
  se_unpaired = np.std([rep(False) for _ in range(4000)])
  assert got["se"] == pytest.approx(se_paired, rel=0.1)
  assert se_unpaired > 1.3 * se_paired


def test_a_row_without_records_at_the_shared_final_step_is_named_not_compared(tmp_path):
  records, _ = _runs(tmp_path, np.random.default_rng(2))
  (tmp_path / "seed1" / "grpo" / "eval" / "rl_step_20.jsonl").unlink()
  out = {r["row"]: r for r in pp.paired(records, ["vapo", "grpo"], num_samples=200)}
  assert "gain" not in out["grpo"] and "shared final step" in out["grpo"]["note"]
  assert "gain" in out["vapo"]
  records.append({"kind": "run", "row": "ppo", "seed": 0, "directory": str(tmp_path / "x"),
                  "state": "crashed"})
  out = {r["row"]: r for r in pp.paired(records, ["vapo", "ppo"], num_samples=200)}
  assert out["ppo"]["note"] == "no finished seed"


def test_seeds_with_problems_of_their_own_pair_seed_by_seed_on_the_seeds_both_finished(
    tmp_path):
  """The registered runs' layout (the synthetic held-out split is drawn per seed): the gain
  and VAPO − row still equal the hand means, seed s of each row on seed s's problems; while a
  row's seed is unfinished, VAPO − row uses the seeds both rows finished and says so."""
  records, truth = _runs(tmp_path, np.random.default_rng(3), own_problems=True)
  out = {r["row"]: r for r in pp.paired(records, ["vapo", "grpo"], num_samples=1000)}
  vapo = np.mean([truth[("vapo", s)][1].mean() for s in range(3)])
  grpo = np.mean([truth[("grpo", s)][1].mean() for s in range(3)])
  assert out["grpo"]["vapo_minus_row"]["avg"]["estimate"] == pytest.approx(vapo - grpo)
  assert out["grpo"]["base_seeds"] == [0, 1, 2] and "note" not in out["grpo"]
  start = np.mean([truth[("vapo", s)][0].mean() for s in range(3)])
  assert out["vapo"]["gain"]["avg"]["estimate"] == pytest.approx(vapo - start)
  # GRPO's seeds 1 and 2 still running: VAPO − GRPO on seed 0 alone.
  for r in records:
    if r["row"] == "grpo" and r["seed"] > 0:
      r["state"] = "running"
  out = {r["row"]: r for r in pp.paired(records, ["vapo", "grpo"], num_samples=1000)}
  want = truth[("vapo", 0)][1].mean() - truth[("grpo", 0)][1].mean()
  assert out["grpo"]["vapo_minus_row"]["avg"]["estimate"] == pytest.approx(want)
  assert out["grpo"]["base_seeds"] == [0] and "seeds both finished: [0]" in out["grpo"]["note"]
  assert out["vapo"]["seeds"] == [0, 1, 2]
