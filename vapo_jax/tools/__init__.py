"""Commands around a run: `python -m vapo_jax.tools.{evaluate,export,plot}`."""
