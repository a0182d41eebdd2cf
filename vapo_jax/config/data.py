"""config.data: where the problems come from and how a prompt is written (`run.inputs`,
`data/`)."""

import dataclasses

from vapo_jax.config.base import ConfigError
from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class DataSection:
  # synthetic | jsonl | parquet | tfds | hf (Hub `datasets`) | reasoning_gym (the
  # reasoning-gym generators, data.reasoning_gym, with worked solutions; needs the package)
  source: str = "synthetic"
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
  # data.source="reasoning_gym": the mixture. rg_arms: comma-separated names of
  # data.reasoning_gym.ARMS ("chain_sum_l2,leg_counting_l2") or inline arms
  # `task{json config}` ('chain_sum{"min_terms": 2, "max_terms": 2}'); rg_weights: "" =
  # equal shares, else one positive number per arm ("2,1"); rg_drop_shortcuts: drop, from
  # both splits, every item that an op-ignoring shortcut (the sum, the first number, ...)
  # answers right. Both splits follow the mixture; each (split, arm, data seed) draws from
  # its own block of generator seeds.
  rg_arms: str = ""
  rg_weights: str = ""
  rg_drop_shortcuts: bool = False
  num_train: int = 4096
  num_eval: int = 256

  def check(self) -> None:
    need(self.source in ("synthetic", "jsonl", "parquet", "tfds", "hf", "reasoning_gym"),
         "data.source", self.source, "synthetic, jsonl, parquet, tfds, hf or reasoning_gym")
    need(self.synthetic_task in ("arithmetic", "chain", "chain_or_guess", "word"),
         "data.synthetic_task", self.synthetic_task,
         '"arithmetic", "chain", "chain_or_guess" or "word"')
    need(self.seed >= -1, "data.seed", self.seed, ">= 0, or -1 (the run's seed)")
    need(0 <= self.synthetic_short_fraction <= 1 and 0 <= self.synthetic_guess_fraction < 1,
         "data.synthetic_short_fraction", self.synthetic_short_fraction,
         "in [0, 1] (and data.synthetic_guess_fraction in [0, 1))")
    need(self.source in ("synthetic", "reasoning_gym") or self.train_path, "data.train_path",
         self.train_path, f"set for data.source={self.source!r}")
    if self.source == "reasoning_gym":
      self.check_reasoning_gym()
    need("{problem}" in self.template, "data.template", self.template,
         'a format string with "{problem}"')
    need(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", self.max_prompt_tokens, ">= 1")
    need(self.num_train >= 1 and self.num_eval >= 1, "data.num_train", self.num_train,
         ">= 1 (and data.num_eval >= 1)")

  def check_reasoning_gym(self) -> None:
    """The mixture's strings parse (without the package: task names and config fields are
    checked when the examples are built) and data.seed fits the seed blocks."""
    from vapo_jax.data import reasoning_gym  # pylint: disable=import-outside-toplevel
    try:
      arms = reasoning_gym.parse_arms(self.rg_arms)
    except ValueError as e:
      raise ConfigError(f"config.data.rg_arms={self.rg_arms!r}: {e}") from None
    need(len(arms) <= reasoning_gym.MAX_ARMS
         and len({name for name, _ in arms}) == len(arms), "data.rg_arms", self.rg_arms,
         f"at most {reasoning_gym.MAX_ARMS} arms, none twice")
    try:
      reasoning_gym.parse_weights(self.rg_weights, len(arms))
    except ValueError as e:
      raise ConfigError(f"config.data.rg_weights={self.rg_weights!r}: must be \"\" (equal "
                        f"shares) or {len(arms)} comma-separated positive numbers, one per "
                        f"arm of data.rg_arms ({e})") from None
    need(self.seed <= reasoning_gym.max_data_seed(), "data.seed", self.seed,
         f"<= {reasoning_gym.max_data_seed()} for data.source=\"reasoning_gym\" (its seed "
         "blocks stay below 2**32)")
    need(max(self.num_train, self.num_eval) <= reasoning_gym.BLOCK, "data.num_train",
         self.num_train, f"<= {reasoning_gym.BLOCK} (and data.num_eval) for "
         "data.source=\"reasoning_gym\" (one seed block per split and arm)")
