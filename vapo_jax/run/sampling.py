"""The run's samplers (rollout, evaluation, greedy), their engines' KV pools and replicas.

Rollout engines (docs/engine.md), or with sampling.engine="static" static samplers; an
engine's KV pool is sized from the memory the train state leaves (`run.memory`).
"""

import dataclasses
import functools

import jax
import numpy as np
from jax.sharding import NamedSharding

from vapo_jax import sharding as shd
from vapo_jax.models import transformer
from vapo_jax.run import memory as run_memory
from vapo_jax.run import pass_sizes
from vapo_jax.run.inputs import Text
from vapo_jax.sampler import continuous
from vapo_jax.sampler import kv_pool
from vapo_jax.sampler import ops
from vapo_jax.sampler import paged
from vapo_jax.sampler import static
from vapo_jax.sampler import types as types_lib


def uses_engine(cfg) -> bool:
  """Whether the run samples with the rollout engine (sampling.engine == "continuous"),
  single- or multi-process: every process runs the same host loop on the same values and
  reads each chunk from replicated arrays (docs/engine.md)."""
  return cfg.sampling.engine == "continuous"


def decode_replicas(mcfg, mesh, rules, slots: int) -> int:
  """The engine's decode replicas: the mesh's batch shards (data x fsdp, each a whole
  tensor-parallel decode copy) when they divide the slots and the tensor axis splits the
  kv heads whole, else 1 (every chip decodes every slot; one line says so)."""
  if mesh is None:
    return 1
  axes = shd.batch_axes(mesh, rules)
  r = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  if r == 1:
    return 1
  why = None
  if slots % r:
    why = f"{slots} slots do not split over {r} batch shards"
  else:
    tp = continuous.kv_head_shards(mcfg, mesh, rules)
    if mcfg.num_kv_heads % tp:
      why = f"{mcfg.num_kv_heads} kv heads do not split over {tp} tensor shards"
  if why:
    print(f"[sampler] decode replicas off ({why}): every chip decodes every slot",
          flush=True)
    return 1
  return r


def build_sampler(cfg, graphdef, mcfg, mesh, rules, text: Text, *, n: int,
                  temperature: float | None = None, greedy: bool = False, rows: int = 0,
                  memory: kv_pool.Memory | None = None, kv_tokens: int = 0):
  """A compiled group sampler with the run's sampling settings.

  The engine's KV pool (`sampler.kv_pool.size`): sampling.kv_tokens, else `kv_tokens`, else
  sized from `memory` (default: the device's HBM less the resident train state,
  `run.memory.engine_memory`; on CPU the cap of slots x one whole response)."""
  s = cfg.sampling
  scfg = ops.SamplingConfig(
      max_new_tokens=s.max_new_tokens, temperature=temperature or s.temperature,
      top_p=s.top_p, top_k=s.top_k, greedy=greedy, stop_token_ids=text.eos_ids,
      pad_id=text.pad_id, vocab_size=text.vocab_size, n_per_prompt=n,
      max_prompt_len=cfg.data.max_prompt_tokens,
      prompt_buckets=(cfg.data.max_prompt_tokens,), decode_windows=s.decode_windows)
  if uses_engine(cfg):  # the rollout engine (docs/engine.md)
    slots = s.slots or rows or n  # 0: as many slots as the static sampler has rows
    scfg = dataclasses.replace(scfg, prompt_buckets=pass_sizes.prompt_buckets(cfg))
    if memory is None and not (s.kv_tokens or kv_tokens):
      memory = run_memory.engine_memory(cfg, mcfg, mesh, rules)
    replicas = decode_replicas(mcfg, mesh, rules, slots)
    pool = kv_pool.size(slots=slots, page_size=s.page_size,
                        whole_tokens=cfg.data.max_prompt_tokens + s.max_new_tokens - 1,
                        token_bytes_=kv_pool.token_bytes(mcfg, mcfg.dtype, mesh, rules),
                        memory=memory, explicit=s.kv_tokens or kv_tokens, replicas=replicas)
    engine = continuous.Engine(graphdef, mcfg, scfg, continuous.EngineConfig(
        slots=slots, page_size=s.page_size, chunk_steps=s.chunk_steps, kv_tokens=pool.tokens,
        decode_dtype=s.decode_dtype, replicas=replicas, overlap=s.overlap,
        decode_buckets=s.decode_buckets,
        kernel=continuous.attention_kernel(
            s.attention_kernel, mcfg, mesh, rules, s.page_size,
            table=(slots // replicas, paged.pages_for(
                cfg.data.max_prompt_tokens + s.max_new_tokens - 1, s.page_size)))),
        mesh=mesh, rules=rules)
    engine.pool = pool  # how it was sized (the compile check's KV-pool line)
    return engine
  # The KV cache's kv_heads axis is split like the k/v projections (over `tensor`), not
  # only its rows over the batch axes: at 32B × 20k tokens a row's cache is 5.6 GB, and
  # replicating it over a 4-way tensor axis is what keeps it off any v5p slice.
  init = functools.partial(transformer.init_cache, mcfg)
  spec = shd.logical_to_spec((None, None, "kv_heads", "head_dim"), rules, mesh,
                             (1, 1, mcfg.num_kv_heads, mcfg.head_dim))
  kv_sharding = NamedSharding(mesh, spec)

  def init_cache(batch, max_len):
    cache = init(batch, max_len)
    if not any(spec):
      return cache
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, kv_sharding), cache)

  return static.Sampler(graphdef, init_cache, scfg, mesh=mesh, rules=rules)


@dataclasses.dataclass(frozen=True)
class Samplers:
  """The run's samplers: engines (`continuous.Engine`), or with sampling.engine="static"
  static samplers (`static.Sampler`)."""
  rollout: types_lib.RolloutSampler  # n = rl.group_size
  eval: types_lib.RolloutSampler     # n = eval.samples_per_problem
  greedy: types_lib.RolloutSampler   # n = 1, argmax


def samplers(cfg, graphdef, mcfg, mesh, rules, text: Text, *,
             memory: kv_pool.Memory | None = None,
             kv_tokens: dict[str, int] | None = None) -> Samplers:
  """The rollout, evaluation and greedy samplers. memory / kv_tokens ({"rollout" | "eval" |
  "greedy": tokens}) size the engines' KV pools (`build_sampler`; the compile check)."""
  build = functools.partial(build_sampler, cfg, graphdef, mcfg, mesh, rules, text)
  if (memory is None and uses_engine(cfg) and not cfg.sampling.kv_tokens
      and not kv_tokens):
    memory = run_memory.engine_memory(cfg, mcfg, mesh, rules)
  kv = kv_tokens or {}
  n, k, ev = cfg.rl.group_size, cfg.eval.samples_per_problem, cfg.eval.batch_prompts
  return Samplers(
      build(n=n, rows=n * cfg.rl.rollout_prompts, memory=memory,
            kv_tokens=kv.get("rollout", 0)),
      build(n=k, rows=k * ev, memory=memory, kv_tokens=kv.get("eval", 0)),
      build(n=1, greedy=True, rows=ev, memory=memory, kv_tokens=kv.get("greedy", 0)))
