"""The old command names of the pod sizing tools, kept for one release: each runs its new
module as `python -m` would, after one line on stderr naming it.

  python -m vapo_jax.tools.step_model ...  ->  python -m vapo_jax.pod.step_model ...
"""

import runpy
import sys

# Old command -> the module that runs it now.
COMMANDS = {
    "vapo_jax.tools.compile_check": "vapo_jax.pod.compile_check",
    "vapo_jax.tools.step_model": "vapo_jax.pod.step_model",
    "vapo_jax.tools.train_hlo": "vapo_jax.pod.train_hlo",
    "vapo_jax.tools.decode_hlo": "vapo_jax.pod.decode_hlo",
}


def notice(old: str) -> str:
  return (f"{old} has moved to {COMMANDS[old]}: this name runs it until the next release "
          f"(python -m {COMMANDS[old]})")


def run(old: str) -> None:
  """Prints the notice to stderr, then runs the new module as __main__ (same argv)."""
  print(notice(old), file=sys.stderr, flush=True)
  runpy.run_module(COMMANDS[old], run_name="__main__", alter_sys=True)
