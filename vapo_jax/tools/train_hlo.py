"""Moved to `vapo_jax.pod.train_hlo`: `python -m vapo_jax.tools.train_hlo` still runs
it until the next release, after a one-line notice on stderr (`tools.moved`)."""

if __name__ == "__main__":
  from vapo_jax.tools import moved
  moved.run("vapo_jax.tools.train_hlo")
