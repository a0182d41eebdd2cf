"""data.source="hf": datasets by name with `datasets`, offline, through the existing layouts.

A dataset repo of parquet files (a README with two configs, as openai/gsm8k has) is put into a
Hub cache built on disk, in two commits (tag `bad` has a bad test row). The id resolves to its
cached snapshot and `datasets` reads it, with HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 in a
subprocess (both are read at import), so nothing can reach the network.
"""

import hashlib
import json
import os
import subprocess
import sys

import pytest

datasets = pytest.importorskip("datasets")
pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

from vapo_jax import data as data_lib  # noqa: E402
import hub_cache  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = "tiny-org/gsm8k-mini"
README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
---
# gsm8k-mini
"""
TRAIN = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"}
         for a in range(1, 6)]
TEST = [{"question": "What is 7 * 6?", "answer": "7 * 6 = 42\n#### 42"},
        {"question": "What is 9 - 4?", "answer": "Nine minus four.\n#### 5"}]
BAD_TEST = [TEST[0], {"question": "What is 9 - 4?", "answer": "five, no marker"}]


def _parquet(rows) -> bytes:
  sink = pa.BufferOutputStream()
  pq.write_table(pa.Table.from_pylist(rows), sink)
  return sink.getvalue().to_pybytes()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  root = tmp_path_factory.mktemp("hfdata")
  for commit, test_rows, refs in ((hashlib.sha1(b"bad").hexdigest(), BAD_TEST, ("bad",)),
                                  (hashlib.sha1(b"good").hexdigest(), TEST, ("main",))):
    hub_cache.add_snapshot(root / "hub", REPO, {
        "README.md": README.encode(),
        "main/train-00000-of-00001.parquet": _parquet(TRAIN),
        "main/test-00000-of-00001.parquet": _parquet(test_rows),
        "socratic/train-00000-of-00001.parquet": _parquet(TRAIN[:2]),
    }, commit, refs=refs, repo_type="dataset")
  return root


def _env(cache_root, **extra):
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HUB_CACHE=str(cache_root / "hub"),
             HF_DATASETS_CACHE=str(cache_root / "datasets"), **extra)
  return env


def _load(cache_root, name, split, config):
  code = ("import json, sys; from vapo_jax import data; "
          "ex = data.load_hf(sys.argv[1], sys.argv[2], config=sys.argv[3] or None, "
          "layout='gsm8k'); print(json.dumps([[e.problem, e.answer, e.solution, e.uid] "
          "for e in ex]))")
  out = subprocess.run([sys.executable, "-c", code, name, split, config or ""], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=_env(cache_root))
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_hub_dataset_loads_offline_by_name_config_and_split(cache):
  test = _load(cache, REPO, "test", "main")
  assert [t[:3] for t in test] == [["What is 7 * 6?", "42", "7 * 6 = 42"],
                                   ["What is 9 - 4?", "5", "Nine minus four."]]
  assert test[1][3] == f"hf:{REPO}/main split 'test' row 2"
  assert len(_load(cache, REPO, "train", "main")) == 5
  assert len(_load(cache, REPO, "train", "socratic")) == 2   # the config name is honoured


def test_a_bad_row_stops_the_run_naming_dataset_split_and_row(cache, tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "vapo_jax.main", "--config=configs/tiny.py", "--noprogress",
       "--config.data.source=hf", f"--config.data.train_path={REPO}",
       f"--config.data.eval_path={REPO}@bad", "--config.data.hf_config=main",
       "--config.data.layout=gsm8k", f"--workdir={tmp_path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, env=_env(cache))
  assert out.returncode == 2, out.stderr[-3000:]
  # (before it, `datasets` may show its "Generating ... split" progress bars)
  assert out.stderr.strip().splitlines()[-1] == (
      f"error: hf:{REPO}@bad/main split 'test' row 2: field 'answer' has no '#### answer'"
  ), out.stderr[-3000:]
  assert "Traceback" not in out.stderr


def test_save_to_disk_directories_and_their_errors(tmp_path):
  path = str(tmp_path / "saved")
  datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN),
                        "test": datasets.Dataset.from_list(BAD_TEST)}).save_to_disk(path)
  train = data_lib.load_hf(path, "train", layout="gsm8k")
  assert [(e.problem, e.answer) for e in train][:2] == [("What is 1 + 1?", "2"),
                                                       ("What is 2 + 2?", "4")]
  with pytest.raises(data_lib.DataError, match=r"split 'test' row 2: field 'answer' has no"):
    data_lib.load_hf(path, "test", layout="gsm8k")
  with pytest.raises(data_lib.DataError, match=r"no split 'validation'; it has \['test', "):
    data_lib.load_hf(path, "validation", layout="gsm8k")
