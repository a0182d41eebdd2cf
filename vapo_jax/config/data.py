"""config.data: where the problems come from and how a prompt is written (`run.inputs`,
`data/`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class DataSection:
  source: str = "synthetic"    # synthetic | jsonl | parquet | tfds | hf (Hub `datasets`)
  train_path: str = ""         # a file; for tfds / hf a dataset name ("openai/gsm8k[@rev]")
  eval_path: str = ""
  hf_config: str = ""          # data.source="hf": the dataset's config name (gsm8k: "main")
  eval_hf_config: str = ""     # of eval_path ("" = hf_config)
  train_split: str = "train"   # data.source="hf": the splits read
  eval_split: str = "test"
  layout: str = ""             # a named layout of data.LAYOUTS (e.g. "gsm8k", "math") or ""
  eval_layout: str = ""        # layout of eval_path ("" = layout)
  problem_field: str = ""
  answer_field: str = ""
  template: str = "{problem}\n"
  chat_template: bool = False  # wrap the template in the tokenizer's chat template
  max_prompt_tokens: int = 64
  # arithmetic (data.synthetic) | chain (data.chain, long CoT) | chain_or_guess
  # (data.chain_mix: short and long chains, and direct guesses among the SFT targets) |
  # word (data.word_problems: English word problems of min..max_steps operations)
  synthetic_task: str = "arithmetic"
  synthetic_min_steps: int = 2
  synthetic_max_steps: int = 3
  synthetic_max_operand: int = 9
  synthetic_ops: str = "+-*"
  synthetic_max_value: int = 99  # chain task: the running value stays in [0, max_value]
  # chain_or_guess: synthetic_min/max_steps are the short chains'; these the long ones'
  synthetic_long_min_steps: int = 14
  synthetic_long_max_steps: int = 20
  synthetic_short_fraction: float = 0.5   # share of short chains among the problems
  synthetic_guess_fraction: float = 0.15  # share of train problems whose SFT target is a guess
  # Seed of the synthetic train / held-out problems (-1: `seed`): fixed apart from `seed`,
  # every run seed sees the same problems and the same held-out set (`Config.data_seed`).
  seed: int = -1
  num_train: int = 4096
  num_eval: int = 256

  def check(self) -> None:
    need(self.source in ("synthetic", "jsonl", "parquet", "tfds", "hf"), "data.source",
         self.source, "synthetic, jsonl, parquet, tfds or hf")
    need(self.synthetic_task in ("arithmetic", "chain", "chain_or_guess", "word"),
         "data.synthetic_task", self.synthetic_task,
         '"arithmetic", "chain", "chain_or_guess" or "word"')
    need(self.seed >= -1, "data.seed", self.seed, ">= 0, or -1 (the run's seed)")
    need(0 <= self.synthetic_short_fraction <= 1 and 0 <= self.synthetic_guess_fraction < 1,
         "data.synthetic_short_fraction", self.synthetic_short_fraction,
         "in [0, 1] (and data.synthetic_guess_fraction in [0, 1))")
    need(self.source == "synthetic" or self.train_path, "data.train_path", self.train_path,
         f"set for data.source={self.source!r}")
    need("{problem}" in self.template, "data.template", self.template,
         'a format string with "{problem}"')
    need(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", self.max_prompt_tokens, ">= 1")
    need(self.num_train >= 1 and self.num_eval >= 1, "data.num_train", self.num_train,
         ">= 1 (and data.num_eval >= 1)")
