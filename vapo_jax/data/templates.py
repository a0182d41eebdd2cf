"""Prompt templates and the prompt-length filter.

A `PromptTemplate` turns a problem into the prompt text, either by
substituting it into a format string at `{problem}` (other braces, such as
a `\\boxed{}` in the instructions, are left alone) or through a tokenizer's
chat template. `filter_by_length` drops prompts longer than the token budget
and counts them, instead of truncating them silently.
"""

import dataclasses
from typing import Any, Callable, Sequence

from vapo_jax.data import sources

DEFAULT_MATH_FORMAT = (
    "{problem}\n\nPlease reason step by step, and put your final answer "
    "within \\boxed{}.")


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
  """Builds prompt text from a problem.

  Attributes:
    format: text with one `{problem}` placeholder (the user message when a
      chat tokenizer is given).
    chat_tokenizer: optional object with `apply_chat_template` (e.g. a
      `transformers` tokenizer); when set, the formatted text becomes the
      user message and the generation prompt is appended.
    system: optional system message for the chat template.
  """
  format: str = "{problem}"
  chat_tokenizer: Any = None
  system: str | None = None

  def __post_init__(self):
    if self.format.count("{problem}") != 1:
      raise ValueError("template format needs exactly one '{problem}', got "
                       f"{self.format!r}")
    if self.chat_tokenizer is not None and not hasattr(
        self.chat_tokenizer, "apply_chat_template"):
      raise ValueError("chat_tokenizer has no apply_chat_template")

  @classmethod
  def from_chat_template(cls, tokenizer, user_format: str = "{problem}",
                         system: str | None = None) -> "PromptTemplate":
    return cls(format=user_format, chat_tokenizer=tokenizer, system=system)

  def apply(self, problem: str) -> str:
    text = self.format.replace("{problem}", problem)
    if self.chat_tokenizer is None:
      return text
    messages = ([{"role": "system", "content": self.system}]
                if self.system else [])
    messages.append({"role": "user", "content": text})
    return self.chat_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)

  def __call__(self, problem: str) -> str:
    return self.apply(problem)


@dataclasses.dataclass(frozen=True)
class LengthFilter:
  """The outcome of `filter_by_length`.

  Attributes:
    examples: the examples whose prompt fits.
    dropped: how many were dropped.
    dropped_uids: their uids (for a log line).
    max_tokens: the budget.
  """
  examples: list[sources.Example]
  dropped: int
  dropped_uids: tuple[str, ...]
  max_tokens: int


def filter_by_length(examples: Sequence[sources.Example],
                     encode: Callable[[str], Sequence[int]], max_tokens: int,
                     template: PromptTemplate = PromptTemplate()) -> LengthFilter:
  """Keeps the examples whose templated prompt has <= max_tokens tokens.

  Args:
    examples: the examples.
    encode: text -> token ids (e.g. `CharTokenizer().encode` or an HF
      tokenizer's `encode`).
    max_tokens: the prompt budget.
    template: the template that the trainer applies.

  Raises:
    ValueError: every example is too long (nothing would be trained on).
  """
  kept, dropped = [], []
  for ex in examples:
    if len(encode(template.apply(ex.problem))) <= max_tokens:
      kept.append(ex)
    else:
      dropped.append(ex.uid)
  if examples and not kept:
    raise ValueError(f"all {len(examples)} prompts exceed {max_tokens} tokens")
  return LengthFilter(kept, len(dropped), tuple(dropped), max_tokens)
