"""Data sources, layouts, bad rows, templates and the length filter."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vapo_jax import data
from vapo_jax import rewards


def _write_jsonl(path, rows, raw_lines=()):
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
    for line in raw_lines:
      f.write(line + "\n")
  return path


DAPO_ROWS = [{
    "data_source": "math_dapo",
    "prompt": [{"content": f"Solve {i}+1.", "role": "user"}],
    "ability": "MATH",
    "reward_model": {"ground_truth": str(i + 1), "style": "rule-lang"},
    "extra_info": {"index": f"id-{i}"},
} for i in range(5)]

MATH_ROWS = [{"problem": "What is $\\frac{1}{2}+\\frac{1}{2}$?", "level": "Level 1",
              "type": "Algebra",
              "solution": "Add them: $\\boxed{1}$."}]
GSM8K_ROWS = [{"question": "Tom has 3 apples and buys 4. How many?",
               "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}]
AIME_ROWS = [{"ID": "2024-I-1", "Problem": "Find N.", "Solution": "...",
              "Answer": 204}]


def test_layouts_jsonl(tmp_path):
  dapo = data.load_jsonl(_write_jsonl(tmp_path / "d.jsonl", DAPO_ROWS),
                         layout="dapo_math_17k")
  assert dapo[2] == data.Example("Solve 2+1.", "3", None, "id-2")
  (m,) = data.load_jsonl(_write_jsonl(tmp_path / "m.jsonl", MATH_ROWS),
                         layout="math")
  assert m.answer == "1" and "boxed" in m.solution
  (g,) = data.load_jsonl(_write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS),
                         layout="gsm8k")
  assert g.answer == "7" and g.solution.startswith("3 + 4")
  (a,) = data.load_jsonl(_write_jsonl(tmp_path / "a.jsonl", AIME_ROWS),
                         layout="aime2024")
  assert (a.answer, a.uid) == ("204", "2024-I-1")
  assert rewards.check_answer(r"\boxed{204}", a.answer).correct


def test_custom_fields_and_default_uid(tmp_path):
  path = _write_jsonl(tmp_path / "c.jsonl", [{"q": "1+1?", "a": 2}])
  (ex,) = data.load_jsonl(path, problem_field="q", answer_field="a")
  assert ex.answer == "2" and ex.uid == f"{path}:1"


def test_parquet_matches_jsonl(tmp_path):
  path = tmp_path / "d.parquet"
  pq.write_table(pa.Table.from_pylist(DAPO_ROWS), path)
  from_parquet = data.load_parquet(path, layout="dapo_math_17k")
  from_jsonl = data.load_jsonl(_write_jsonl(tmp_path / "d.jsonl", DAPO_ROWS),
                               layout="dapo_math_17k")
  assert from_parquet == from_jsonl


@pytest.mark.parametrize("rows,raw,message", [
    ([{"problem": "p", "answer": "1"}, {"problem": "q"}], (),
     r"x\.jsonl:2: missing field 'answer'"),
    ([{"problem": "p", "answer": "1"}], ['{"problem": ["a"], "answer": "1"}'],
     r"x\.jsonl:2: field 'problem' has type list"),
    ([{"problem": "  ", "answer": "1"}], (), r"x\.jsonl:1: empty problem"),
    ([{"problem": "p", "answer": "1"}], ["{not json"],
     r"x\.jsonl:2: invalid JSON"),
    ([{"problem": "p", "answer": True}], (), r"x\.jsonl:1: field 'answer' has type bool"),
    ([{"problem": "p", "answer": None}], (), r"x\.jsonl:1: missing field 'answer'"),
    ([], ["[1, 2]"], r"x\.jsonl:1: row is a list"),
    ([], [], r"x\.jsonl: no examples"),
])
def test_bad_rows_name_file_and_line(tmp_path, rows, raw, message):
  path = _write_jsonl(tmp_path / "x.jsonl", rows, raw)
  with pytest.raises(data.DataError, match=message):
    data.load_jsonl(path)


def test_bad_parquet_row_names_row(tmp_path):
  path = tmp_path / "x.parquet"
  pq.write_table(pa.Table.from_pylist(
      [{"problem": "p", "answer": "1"}, {"problem": "", "answer": "2"}]), path)
  with pytest.raises(data.DataError, match=r"x\.parquet:2: empty problem"):
    data.load_parquet(path)


def test_math_layout_without_box_is_an_error(tmp_path):
  path = _write_jsonl(tmp_path / "m.jsonl", [{"problem": "p", "solution": "no box"}])
  with pytest.raises(data.DataError, match=r"m\.jsonl:1: .*boxed"):
    data.load_jsonl(path, layout="math")


def test_tfds_missing_gives_clear_message():
  try:
    import tensorflow_datasets  # noqa: F401  pylint: disable=unused-import
    pytest.skip("tensorflow-datasets is installed")
  except ImportError:
    pass
  with pytest.raises(ImportError, match="tensorflow-datasets"):
    data.load_tfds("gsm8k")


class _FakeChatTokenizer:
  def apply_chat_template(self, messages, tokenize, add_generation_prompt):
    assert not tokenize and add_generation_prompt
    return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_templates():
  t = data.PromptTemplate(data.DEFAULT_MATH_FORMAT)
  text = t.apply(r"What is $\{1\}$?")
  assert text.startswith(r"What is $\{1\}$?") and text.endswith(r"\boxed{}.")
  chat = data.PromptTemplate.from_chat_template(_FakeChatTokenizer(),
                                                system="Be brief.")
  assert chat("1+1?") == "<system>Be brief.<user>1+1?<assistant>"
  with pytest.raises(ValueError, match="problem"):
    data.PromptTemplate("no placeholder")


def test_length_filter_drops_and_counts():
  tok = data.CharTokenizer()
  exs = [data.Example("x" * n, "1", uid=str(n)) for n in (5, 50, 10, 80)]
  out = data.filter_by_length(exs, tok.encode, max_tokens=20)
  assert [e.uid for e in out.examples] == ["5", "10"]
  assert out.dropped == 2 and out.dropped_uids == ("50", "80")
  with pytest.raises(ValueError, match="exceed"):
    data.filter_by_length(exs, tok.encode, max_tokens=1)


def test_tfds_path_with_a_fake_module(monkeypatch):
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  calls = {}
  fake = types.ModuleType("tensorflow_datasets")
  def load(name, split, data_dir, download):
    calls.update(name=name, split=split, data_dir=data_dir, download=download)
    return [{"question": b"1+1?", "answer": b"2\n#### 2"},
            {"question": b"", "answer": b"#### 3"}]
  fake.load = load
  fake.as_numpy = lambda ds: iter(ds)
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  with pytest.raises(data.DataError, match=r"tfds:gsm8k/test:2: empty problem"):
    data.load_tfds("gsm8k", "test", layout="gsm8k", data_dir="/d")
  assert calls == dict(name="gsm8k", split="test", data_dir="/d", download=False)
  fake.load = lambda *a, **k: [{"question": b"1+1?", "answer": b"so\n#### 2"}]
  (ex,) = data.load_tfds("gsm8k", "test", layout="gsm8k")
  assert (ex.problem, ex.answer, ex.solution) == ("1+1?", "2", "so")
