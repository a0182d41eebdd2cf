"""Prompt sources: JSONL, Parquet, TFDS and Hugging Face `datasets` rows -> validated `Example`s.

Field names are configurable, and dotted paths reach into nested columns
(`reward_model.ground_truth`, `prompt.0.content`). `LAYOUTS` holds the field
specs of common math datasets. Every row is validated while loading: a
missing field, a value of the wrong type or an empty problem raises
`DataError` naming `path:line` (the 1-based line of a JSONL file or row of a
Parquet file; for `datasets`, the dataset, split and row) and the field, so that
bad data stops a run before training.
"""

import dataclasses
import json
import os
from typing import Any, Iterable

from vapo_jax.rewards import extract


class DataError(ValueError):
  """A malformed data file or row; the message names `path:line`."""


@dataclasses.dataclass(frozen=True)
class Example:
  """One prompt with its reference answer.

  Attributes:
    problem: the problem text (before any prompt template).
    answer: the reference answer, as the reward function expects it.
    solution: a worked solution, if the source has one (used for SFT).
    uid: a stable identifier (`path:line` by default).
  """
  problem: str
  answer: str
  solution: str | None = None
  uid: str = ""


@dataclasses.dataclass(frozen=True)
class Fields:
  """Where a source keeps each part of an example.

  Attributes:
    problem: field (dotted path) of the problem text.
    answer: field of the answer.
    solution: optional field of a worked solution.
    uid: optional field of an identifier.
    answer_format: `plain` (use as is), `boxed` (the answer field is a
      solution; take its last `\\boxed{}`) or `gsm8k` (take what follows
      `####`; the text before becomes the solution).
  """
  problem: str = "problem"
  answer: str = "answer"
  solution: str | None = None
  uid: str | None = None
  answer_format: str = "plain"


LAYOUTS = {
    "default": Fields(),
    # BytedTsinghua-SIA/DAPO-Math-17k (parquet): chat-style prompt column.
    "dapo_math_17k": Fields(problem="prompt.0.content",
                            answer="reward_model.ground_truth",
                            uid="extra_info.index"),
    # hendrycks MATH: the answer is the last \boxed{} of the solution.
    "math": Fields(problem="problem", answer="solution", solution="solution",
                   answer_format="boxed"),
    # openai/gsm8k: "reasoning ... #### 72".
    "gsm8k": Fields(problem="question", answer="answer", answer_format="gsm8k"),
    # AIME 2024 (e.g. Maxwell-Jia/AIME_2024): integer answers.
    "aime2024": Fields(problem="Problem", answer="Answer", solution="Solution",
                       uid="ID"),
}

_MISSING = object()


def _get(row: Any, path: str) -> Any:
  value = row
  for part in path.split("."):
    if isinstance(value, dict) and part in value:
      value = value[part]
    elif isinstance(value, (list, tuple)) and part.isdigit() and int(
        part) < len(value):
      value = value[int(part)]
    else:
      return _MISSING
  return value


def _text(value: Any, where: str, field: str, allow_number: bool) -> str:
  if isinstance(value, bytes):
    value = value.decode("utf-8")
  if isinstance(value, str):
    return value
  if allow_number and isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  if allow_number and isinstance(value, float) and value == value:
    return repr(value) if not value.is_integer() else str(int(value))
  raise DataError(f"{where}: field {field!r} has type {type(value).__name__}, "
                  "expected a string")


def row_to_example(row: Any, fields: Fields, where: str) -> Example:
  """Validates one row and builds an `Example`; raises DataError."""
  if not isinstance(row, dict):
    raise DataError(f"{where}: row is a {type(row).__name__}, expected an object")
  raw = {}
  for name in ("problem", "answer", "solution", "uid"):
    path = getattr(fields, name)
    if path is None:
      continue
    value = _get(row, path)
    if value is _MISSING or value is None:
      if name in ("problem", "answer"):
        raise DataError(f"{where}: missing field {path!r}")
      continue
    raw[name] = _text(value, where, path, allow_number=name in ("answer", "uid"))
  problem = raw["problem"].strip()
  if not problem:
    raise DataError(f"{where}: empty problem (field {fields.problem!r})")
  answer, solution = raw["answer"].strip(), raw.get("solution")
  if fields.answer_format == "boxed":
    found = extract.extract_answer(answer)
    if found.answer is None:
      raise DataError(f"{where}: field {fields.answer!r} has no \\boxed{{}} "
                      f"answer ({found.reason})")
    answer = found.answer
  elif fields.answer_format == "gsm8k":
    head, sep, tail = answer.rpartition("####")
    if not sep or not tail.strip():
      raise DataError(f"{where}: field {fields.answer!r} has no '#### answer'")
    solution = solution or head.strip()
    answer = tail.strip()
  elif fields.answer_format != "plain":
    raise ValueError(f"answer_format must be plain, boxed or gsm8k; got "
                     f"{fields.answer_format!r}")
  if not answer:
    raise DataError(f"{where}: empty answer (field {fields.answer!r})")
  return Example(problem=problem, answer=answer, solution=solution,
                 uid=raw.get("uid", where))


def _fields(layout: str | Fields | None, overrides: dict) -> Fields:
  if isinstance(layout, Fields):
    base = layout
  else:
    name = layout or "default"
    if name not in LAYOUTS:
      raise ValueError(f"unknown layout {name!r}; choose from {sorted(LAYOUTS)}")
    base = LAYOUTS[name]
  overrides = {k: v for k, v in overrides.items() if v is not None}
  return dataclasses.replace(base, **overrides)


