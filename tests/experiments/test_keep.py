"""experiments.real_model.keep: finished runs' files out of a workdir and back, so that the
ablation command counts them as done on another machine; unfinished runs are not kept."""

import json
import os
import types

from experiments.ablation import ablation_report as report
from experiments.real_model import keep


def _run(workdir, rel, state, evals=(0, 20)):
  d = os.path.join(workdir, rel)
  os.makedirs(os.path.join(d, "eval"), exist_ok=True)
  with open(os.path.join(d, keep.STATUS), "w", encoding="utf-8") as f:
    json.dump({"state": state, "wall_s": 12.0}, f)
  with open(os.path.join(d, "metrics.jsonl"), "w", encoding="utf-8") as f:
    for s in evals:
      f.write(json.dumps({"stage": "eval", "step": s, "avg@4": 0.1 + s / 100}) + "\n")
  for s in evals:
    with open(os.path.join(d, "eval", f"rl_step_{s}.jsonl"), "w", encoding="utf-8") as f:
      f.write(json.dumps({"uid": "p0", "correct": [1, 0, 0, 0]}) + "\n")
  with open(os.path.join(d, "log.txt"), "w", encoding="utf-8") as f:
    f.writelines(f"line {i}\n" for i in range(keep.LOG_TAIL + 50))
  os.makedirs(os.path.join(d, "checkpoints", "5"), exist_ok=True)   # never kept


def test_save_then_restore_gives_the_ablation_the_same_finished_runs(tmp_path):
  w, kept, fresh = str(tmp_path / "w"), str(tmp_path / "kept"), str(tmp_path / "fresh")
  _run(w, "seed0/vapo", "finished")
  _run(w, "seed0/grpo", "finished")
  _run(w, "seed1/vapo", "running")
  (tmp_path / "w" / "ablation.md").write_text("# table\n")
  assert keep.save(w, kept) == ["seed0/grpo", "seed0/vapo"]
  assert not os.path.exists(os.path.join(kept, "runs", "seed1"))
  assert not os.path.exists(os.path.join(kept, "runs", "seed0", "vapo", "checkpoints"))
  with open(os.path.join(kept, "runs", "seed0", "vapo", "log.txt"), encoding="utf-8") as f:
    assert len(f.readlines()) == keep.LOG_TAIL
  assert os.path.exists(os.path.join(kept, "ablation.md"))
  assert keep.restore(kept, fresh) == ["seed0/grpo", "seed0/vapo"]
  assert keep.restore(kept, fresh) == []                      # already there: left alone
  for rel in ("seed0/vapo", "seed0/grpo"):
    run = types.SimpleNamespace(name=rel.split("/")[1], seed=0, kind="row",
                                directory=os.path.join(fresh, rel))
    orig = types.SimpleNamespace(**{**vars(run), "directory": os.path.join(w, rel)})
    a, b = (report.run_record(r, report.read_status(r)) for r in (run, orig))
    assert a["state"] == "finished" and a["avg"] == b["avg"] == 0.1 + 20 / 100
    assert sorted(os.listdir(os.path.join(fresh, rel, "eval"))) == ["rl_step_0.jsonl",
                                                                      "rl_step_20.jsonl"]


def test_the_command_line(tmp_path, capsys):
  w = str(tmp_path / "w")
  _run(w, "seed0/vapo", "finished")
  assert keep.main(["save", w, str(tmp_path / "k")]) == 0
  assert "1 finished run(s)" in capsys.readouterr().out
  assert keep.main(["restore", str(tmp_path / "missing"), w]) == 1
  assert keep.main(["bogus"]) == 2


def test_save_before_any_run_finished_keeps_the_reports(tmp_path):
  work, folder = tmp_path / "w", tmp_path / "new" / "kept"
  (work / "seed0" / "vapo").mkdir(parents=True)
  (work / "seed0" / "vapo" / keep.STATUS).write_text('{"state": "interrupted"}')
  (work / "ablation.md").write_text("# table\n")
  assert keep.save(str(work), str(folder)) == []
  assert (folder / "ablation.md").read_text() == "# table\n"
  assert not (folder / "runs").exists()
