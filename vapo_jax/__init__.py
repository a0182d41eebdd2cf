"""vapo_jax: VAPO (arXiv 2504.05118) in JAX / Flax NNX.

The reusable RL math lives in `vapo_jax.gae` and `vapo_jax.losses`; both import only jax.
"""

__version__ = "0.1.0"
