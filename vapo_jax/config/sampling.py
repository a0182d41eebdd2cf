"""config.sampling: the rollout's sampler and the rollout engine's sizes (`run.sampling`;
`sampler/`). Its KV pool against the prompt length and the calls against the
prompts per step are checked across sections (`config.validate`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class SamplingSection:
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 64
  # Prompts per sampler call (0: all of a step's prompts at once). The KV cache holds
  # prompts_per_call × n rows of max_prompt_tokens + max_new_tokens slots: at 32B and 20k
  # tokens, 262 kB per token per row, so pods sample a step's 512 prompts in several calls.
  prompts_per_call: int = 0
  # The decode loop runs in this many stretches, each attending over a cache window cut
  # to the slots its steps can reach (1: every step reads all prompt + response slots).
  decode_windows: int = 4
  # The rollout engine (docs/engine.md): "continuous" (decode slots refilled as responses
  # end, a paged KV pool, live-length attention, a decode copy of the weights; the rollout
  # and the evaluation) or "static" (the padded sampler above, one while loop per call until
  # its longest row stops; kept as the test oracle). The compile check lowers the engine's
  # own programs (`continuous.Engine.lowerable`).
  engine: str = "continuous"
  # Decode slots (rows of every decode step); 0: the rows the static sampler would run
  # (prompts per step x n for the rollout, eval.batch_prompts x k for the evaluation).
  slots: int = 0
  page_size: int = 16       # tokens per KV page
  # KV pool in tokens (whole pages). 0: sized from the memory the train state leaves
  # (sampler/kv_pool.py): (1 - kv_headroom) x HBM less the resident train states, reference,
  # rollout batch and decode copy, capped at slots x the pages of one whole response
  # (ceil((max_prompt_tokens + max_new_tokens - 1) / page_size)); on CPU (no HBM figure)
  # the cap. Must hold one whole response.
  kv_tokens: int = 0
  kv_headroom: float = 0.1  # fraction of HBM the pool leaves for the programs' temporaries
  chunk_steps: int = 16     # decode steps per on-device chunk (host work between chunks)
  # Row buckets of the engine's decode chunk: bucket i < decode_buckets runs slots / 2^i
  # rows (per decode replica, dropped where that is not a whole number), and each chunk runs
  # the smallest that holds the occupied slots, so a rollout's tail of a few long responses
  # stops paying for idle rows. One compiled decode chunk per bucket. 1: every chunk runs
  # every slot.
  decode_buckets: int = 4
  # Dispatch the next decode chunk before reading the last one back, so the host's work
  # between chunks overlaps the device's (pages reserved two chunks ahead); the tokens are
  # the same either way. Off on a CPU mesh of several devices (it waits for each insert).
  overlap: bool = True
  # The engine prefills each prompt alone, at the smallest bucket that holds it: powers of
  # two from this up to data.max_prompt_tokens (the last bucket), one prefill and one insert
  # compile per bucket. 0: one bucket, data.max_prompt_tokens (every prompt padded to it).
  # The static sampler keeps one bucket (its decode loop compiles per bucket).
  prompt_bucket_min: int = 128
  # Weights the engine decodes with: "auto" = the model's compute dtype (every matmul
  # casts its weight to it anyway, so the copy is exact and, at bf16, half the bytes of
  # the fp32 master); "bfloat16" / "float32" force one.
  decode_dtype: str = "auto"
  # The engine's decode attention: "auto" (jax's Pallas ragged paged attention kernel on
  # TPU where it takes the model's per-shard shapes, e.g. head_dim a multiple of 128; the
  # pure-JAX paged attention elsewhere, one line says why on TPU), "jax", or "tpu" (an
  # error where the kernel cannot run).
  attention_kernel: str = "auto"

  def check(self) -> None:
    need(self.temperature > 0, "sampling.temperature", self.temperature, "> 0")
    need(0 < self.top_p <= 1, "sampling.top_p", self.top_p, "in (0, 1]")
    need(self.top_k >= 0, "sampling.top_k", self.top_k, ">= 0 (0: off)")
    need(self.max_new_tokens >= 1, "sampling.max_new_tokens", self.max_new_tokens, ">= 1")
    need(self.decode_windows >= 1, "sampling.decode_windows", self.decode_windows, ">= 1")
    need(self.attention_kernel in ("auto", "jax", "tpu"), "sampling.attention_kernel",
         self.attention_kernel, "one of auto, jax, tpu")
    need(self.engine in ("continuous", "static"), "sampling.engine", self.engine,
         '"continuous" or "static"')
    for name in ("page_size", "chunk_steps", "decode_buckets"):
      need(getattr(self, name) >= 1, f"sampling.{name}", getattr(self, name), ">= 1")
    need(self.slots >= 0, "sampling.slots", self.slots, ">= 0 (0: auto)")
    need(self.prompt_bucket_min >= 0, "sampling.prompt_bucket_min", self.prompt_bucket_min,
         ">= 0 (0: one bucket, data.max_prompt_tokens)")
    need(0 <= self.kv_headroom < 1, "sampling.kv_headroom", self.kv_headroom, "in [0, 1)")
    need(self.decode_dtype in ("auto", "bfloat16", "float32"), "sampling.decode_dtype",
         self.decode_dtype, '"auto", "bfloat16" or "float32"')
