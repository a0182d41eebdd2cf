"""Command-line tools built on a run's parts (`python -m vapo_jax.tools.compile_check`, …)."""
