"""Command-line tools built on the trainer's parts (e.g. `python -m vapo_jax.tools.compile_check`)."""
