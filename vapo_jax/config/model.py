"""config.model: the policy's (and the critic's) network, where it starts, how it computes.

Read by `run.networks` (build_policy, model_options, fresh_model_config, build_critic) and
`models.hf_io`; the critic's start by `run.trainer`.
"""

import dataclasses

from vapo_jax.config.base import need


# The projections LoRA can adapt (LoraSection.targets: a subset, all by default).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoraSection:
  # LoRA adapters y = x W + (alpha / rank) x A B on the policy's and the critic's projections
  # (vapo_jax/models/lora.py): only they (and the value head) are trained and held in the
  # optimizer; model.param_dtype="bfloat16" then stores the frozen base in bfloat16.
  rank: int = 0                # 0: off (every weight is trained)
  alpha: float = 16.0
  targets: tuple = LORA_TARGETS

  def check(self) -> None:
    need(self.rank >= 0, "model.lora.rank", self.rank, ">= 0 (0: no LoRA)")
    need(self.alpha > 0, "model.lora.alpha", self.alpha, "> 0")
    need(self.rank == 0 or (self.targets and set(self.targets) <= set(LORA_TARGETS)),
         "model.lora.targets", self.targets, f"a non-empty subset of {LORA_TARGETS}")


@dataclasses.dataclass(frozen=True)
class ModelSection:
  # HF checkpoint: a directory or a Hub id "org/name[@revision]"; "" builds a small model.
  # A GGUF file ("x.gguf" or "pkg:<module>/<file>") is converted once into a cache (hub.py).
  hf_path: str = ""
  tokenizer: str = "char"      # "char" (built-in, for synthetic tasks) or "hf" (hf_path's)
  critic_path: str = ""        # HF reward model / saved critic, a directory or a Hub id
                               # (with critic_start = "path")
  # Where the critic starts: "policy" (the policy's weights + a zero value head),
  # "reward_model" (an outcome reward model this run trains first: the `reward_model` stage,
  # as PPO's critic starts in the paper) or "path" (model.critic_path).
  critic_start: str = "policy"
  # The critic's value head V = <h, w> (+ b with critic_head_bias: a float32 scalar
  # `score_bias`, zero at the start, trained with the head; saved as HF `score.bias`).
  critic_head_bias: bool = False
  # With model.lora.rank > 0: True = the critic trains LoRA adapters (+ its head) like the
  # policy; False = full fine-tuning of the critic (the policy's adapters merged into its
  # copy of the weights, every weight trained; the policy keeps its LoRA).
  critic_lora: bool = True
  init_from: str = ""          # a run's workdir: the policy starts from its newest checkpoint
  # Seed of the fresh model's initialisation and of the SFT batch order (-1: `seed`). Fixed
  # apart from `seed`, every run seed starts from the same SFT policy (`Config.init_seed`).
  init_seed: int = -1
  model_type: str = "qwen2"    # for a model built from the fields below
  hidden_size: int = 128
  intermediate_size: int = 384
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  rope_theta: float = 10000.0
  tie_word_embeddings: bool = True
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  # With remat, the blocks rematerialised (the first ones); the rest keep their activations
  # (a forward pass less each, more memory). -1: all. `pod.compile_check --remat_search`
  # prints the fewest that fit a topology.
  remat_layers: int = -1
  # Of the rematerialised blocks, how many (the last ones) keep their matmul outputs (q, k,
  # v, o, gate, up; on TPU the splash kernel's residuals) and recompute only the elementwise
  # work: a plain block's FLOPs for about its memory. 0: none.
  remat_selective: int = 0
  # The blocks under one `lax.scan` over stacked parameters (compile time flat in depth), or
  # a Python loop (models/stacked.py). configs/qwen32b.py keeps the loop: its compile check
  # on v5p-128 did not fit under scan (2026-12-05: critic step 154 GB, 37 GB as a loop).
  scan_layers: bool = True
  attention_impl: str = "auto"  # dense | blocked | auto (blocked from 4 × attention_block keys)
  attention_block: int = 512    # keys per block of the blocked attention
  # The train passes' self-attention: "auto" (jax's Pallas splash kernel on TPU where it
  # takes the shapes, one line says why not; the pure-JAX path on CPU and GPU), "jax", or
  # "tpu" (an error where the kernel cannot run).
  attention_kernel: str = "auto"
  # With a mesh.tensor axis > 1: in the train passes the residual is split over `tensor` on
  # positions between blocks and each block's projections run as ring collective matmuls
  # whose transfers overlap the products (models/sequence_parallel.py); the same values.
  # Where a micro-batch does not divide over the mesh, the partitioned block, with one line.
  collective_matmul: bool = False
  lora: LoraSection = LoraSection()

  def check(self) -> None:
    need(self.tokenizer in ("char", "hf"), "model.tokenizer", self.tokenizer, '"char" or "hf"')
    need(self.tokenizer == "char" or self.hf_path, "model.tokenizer", self.tokenizer,
         '"char" unless model.hf_path is set')
    for name in ("param_dtype", "dtype"):
      need(getattr(self, name) in ("float32", "bfloat16", "float16"), f"model.{name}",
           getattr(self, name), "float32, bfloat16 or float16")
    need(self.attention_impl in ("auto", "dense", "blocked"), "model.attention_impl",
         self.attention_impl, "auto, dense or blocked")
    need(self.attention_kernel in ("auto", "jax", "tpu"), "model.attention_kernel",
         self.attention_kernel, "one of auto, jax, tpu")
    need(self.attention_block >= 1, "model.attention_block", self.attention_block, ">= 1")
    need(self.remat_layers >= -1, "model.remat_layers", self.remat_layers,
         ">= -1 (-1: every block)")
    need(self.remat_selective >= 0 and (self.remat or self.remat_selective == 0),
         "model.remat_selective", self.remat_selective,
         ">= 0, and 0 unless model.remat (a count of the rematerialised blocks)")
    need(self.remat_layers < 0 or self.remat_selective <= self.remat_layers,
         "model.remat_selective", self.remat_selective,
         f"at most model.remat_layers={self.remat_layers}")
    self.lora.check()
    need(self.critic_start in ("policy", "reward_model", "path"), "model.critic_start",
         self.critic_start, '"policy", "reward_model" or "path"')
    need((self.critic_start == "path") == bool(self.critic_path), "model.critic_start",
         self.critic_start, '"path" exactly when model.critic_path is set')
    if not self.hf_path:
      need(self.model_type in ("qwen2", "qwen3", "llama"), "model.model_type", self.model_type,
           "qwen2, qwen3 or llama")
      for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                   "num_kv_heads", "head_dim"):
        need(getattr(self, name) >= 1, f"model.{name}", getattr(self, name), ">= 1")
      need(self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads", self.num_kv_heads,
           f"a divisor of model.num_heads={self.num_heads}")
    need(self.init_seed >= -1, "model.init_seed", self.init_seed,
         ">= 0, or -1 (the run's seed)")
