"""VAPO as in the paper: Qwen2.5-32B base, DAPO-Math-17k, AIME 2024 avg@32, on a TPU pod.

  python -m vapo_jax.main --config=configs/qwen32b.py \
      --config.model.hf_path=/data/Qwen2.5-32B \
      --config.data.train_path=/data/dapo-math-17k.parquet \
      --config.data.eval_path=/data/aime_2024.jsonl --workdir=gs://bucket/vapo32b

Settings from VAPO (arXiv 2504.05118, §4): 512 prompts × 16 responses per step, mini-batches
of 512 responses, actor / critic learning rates 1e-6 / 2e-6, 50 steps of value pretraining,
α = 0.05, λ_critic = 1, γ = 1, ε_low / ε_high = 0.2 / 0.28, μ = 0.1, token-level loss, and
responses of up to 20k tokens. Mesh: FSDP over every chip with 4-way tensor parallelism.

Units: the paper's "about 5,000 training steps" (its Figure 1 x-axis) are gradient updates.
One rollout step here (`rl.steps`) samples 512 × 16 responses and makes 16 optimizer
updates on mini-batches of 512, so the budget is 313 rollout steps = 5,008 updates.
"""

from vapo_jax import config as config_lib


def get_config(preset: str = "vapo"):
  c = config_lib.default_config_dict()
  c.seed = 0
  c.model.hf_path = "checkpoints/Qwen2.5-32B"
  c.model.tokenizer = "hf"
  c.model.param_dtype = "float32"     # master weights; matmuls in bfloat16
  c.model.dtype = "bfloat16"
  c.model.remat = True
  # Every block rematerialised, the last 32 selectively (they keep their matmul outputs and
  # the splash residuals and recompute only elementwise work): `pod.compile_check
  # --selective_search` (policy step 89.65 GB, critic step 67.58 GB of 96.9 per chip; 64
  # selective blocks would need ~121 GB). Was 48 of 64 fully rematerialised and 16 kept
  # (`--remat_search`); the step model puts the selective mix 0.04x nearer the floor
  # (docs/step_model.md).
  c.model.remat_layers = -1
  c.model.remat_selective = 32
  # The blocks as a Python loop, not under scan: with the layers under scan the compile check
  # (--probe_layers=4,8, 2026-12-05) put the critic step at 154.5 GB of 96.9 per chip; as a
  # loop it needs 37.4 GB and the policy step 65.7 GB (both fit). Why scan grows this much
  # is not yet known.
  c.model.scan_layers = False
  # The blocks' tensor-parallel projections as ring collective matmuls over a residual split
  # on positions (models/sequence_parallel.py): the v5p compile kept their all-reduces
  # synchronous; as rings of collective-permutes they overlap the matmuls. Exposed
  # collectives per policy-step micro-batch 113.1 -> 20.7 GB; the step model at --mfu=0.5
  # 1.47x / 1.38x / 1.40x -> 1.37x / 1.31x / 1.33x
  # (benchmarks/results/collective-matmul-2026-12-07/).
  c.model.collective_matmul = True
  # Blocked (flash-style) attention: O(T × 512) scores per layer instead of T × T, which at
  # 21.5k tokens is what lets the policy step fit a v5p chip (docs/pod.md, "Capacity").
  c.model.attention_impl = "blocked"
  c.model.attention_block = 512

  c.data.source = "parquet"
  c.data.train_path = "data/dapo-math-17k.parquet"
  c.data.layout = "dapo_math_17k"
  c.data.eval_path = "data/aime_2024.jsonl"
  c.data.eval_layout = "aime2024"
  c.data.template = ("{problem}\n\nPlease reason step by step, and put your final answer "
                     "within \\boxed{}.\n")
  c.data.max_prompt_tokens = 1024
  c.data.num_train = 1_000_000
  c.data.num_eval = 30

  c.sampling.max_new_tokens = 20480
  c.sampling.temperature = 1.0
  # 16 prompts × 16 responses per sampler call: one call's KV cache is 256 rows × 21.5k slots
  # × 262 kB/token = 1.4 TB, 23 GB per chip on v5p-128 (rows over fsdp, kv heads over tensor).
  c.sampling.prompts_per_call = 16   # the static sampler's (the engine samples a step at once)
  # The rollout engine (default): 4,096 decode slots over 16 decode replicas (the data x
  # fsdp groups, heads over mesh.tensor), 256 each (the Pallas kernel in 2 slot groups),
  # sharing each replica's KV pool, sized from the HBM the train state leaves (~961k tokens,
  # ~63 GB per v5p chip; the decode chunk FITS at 93.2 GB). Each chunk runs the smallest of
  # 4 row buckets (256, 128, 64, 32 per replica) that holds the occupied slots
  # (sampling.decode_buckets, the default): with one bucket every step's matmuls ran over all
  # 256 slots, live or idle, and 4,096 lost to 2,048 (1.81x / 1.53x / 1.50x against 1.57x /
  # 1.50x / 1.48x, --mfu=0.5); with buckets more slots admit more responses early and the
  # tail runs on small buckets (benchmarks/results/step-model-2026-12-06-buckets/).
  c.sampling.slots = 4096
  c.sampling.decode_buckets = 4

  c.reward.num_workers = 32
  c.reward.timeout_s = 10.0

  c.optim.policy_lr = 1e-6
  c.optim.critic_lr = 2e-6
  c.optim.warmup_steps = 10          # optimizer updates
  c.optim.weight_decay = 0.1
  c.optim.grad_clip = 1.0

  c.value_pretrain.enabled = True
  c.value_pretrain.max_steps = 50    # rollout steps (the paper does not say which unit)
  c.value_pretrain.min_steps = 50

  c.rl.steps = 313                   # rollout steps × 16 updates = 5,008 optimizer updates
  c.rl.prompts_per_step = 512
  c.rl.responses_per_prompt = 16
  c.rl.num_minibatches = 16          # mini-batches of 512 responses
  c.rl.micro_batch_size = 16         # one response per batch shard (fsdp 16 on v5p-128)
  # Each packing plan picks its rows among 8 lengths (2,688 · s slots, s = 1..8) at the same
  # token budget per device, so short early-run responses pack into short rows instead of
  # rounding the micro-batch count up over 21.5k-slot rows: update token efficiency 0.70 ->
  # 0.93 early in the step model (docs/step_model.md); up to 8× the compiled packed shapes.
  c.rl.packing_row_steps = 8
  c.rl.ppo_epochs = 1
  c.rl.alpha = 0.05
  c.rl.gamma = 1.0
  c.rl.lam_critic = 1.0
  c.rl.eps_low = 0.2
  c.rl.eps_high = 0.28
  c.rl.nll_coef = 0.1

  c.eval.every = 10                  # rollout steps (160 updates): ~31 points on the curve
  c.eval.num_examples = 30
  c.eval.samples_per_problem = 32    # avg@32, the paper's AIME metric
  c.eval.batch_prompts = 16          # × 32 samples: an eval KV cache 2× a rollout call's

  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 4
  return config_lib.apply_preset(c, preset)
