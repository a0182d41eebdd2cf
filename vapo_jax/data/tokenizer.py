"""A character-level tokenizer for the synthetic task (no download needed).

Ids 0-3 are special (`pad`, `bos`, `eos`, `unk`); then one id per character
of `DEFAULT_ALPHABET`: digits, ASCII letters, the operators and brackets of
the arithmetic task, the characters of `\\boxed{}`, space and newline.
Characters outside the alphabet map to `unk_id`.
"""

import string
from typing import Iterable

DEFAULT_ALPHABET = (string.digits + string.ascii_letters +
                    " \n+-*/=()[]{}\\.,:;?!'\"_^$%<>|#&")


class CharTokenizer:
  """Maps characters to ids and back.

  Attributes:
    pad_id, bos_id, eos_id, unk_id: special ids.
    vocab_size: number of ids.
  """

  pad_id = 0
  bos_id = 1
  eos_id = 2
  unk_id = 3
  _NUM_SPECIAL = 4

  def __init__(self, alphabet: str = DEFAULT_ALPHABET):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError("alphabet has repeated characters")
    self.alphabet = alphabet
    self._ids = {c: i + self._NUM_SPECIAL for i, c in enumerate(alphabet)}
    self.vocab_size = len(alphabet) + self._NUM_SPECIAL

  def encode(self, text: str, add_bos: bool = False,
             add_eos: bool = False) -> list[int]:
    ids = [self._ids.get(c, self.unk_id) for c in text]
    return ([self.bos_id] if add_bos else []) + ids + (
        [self.eos_id] if add_eos else [])

  def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
    """Inverse of `encode` on the alphabet; stops at the first eos."""
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      if i < self._NUM_SPECIAL:
        if not skip_special:
          out.append(("<pad>", "<bos>", "<eos>", "<unk>")[i])
        continue
      if i >= self.vocab_size:
        raise ValueError(f"id {i} out of range (vocab_size {self.vocab_size})")
      out.append(self.alphabet[i - self._NUM_SPECIAL])
    return "".join(out)

  def __len__(self):
    return self.vocab_size
