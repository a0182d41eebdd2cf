"""VAPO on one GPU (or a Colab): Qwen2.5-0.5B-Instruct on GSM8K.

  python -m vapo_jax.main --config=configs/qwen2p5_0p5b.py \
      --config.model.hf_path=/content/Qwen2.5-0.5B-Instruct \
      --config.data.train_path=/content/gsm8k/train.jsonl \
      --config.data.eval_path=/content/gsm8k/test.jsonl --workdir=/content/vapo_0p5b
"""

from vapo_jax import config as config_lib


def get_config(preset: str = "vapo"):
  c = config_lib.default_config_dict()
  c.seed = 0
  c.model.hf_path = "checkpoints/Qwen2.5-0.5B-Instruct"
  c.model.tokenizer = "hf"
  c.model.param_dtype = "float32"
  c.model.dtype = "bfloat16"
  c.model.remat = True

  c.data.source = "jsonl"
  c.data.train_path = "data/gsm8k/train.jsonl"
  c.data.eval_path = "data/gsm8k/test.jsonl"
  c.data.layout = "gsm8k"
  c.data.chat_template = True
  c.data.template = ("{problem}\nPlease reason step by step, and put your final answer "
                     "within \\boxed{}.")
  c.data.max_prompt_tokens = 256
  c.data.num_train = 10_000
  c.data.num_eval = 512

  c.sampling.max_new_tokens = 1024
  c.sampling.temperature = 1.0

  c.reward.num_workers = 4

  c.optim.policy_lr = 1e-6
  c.optim.critic_lr = 5e-6
  c.optim.warmup_steps = 5

  c.value_pretrain.enabled = True
  c.value_pretrain.max_steps = 20
  c.value_pretrain.min_steps = 5
  c.value_pretrain.stop_explained_variance = 0.5

  c.rl.steps = 300
  c.rl.prompts_per_step = 64
  c.rl.responses_per_prompt = 8
  c.rl.num_minibatches = 4
  c.rl.micro_batch_size = 16

  c.eval.every = 25
  c.eval.num_examples = 512
  c.eval.samples_per_problem = 4
  c.eval.batch_prompts = 64

  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  return config_lib.apply_preset(c, preset)
