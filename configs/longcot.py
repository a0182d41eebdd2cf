"""A toy where VAPO's mechanisms have room to act: long chain-of-thought arithmetic.

Responses are 89–150 tokens (one line per step of a 10–14 step chain of ±1..3 in [0, 19],
`data.chain`), the reward is the checker's verdict on the final `\\boxed{}` only, and SFT
teaches the format while leaving the policy well below the ceiling (one wrong step anywhere
fails the answer).

Sizing so far (2026-11-30, seed 0, held-out avg@4 / pass@4 / greedy on 128 problems):
- 12–20 steps of ±1..9, ×2..3 in [0, 99]: 2.0 / 7.8 / – % after 150 SFT steps, 2.7 / 10.2 /
  1.6 % after 300; 30 VAPO steps did not raise it.
- 10–14 steps of ±1..5 in [0, 29], 600 SFT steps: 6.8 / 23.4 / 6.3 %; 30 VAPO steps:
  3.0, 5.1, 3.7 % at steps 10, 20, 30.
- The same chain, 600 SFT steps (loss 0.064 and still falling steeply): 12.9 / 42.2 / 18.8 %.
  60 VAPO steps (advantages whitened) lowered it: 11.5, 7.8, 7.6 % at steps 20, 40, 60 (train
  accuracy 17 → 5–10 %,
  the critic's explained variance ≈ 0 throughout, approx KL ~5e-4 per step); at a policy
  lr of 1e-3 the responses drifted to the 160-token cap within 8 steps.
- This config (900 SFT steps, loss 0.028; advantages not whitened, as in configs/tiny.py):
  23.2 / 56.3 / 50.8 % after SFT; 40 VAPO steps: 45.9 / 74.2 / 46.1 % at step 20 and
  54.3 / 74.2 / 64.8 % at step 40 (train accuracy 29 → 40–70 %). VAPO learns from here.
  Two things changed at once (the start and whitening); which one mattered is not separated.
- The three-seed ablation at 24 RL steps (README, 2026-12-01): the seeds' SFT starts are
  23.2, 16.6 and 10.5 %, and only seed 0 learns (VAPO 47.9 %; 15.6 and 10.4 % in the others);
  the critic's explained variance stays within ±0.05 in every row. A next sizing should fix
  the start (SFT to a target accuracy) and make the critic learn before reading the rows.
- Protocol since 2026-12-01 (issue 29), after the table above: data.seed = model.init_seed = 0,
  so every seed's rows start from one SFT run (`experiments.ablation.ablate` shares it and
  accepts it only in SFT_BAND on a development set), on the same held-out set; value
  pretraining ends by the plateau rule (cap 30 steps) instead of EV ≥ 0.6, which a perfect
  critic of this task cannot reach (≈ 0.4, review §3.1). The committed table was made with the
  old protocol (`git show 974c554:configs/longcot.py`); it has not been rerun with this one.
Speed: an RL step (128 responses) takes ~4.5 s on 2 quiet CPU cores and 0.21 s on one H200
(`benchmarks/gpu_check.sh`), an SFT step ~0.35 s and 4 ms. The ablation budget is 24 RL steps
per row (fixed 2026-12-01, before any ablation row ran, from the sizing run above: VAPO had
gained 23 points by step 20): one seed of all eleven rows is then ~35 minutes on 2 cores
(SFT ~5.5 minutes, each row ~2.5 minutes with its start-up) and three seeds ~1.7 hours; 40
steps were ~50 minutes a seed.

  python -m experiments.ablation.ablate --config=configs/longcot.py --rows=all --seeds=0,1,2 \\
      --workdir=/tmp/ablate
  python -m experiments.ablation.ablate --config=configs/longcot.py --smoke --rows=vapo \\
      --workdir=/tmp/ablate_smoke            # every stage at a few steps
  python -m vapo_jax.main --config=configs/longcot.py:no_decoupled_gae --workdir=/tmp/x
"""

from vapo_jax import config as config_lib

# The shared SFT start is accepted only inside this band (experiments.ablation.sft_band), set
# before any run with this protocol: around the 23% seed 0 reached under the old one.
SFT_BAND = {"examples": 256, "samples": 4, "guess_max_tokens": 0,
            "bounds": {"accuracy": (0.15, 0.35)}}
SMOKE = {"sft.steps": 4, "reward_model.steps": 1, "value_pretrain.max_steps": 2,
         "value_pretrain.min_steps": 1, "rl.steps": 2, "eval.every": 1,
         "eval.num_examples": 8, "eval.batch_prompts": 8, "rl.prompts_per_step": 4,
         "rl.responses_per_prompt": 2, "sft.batch_size": 8, "data.num_train": 256,
         "data.num_eval": 8}
SMOKE_BAND = {"examples": 8, "guess_max_tokens": 0, "bounds": {}}


def get_config(preset: str = "vapo"):
  c = config_lib.default_config_dict()
  c.seed = 0
  c.model.init_seed = 0               # one SFT start for every seed
  c.model.hidden_size = 128
  c.model.intermediate_size = 384
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 32

  c.data.source = "synthetic"
  c.data.synthetic_task = "chain"
  c.data.template = "{problem}\n"
  c.data.max_prompt_tokens = 72       # "start 19: " + 14 × "N+3 " + "\n" + BOS = 68
  c.data.synthetic_min_steps = 10
  c.data.synthetic_max_steps = 14
  c.data.synthetic_max_operand = 3
  c.data.synthetic_max_value = 19
  c.data.synthetic_ops = "+-"
  c.data.num_train = 8192
  c.data.num_eval = 128
  c.data.seed = 0                     # the same problems and held-out set for every seed

  c.sampling.max_new_tokens = 160     # solutions are 89–150 characters (+ EOS)
  c.sampling.temperature = 1.0

  c.sft.enabled = True
  c.sft.steps = 900
  c.sft.batch_size = 32
  c.optim.sft_lr = 2e-3
  c.optim.policy_lr = 2e-4
  c.optim.critic_lr = 1e-3
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.0

  c.value_pretrain.enabled = True
  c.value_pretrain.max_steps = 30     # the cap (was 8 steps, EV >= 0.6: it never held)
  c.value_pretrain.min_steps = 5
  c.value_pretrain.plateau_window = 5
  c.value_pretrain.plateau_smooth = 3
  c.value_pretrain.plateau_tol = 0.02
  c.value_pretrain.stop_explained_variance = 1.0  # off: above a perfect critic's ~0.4

  c.rl.steps = 24                     # rollout steps; see the docstring for the budget
  c.rl.prompts_per_step = 16
  c.rl.responses_per_prompt = 8
  c.rl.num_minibatches = 2
  c.rl.ppo_epochs = 1
  # λ_policy = 1 − 1/(α·l): with responses of 100–230 tokens, α = 0.5 gives 0.98–0.99, the
  # range the paper's α = 0.05 gives its responses of thousands of tokens (α = 0.05 here
  # would give 0.8–0.9, a shorter horizon than plain PPO's 0.95).
  c.rl.alpha = 0.5
  c.rl.nll_coef = 1.0                 # as configs/tiny.py (the paper's μ is 0.1)
  c.rl.whiten_advantages = False      # as configs/tiny.py; whitened, 60 steps from a lower
                                      # start lost ground (see above)

  c.eval.every = 6
  c.eval.num_examples = 128
  c.eval.samples_per_problem = 4
  c.eval.batch_prompts = 64

  c.checkpoint.every = 12
  c.metrics.tensorboard = False
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  return config_lib.apply_preset(c, preset)
