"""The labelled case type shared by `reward_cases` and `reward_corpus`."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Case:
  category: str
  response: str
  reference: str
  equal: bool
  hostile: bool = False
  lenient: bool | None = None
  answer: str = ""

  @property
  def lenient_equal(self) -> bool:
    return self.equal if self.lenient is None else self.lenient
