"""The samplers. The rollout engine (`continuous`: decode slots refilled as responses end,
a paged KV pool) is the package's rollout sampler; the static sampler (`static`: one
compiled decode loop per call) is its oracle and comparison (sampling.engine="static").
Both are a `RolloutSampler`; sampling ops in `ops`, the `Rollout` batch in `types`.

    from vapo_jax.sampler import Engine, EngineConfig, SamplingConfig, Rollout
"""

from vapo_jax.sampler.continuous import Engine, EngineConfig
from vapo_jax.sampler.ops import SamplingConfig
from vapo_jax.sampler.types import Rollout, RolloutSampler

__all__ = ["Engine", "EngineConfig", "Rollout", "RolloutSampler", "SamplingConfig"]