def _finish(examples: list[Example], path: str) -> list[Example]:
  if not examples:
    raise DataError(f"{path}: no examples")
  return examples


def load_jsonl(path: str | os.PathLike, problem_field: str | None = None,
               answer_field: str | None = None, *,
               layout: str | Fields | None = None,
               solution_field: str | None = None,
               uid_field: str | None = None) -> list[Example]:
  """Loads a JSON-lines file; blank lines are skipped.

  Args:
    path: the file.
    problem_field, answer_field, solution_field, uid_field: dotted field
      paths; they override the layout's.
    layout: a name in `LAYOUTS` or a `Fields`.

  Raises:
    DataError: a line is not JSON or a row is invalid (`path:line`).
  """
  fields = _fields(layout, dict(problem=problem_field, answer=answer_field,
                                solution=solution_field, uid=uid_field))
  path = os.fspath(path)
  examples = []
  with open(path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path}:{line_no}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg})") from e
      examples.append(row_to_example(row, fields, where))
  return _finish(examples, path)


def load_parquet(path: str | os.PathLike, problem_field: str | None = None,
                 answer_field: str | None = None, *,
                 layout: str | Fields | None = None,
                 solution_field: str | None = None,
                 uid_field: str | None = None) -> list[Example]:
  """Loads a Parquet file (needs pyarrow); rows are numbered from 1."""
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("load_parquet needs pyarrow: pip install "
                      "'vapo_jax[parquet]'") from e
  fields = _fields(layout, dict(problem=problem_field, answer=answer_field,
                                solution=solution_field, uid=uid_field))
  path = os.fspath(path)
  rows = pq.read_table(path).to_pylist()
  return _finish([row_to_example(row, fields, f"{path}:{i}")
                  for i, row in enumerate(rows, start=1)], path)


def load_tfds(name: str, split: str = "train", problem_field: str | None = None,
              answer_field: str | None = None, *,
              layout: str | Fields | None = None,
              data_dir: str | None = None) -> list[Example]:
  """Loads a TFDS dataset that is already prepared in `data_dir`.

  Needs the optional `tensorflow-datasets` package; nothing is downloaded.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("load_tfds needs tensorflow-datasets: pip install "
                      "'vapo_jax[tfds]' and prepare the dataset locally") from e
  fields = _fields(layout, dict(problem=problem_field, answer=answer_field))
  ds = tfds.load(name, split=split, data_dir=data_dir, download=False)
  rows: Iterable[dict] = tfds.as_numpy(ds)
  return _finish([row_to_example(row, fields, f"tfds:{name}/{split}:{i}")
                  for i, row in enumerate(rows, start=1)], f"tfds:{name}")


def load_hf(name: str, split: str = "train", problem_field: str | None = None,
            answer_field: str | None = None, *, config: str | None = None,
            layout: str | Fields | None = None,
            solution_field: str | None = None,
            uid_field: str | None = None) -> list[Example]:
  """Loads one split of a Hugging Face dataset (needs `pip install 'vapo_jax[hf-data]'`).

  Args:
    name: a Hub dataset id (`openai/gsm8k`; `org/name@revision` pins a revision), a
      local directory written by `Dataset(Dict).save_to_disk`, or a local directory of
      data files (parquet, jsonl, ... with an optional README declaring configs).
    split: the split ("train", "test", ...).
    config: the dataset's config name (gsm8k: "main"), or None.
    layout, *_field: as for `load_jsonl`.

  A Hub id is fetched like a model id (`vapo_jax.hub.resolve`: once into the Hub cache; with
  HF_HUB_OFFLINE=1 the cache only), then `datasets.load_dataset` reads the snapshot. Rows are
  numbered from 1; errors name `hf:<name>[/<config>] split '<split>' row <n>`.
  """
  try:
    import datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("data.source='hf' needs the datasets package: pip install "
                      "'vapo_jax[hf-data]'") from e
  fields = _fields(layout, dict(problem=problem_field, answer=answer_field,
                                solution=solution_field, uid=uid_field))
  label = f"hf:{name}" + (f"/{config}" if config else "")
  ds = _hf_split(datasets, name, split, config, label)
  rows = ds.to_list()  # plain dicts: a bad row's error then holds no Arrow table
  del ds
  return _finish([row_to_example(row, fields, f"{label} split {split!r} row {i}")
                  for i, row in enumerate(rows, start=1)], f"{label} split {split!r}")


def _hf_split(datasets, name: str, split: str, config: str | None, label: str):
  """One split of a saved-to-disk dataset or of `load_dataset(directory or snapshot)`."""
  from vapo_jax import hub  # pylint: disable=g-import-not-at-top
  path = hub.resolve(name, what="dataset", repo_type="dataset", allow_patterns=None)
  if any(os.path.exists(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json")):
    saved = datasets.load_from_disk(path)
    if isinstance(saved, datasets.DatasetDict):
      if split not in saved:
        raise DataError(f"{label}: no split {split!r}; it has {sorted(saved)}")
      return saved[split]
    return saved
  try:
    return datasets.load_dataset(path, config or None, split=split)
  except ValueError as e:
    text = str(e).strip()
    if "split" in text.lower() or "config" in text.lower():  # an unknown split or config
      raise DataError(f"{label}: {text.splitlines()[0] if text else type(e).__name__}") from e
    raise
