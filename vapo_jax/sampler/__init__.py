"""The sampler: KV-cache group rollouts (`engine`), sampling ops (`ops`), the `Rollout` type.

    from vapo_jax.sampler import Sampler, SamplingConfig, Rollout
"""

from vapo_jax.sampler.engine import Sampler
from vapo_jax.sampler.ops import SamplingConfig
from vapo_jax.sampler.types import Rollout

__all__ = ["Rollout", "Sampler", "SamplingConfig"]
