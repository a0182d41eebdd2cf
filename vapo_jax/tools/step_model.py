"""Moved to `vapo_jax.pod.step_model`: `python -m vapo_jax.tools.step_model` still runs
it until the next release, after a one-line notice on stderr (`tools.moved`)."""

if __name__ == "__main__":
  from vapo_jax.tools import moved
  moved.run("vapo_jax.tools.step_model")
