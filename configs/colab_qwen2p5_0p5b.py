"""VAPO on one 16 GB accelerator (a Colab TPU v5e-1 or T4): Qwen2.5-0.5B-Instruct on GSM8K
with LoRA on the policy and the critic and a bfloat16 frozen base.

  python -m vapo_jax.main --config=configs/colab_qwen2p5_0p5b.py \
      --config.model.hf_path=/content/Qwen2.5-0.5B-Instruct \
      --config.data.train_path=/content/gsm8k/train.jsonl \
      --config.data.eval_path=/content/gsm8k/test.jsonl --workdir=/content/vapo_colab

Every program fits a 16 GB v5e chip per the compile check (figures in docs/experiments.md):

  python -m vapo_jax.pod.compile_check --config=configs/colab_qwen2p5_0p5b.py --topology=v5e-1

configs/qwen2p5_0p5b.py (full fine-tuning, float32 weights and Adam state for both models)
does not fit one such chip. The learning rates are LoRA-sized guesses, not tuned.
"""

from vapo_jax import config as config_lib


def get_config(preset: str = "vapo"):
  c = config_lib.default_config_dict()
  c.seed = 0
  c.model.hf_path = "checkpoints/Qwen2.5-0.5B-Instruct"
  c.model.tokenizer = "hf"
  c.model.param_dtype = "bfloat16"  # the frozen base
  c.model.dtype = "bfloat16"
  c.model.remat = True
  c.model.lora.rank = 16
  c.model.lora.alpha = 32.0
  c.model.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")

  c.data.source = "jsonl"
  c.data.train_path = "data/gsm8k/train.jsonl"
  c.data.eval_path = "data/gsm8k/test.jsonl"
  c.data.layout = "gsm8k"
  c.data.chat_template = True
  c.data.template = ("{problem}\nPlease reason step by step, and put your final answer "
                     "within \\boxed{}.")
  c.data.max_prompt_tokens = 256
  c.data.num_train = 10_000
  c.data.num_eval = 256

  c.sampling.max_new_tokens = 1024
  c.sampling.temperature = 1.0
  c.sampling.prompts_per_call = 16  # 128 rows of KV cache per sampler call

  c.reward.num_workers = 2

  c.optim.policy_lr = 1e-5
  c.optim.critic_lr = 5e-5
  c.optim.warmup_steps = 5

  c.value_pretrain.enabled = True
  c.value_pretrain.max_steps = 20
  c.value_pretrain.min_steps = 5
  c.value_pretrain.stop_explained_variance = 0.5

  c.rl.steps = 200
  c.rl.prompts_per_step = 32
  c.rl.responses_per_prompt = 8
  c.rl.num_minibatches = 4
  c.rl.micro_batch_size = 8

  c.eval.every = 25
  c.eval.num_examples = 256
  c.eval.samples_per_problem = 4
  c.eval.batch_prompts = 16

  c.mesh.data = 1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  return config_lib.apply_preset(c, preset)
