"""config.compile: JAX's persistent compilation cache (`run.compiles`)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class CompileSection:
  """What a run compiles (`run.compiles`): JAX's persistent compilation cache, so a rerun or
  a resumed run loads its programs instead of compiling them again."""
  # False: no persistent cache (JAX_COMPILATION_CACHE_DIR, when set, still wins).
  cache: bool = True
  cache_dir: str = ""                   # "": $XDG_CACHE_HOME/vapo_jax/jax; the user's, private

  def check(self) -> None:
    """Nothing to range-check: a flag and a path."""
