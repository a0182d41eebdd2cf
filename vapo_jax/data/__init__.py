"""Prompt data: sources, the synthetic task, templates and the iterator.

Imports no model or trainer code and no jax. `reasoning_gym` imports the reasoning-gym package
only when it draws problems, so this package imports without it.
"""

from vapo_jax.data import chain
from vapo_jax.data import chain_mix
from vapo_jax.data import reasoning_gym
from vapo_jax.data import synthetic
from vapo_jax.data import word_problems
from vapo_jax.data.iterator import PromptIterator
from vapo_jax.data.sources import DataError
from vapo_jax.data.sources import Example
from vapo_jax.data.sources import Fields
from vapo_jax.data.sources import LAYOUTS
from vapo_jax.data.sources import load_hf
from vapo_jax.data.sources import load_jsonl
from vapo_jax.data.sources import load_parquet
from vapo_jax.data.sources import load_tfds
from vapo_jax.data.templates import DEFAULT_MATH_FORMAT
from vapo_jax.data.templates import filter_by_length
from vapo_jax.data.templates import LengthFilter
from vapo_jax.data.templates import PromptTemplate
from vapo_jax.data.tokenizer import CharTokenizer

__all__ = [
    "CharTokenizer",
    "DEFAULT_MATH_FORMAT",
    "DataError",
    "Example",
    "Fields",
    "LAYOUTS",
    "LengthFilter",
    "PromptIterator",
    "PromptTemplate",
    "filter_by_length",
    "load_hf",
    "load_jsonl",
    "load_parquet",
    "load_tfds",
    "chain",
    "chain_mix",
    "reasoning_gym",
    "synthetic",
    "word_problems",
]
