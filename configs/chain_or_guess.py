"""A toy where the paper's value-model rows can act: "chain or guess" (`data.chain_mix`).

Design (review `ablation-2026-12-01.md` §4.2, issue 29): chains of one-digit values (±1..3 in
[0, 9]), half short (3–6 steps, responses 34–58 tokens) and half long (14–20 steps, 122–170
tokens), and 15% of the SFT targets a direct guess `\\boxed{d}` (d uniform: right 10% of the
time, ≈ 10 tokens). The SFT policy then guesses ≈ 15% of the time whatever the prompt: the
short, unreasoned answer the paper's PPO collapses into; response lengths vary ~10×; and the
value of a response's first token is an easy feature for a critic (≈ 0.1 after `\\`, the
chain's success rate after `A`).

  python -m experiments.ablation.ablate --config=configs/chain_or_guess.py --seeds=0,1,2 \\
      --jobs=2 --workdir=/tmp/cog                     # the table (ABLATION_ROWS)
  python -m experiments.ablation.ablate --config=configs/chain_or_guess.py --seeds=3,4,5 \\
      --jobs=2 --workdir=/tmp/cog                     # fresh seeds, the same shared SFT start
  python -m experiments.ablation.ablate --config=configs/chain_or_guess.py --smoke \\
      --seeds=0,1 --workdir=/tmp/cog_smoke            # every stage at a few steps (SMOKE)
  python -m experiments.value_mechanisms.value_bias --config=configs/chain_or_guess.py \\
      --buckets=15,80 --sft_workdir=<W>/shared/stage-sft-<key>/band \\
      --out=/tmp/vb_cog                               # the mechanism suite

Run status (2026-12-03): the pilot, the mechanism suite, the 3-seed table (seeds 0, 1, 2)
and the same command on fresh seeds 3, 4, 5 (with no_length_adaptive) have run
(docs/value_mechanisms.md §5.5–5.6); no row reproduces. The settings and criteria below were
fixed before any of them; the precondition log says what changed since, and why. The early
value-pretraining confirmation (the last section, registered 2026-12-03) has not run.

Settings, fixed in advance (the paper's values, or its dimensionless equivalents):
- α = 0.05 (κ = l·(1 − λ) = 20 at every length, as in the paper).
- λ_fixed = 0.8 for `ppo` and `no_length_adaptive` (FIXED_LAMBDA): the κ-matched analogue of
  the paper's 0.95 at thousands of tokens (κ ≈ 2 for guesses, 5–11 for short chains, 23–34
  for long ones). The literal 0.95 would be *more* Monte Carlo than α = 0.05 at these lengths
  (κ 6–8 against 20): row `ppo_lam095` is that sensitivity row, run only when named.
- lr policy 1e-4, critic 2e-4 (the paper's 2 : 1); μ = 0.1; whitening on for critic rows (the
  grpo / dapo presets turn it off); no KL, no entropy bonus, T = 1.
- 16 prompts × 8 responses per step, 4 minibatches × 1 epoch (3 of 4 updates off-policy).
- Value pretraining: Monte Carlo targets; first set as the plateau rule (3-step moving
  average of the value loss improving < 2% over 5 steps) after ≥ 5 steps, capped at 30, now a
  fixed VALUE_PRETRAIN_STEPS = 128 (precondition log); the log records what ended it
  (`value_pretrain/stopped_by`). Reward-model stage: 10 steps.
- One SFT start (data.seed = model.init_seed = 0) for every seed, accepted only in SFT_BAND
  on a 256-problem development set at T = 1: the first of the SFT run's checkpoints 1000,
  1020, ..., SFT_STEPS = 1600 that the band accepts (`SFT_BAND["select"]`, precondition log);
  seeds vary only the RM, value pretraining and RL. Held-out set: 256 problems, the same for
  every seed. 40 RL steps.

Pre-registered criteria (what counts as reproduced; Δ = row − vapo per seed, final held-out
avg@4; "guess rate" = share of held-out samples ≤ 15 tokens, `short_frac`):
- Preconditions, checked on the pilot (seed 0) before any row outcome is read, never tuned on
  row results: the SFT start inside SFT_BAND; the reward-model critic's M1 profile (bias by
  fifth of the response, `experiments/value_mechanisms/value_bias.py`) negative early and
  rising late — if it is flat, the pre-declared variant is a reward model also trained to score
  random prefixes 0; value pretraining calibrated on the branches (|V(after the first token) −
  the branch's success| < 0.05 for guesses and chains, M1).
- PPO collapse: in ≥ 2 of 3 seeds PPO's final guess rate ≥ 50% or its mean length < 0.5×
  VAPO's, and its avg@4 below the SFT start; Δ ≤ −10 points with all 3 seeds negative; VAPO's
  own guess rate below 15%.
- Without value pretraining worse: Δ < 0 in 3/3 seeds with mean ≤ −5 points.
- Without decoupled GAE worse: `no_decoupled_gae_vp` (coupled in value pretraining too) has
  Δ < 0 in 3/3 seeds, and M3 shows the coupled critic's V(s₀) lagging the group-mean return
  where the Monte Carlo critic's does not. `no_decoupled_gae` (coupled in RL only): expected
  "mechanism shown, effect not shown" when its interval includes 0.
- Length-adaptive: M2's MSE-optimal λ rises with length (roughly 1 − c/l) and α = 0.05 is
  within the best λ's MSE by less than any single fixed λ across buckets; if the
  `no_length_adaptive` row runs, Δ < 0 on the long-chain half.
- Minimum detectable effect with 3 seeds: about 8 points (review §2); smaller effects need
  more seeds, not a reading of the intervals.
Precondition log (changes made from preconditions only, never from a row's result):
- 2026-12-02, SFT band: 700 SFT steps (loss 0.091, still falling) were refused by SFT_BAND on
  the dev set: long 14.5%, short 42.2%, guess rate 13.4% (`experiments/ablation/
  results/ablation-chain_or_guess-2026-12-02/pilot/`). Per the doc's rule only sft.steps changes:
  SFT_STEPS = 1000. That run is the 700-step run's step-680 checkpoint resumed to 1000 (the
  lr is constant with no warmup, and resume restores the optimizer and the data order, so it
  is the 1000-step run from scratch: its losses at steps 681–700 are bit-identical to the
  700-step run's; its log says so). SFT_BAND accepted it: long 29.7%, short 66.3%, guess
  rate 14.6% (dev set, 256 problems × 4 samples at T = 1).
- 2026-12-02, the suite on that start (`experiments/value_mechanisms/results/
  value-bias-chain_or_guess-2026-12-02/`): the RM's M1 profile is negative early and rising
  late (−0.45 … −0.28): met, no RM variant. Value pretraining's branch calibration is NOT met
  at 8, 32 or 64 steps (guess gap +0.36, +0.27, +0.13); seed 0's stage stopped by the plateau
  rule at 12 steps (EV 0.04). No setting is changed yet: the fix (a longer value pretraining,
  or the review's 3 × 192 model) is for the next session to decide from the suite, before any
  row.
- 2026-12-02 (session 13, a fresh machine), the budgets follow-up (`experiments/
  value_mechanisms/results/value-bias-chain_or_guess-2026-12-02/budgets/`, on the suite's own
  1000-step SFT): branch calibration met at 64 and 128 steps (guess gap +0.036, +0.014), not at
  12 or 30; M3's lag reproduced. Supports a fixed 128-step value pretraining (not applied yet,
  see next line).
- 2026-12-02 (session 13), SFT band on a fresh machine: the same 1000-step SFT was refused
  (long 18.3%, short 56.1%, guess 14.2%; final loss 0.077 against 0.042 on the first
  machine), and so were 1150 and 1300 steps (long 21.3% / guess 19.4%; short 83.0% / guess
  11.9%): the SFT is chaotic in float rounding, and the start must be kept, not re-trained,
  for every session's runs to share it (docs/value_mechanisms.md §5.4). SFT_STEPS stays
  1000; no row has run.
- 2026-12-02 (session 14), decided before any row, from the two entries above only: (a) the
  start is selected by a rule, not a step count: the SFT run goes on to 1600 steps keeping a
  checkpoint every 20, and the start is the first of 1000, 1020, ..., 1600 that SFT_BAND
  accepts (`experiments.ablation.sft_band`'s selection; every candidate's dev metrics are kept
  in `<SFT>/band/candidates.jsonl`). The band itself is unchanged. (b) Value pretraining runs a
  fixed 128 steps (min_steps = max_steps): the budget that met the branch calibration on both
  starts measured, where the plateau rule stopped at 12 on noise near the Bernoulli floor. The
  suite is re-run on the selected start (`--budgets=64,128`) to confirm (b) there before any
  row is read.
- 2026-12-02 (session 14), the selection ran (`experiments/ablation/results/
  ablation-chain_or_guess-2026-12-02/selection/`): the 1000-step checkpoint measured exactly as
  session 13's (long 18.3%, short 56.1%, guess 14.2%: the same machine type gives the same
  SFT); 1020–1180 were refused (long 14.5–23.7%, or guess 10.3–21.3%); **1200 was accepted**
  (long 29.3%, short 78.5%, guess 15.5%, final loss 0.033). Every row starts from it.
- 2026-12-02 (session 14), the suite on the selected start (`experiments/value_mechanisms/
  results/value-bias-chain_or_guess-2026-12-02/selected-start/`), read before any row: the RM's
  M1 profile is negative early, rising late (−0.41 … −0.26): met; value pretraining's branch
  calibration is met at 128 steps (guess gap −0.035, chain +0.003; at 64: −0.005, +0.035):
  decision (b) stands. No setting changed.
- 2026-12-02 (session 15), a measurement, not a setting: the held-out evaluation now logs
  avg@k per kind of chain (`avg@4/long`, `avg@4/short`), so that the no_length_adaptive
  criterion's "long-chain half" is read as registered; it landed before the fresh-seed
  table's first row started (seeds 0–2 never logged it: their row did not run).
Rows this toy cannot test, and why (review §4.3): Clip-Higher (entropy collapse over
thousands of updates; here 160), token-level loss (repetition in very long responses), group
sampling (needs prompts of mixed difficulty and a per-prompt baseline), positive-example NLL
(not targeted), VAPO vs DAPO/GRPO (needs a critic that detects errors inside a chain).

Registered 2026-12-03, before any run: the early value-pretraining confirmation (issue 45 §4).
Why: a post hoc reading of seeds 0–5 (review `evidence-2026-12-03.md` §A1): at RL step 10, the
first evaluation, no_value_pretrain was below vapo by 6.4 points in 6/6 seeds (guess rates
5.2–23.2% against vapo's ≈ 1%) and ppo by 13.7 (6/6); by step 40 both gaps were noise. The
reading: the reward-model critic (V(s₀) − return −0.30 to −0.47 over RL steps 1–3) gives a
guess a positive advantage until Monte Carlo targets repair it within 10–20 steps. It was one
of ~20 comparisons, so it is a hypothesis until this test on fresh seeds says otherwise.
- Rows: `vapo` and `no_value_pretrain`, the registered primary pair (the presets differ only
  in the critic's start: value pretraining against the reward model). `ppo` is a secondary
  row (it changes 7 switches): it runs after the pair has finished, and whether it runs or
  not changes no primary verdict.
- Seeds 6, 7, ..., 13 (8, never run before); each seed has its own reward-model and 128-step
  value-pretraining stages, as in the table.
- Start: the shared SFT run and SFT_BAND's rule-based selection, unchanged. On the project's
  machine type the rule selected checkpoint 1200 (dev long 29.3%, short 78.5%, guess 15.5%;
  `experiments/ablation/results/ablation-chain_or_guess-2026-12-02/selection/`). That start
  is not on disk and its stage key has changed since (the config gained fields), so the
  command re-runs SFT and the selection. Before any row's result is read, the new
  `<W>/shared/stage-sft-<key>/band/candidates.jsonl` is compared with the committed one; the
  comparison is reported. If they differ, the test still runs from the start the band rule
  selects (the rule is the registered start; nothing is re-tuned). If the band refuses every
  candidate, no row runs and the outcome is "not run".
- RL: 20 steps, with a held-out evaluation every 5 (steps 0, 5, 10, 15, 20; 256 problems × 4
  samples at T = 1). Every other setting is as above.
- The command (no code change: `--config.*` overrides reach every row's run, and every stage
  run sets its own rl.steps = 0 and eval.every = 0, so no stage key and no existing row
  changes):
    python -m experiments.ablation.ablate --config=configs/chain_or_guess.py \\
        --rows=vapo,no_value_pretrain --seeds=6,7,8,9,10,11,12,13 \\
        --config.rl.steps=20 --config.eval.every=5 --jobs=2 --workdir=W
    python -m experiments.ablation.ablate --config=configs/chain_or_guess.py \\
        --rows=vapo,no_value_pretrain,ppo --seeds=6,7,8,9,10,11,12,13 \\
        --config.rl.steps=20 --config.eval.every=5 --jobs=2 --workdir=W   # + ppo, same W
    python -m experiments.ablation.confirm_early_vp W                # the verdicts
  A crashed run is rerun once (`--rerun_crashed`): a crash is not an outcome.
Read mechanically by `experiments/ablation/confirm_early_vp.py` from each run's metrics.jsonl
(`W/seed<s>/<row>/metrics.jsonl`, or ablate's copy `W/metrics/seed<s>/<row>.jsonl`): the
"eval" records at steps 5, 10, 15, 20 (`avg@4`; `short_frac`) and the "rl" record of step 1
(`value/s0_minus_return`). Δ = row − vapo per seed (same seed: same start and held-out set).
Paired one-sided t-test on the 8 Δ: t = mean/(sd/√n), sd with n − 1, df = n − 1, p from
Student's t in the predicted direction. Δ = 0 does not count as negative.
- Primary: Δ avg@4 (no_value_pretrain − vapo) at RL step 10: mean < 0, one-sided paired
  t-test p < 0.05, AND Δ < 0 in ≥ 6 of the 8 seeds. All of these hold: "met"; any fails:
  "not met". Fewer than 8 seeds with both rows finished and evaluated at step 10 (after the
  one rerun) gives "not run": no verdict is computed on a subset. A subset's numbers may be
  shown, as exploratory.
- Secondary (each its own test at 0.05, no correction; none changes the primary verdict):
  (S1) the guess rate at step 10 = `short_frac` of the step-10 eval record (the share of the
  1024 held-out samples of ≤ eval.short_response_tokens = 15 tokens: a guess is ≈ 10 tokens,
  the shortest chain 34): Δ > 0, one-sided paired p < 0.05.
  (S2) the area under the avg@4 curve over steps 5–20, by the trapezoid rule over the
  evaluations at 5, 10, 15, 20: AUC = 5·(a₅/2 + a₁₀ + a₁₅ + a₂₀/2), in accuracy × RL steps
  (AUC / 15 is the mean level): Δ < 0, one-sided paired p < 0.05.
  (S3) the secondary row: Δ avg@4 (ppo − vapo) at step 10 under the primary's three
  conditions; "not run" without its 8 seeds.
- Manipulation check: the mean over the 8 seeds of `value/s0_minus_return` in the RL step-1
  record. That is the critic's mean V(s₀) − score over the step's 128 rollouts, before its
  first update (`vapo_jax/rl/advantages.py`). It must be < −0.2 for no_value_pretrain and
  within ±0.1 for vapo. It is judged on the mean, because one step's 128 responses give each
  seed a few hundredths of noise; each seed's value is printed. If it is not met, the primary
  and secondary verdicts are still reported as computed, with a note that the critics did
  not start as intended.
- Descriptive only (no verdict): the per-seed table, and Δ at steps 5, 15 and 20.
The outcome is reported whichever way it falls: the command, the per-seed table and the
script's verdicts go into the README and docs/value_mechanisms.md. If the primary is
"not met", the README says that the early deficit did not replicate on fresh seeds, and the
post hoc reading is withdrawn. No later run with other seeds, steps or settings counts as
this confirmation.
"""

from vapo_jax import config as config_lib

FIXED_LAMBDA = 0.8
# The SFT run's length: the last candidate of the start's selection (SFT_BAND["select"]: the
# first of its checkpoints 1000, 1020, ..., 1600 inside the band; the precondition log says
# why a fixed step count cannot be kept).
SFT_STEPS = 1600
# The table's rows (experiments.ablation.ablate's default --rows for this config).
ABLATION_ROWS = "vapo,ppo,no_value_pretrain,no_decoupled_gae,no_decoupled_gae_vp"
# The shared SFT start is accepted only inside this band (experiments.ablation.sft_band), set
# in advance.
SFT_BAND = {"examples": 256, "samples": 4, "guess_max_tokens": 15,
            "bounds": {"accuracy/long": (0.25, 0.40), "accuracy/short": (0.60, 0.80),
                       "guess_rate": (0.12, 0.18)},
            "select": {"first": 1000, "every": 20}}
# Value pretraining: a fixed budget (min = max), the precondition log's 2026-12-02 entries.
VALUE_PRETRAIN_STEPS = 128
# experiments.ablation.ablate --smoke: every stage at a few steps (a check that the command
# runs end to end, not a measurement), and a band that accepts any start.
SMOKE = {"sft.steps": 4, "reward_model.steps": 1, "value_pretrain.max_steps": 2,
         "value_pretrain.min_steps": 1, "rl.steps": 2, "eval.every": 1,
         "eval.num_examples": 8, "eval.batch_prompts": 8, "rl.prompts_per_step": 4,
         "rl.responses_per_prompt": 2, "sft.batch_size": 8, "data.num_train": 256,
         "data.num_eval": 8, "sampling.max_new_tokens": 176}
SMOKE_BAND = {"examples": 8, "guess_max_tokens": 15, "bounds": {},
              "select": {"first": 2, "every": 2}}


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
  c.data.synthetic_task = "chain_or_guess"
  c.data.seed = 0                     # the same problems and held-out set for every seed
  c.data.template = "{problem}\n"
  c.data.max_prompt_tokens = 96       # BOS + "start 9: " + 20 × "T+3 " + "\n" = 90
  c.data.synthetic_min_steps = 3      # short chains
  c.data.synthetic_max_steps = 6
  c.data.synthetic_long_min_steps = 14
  c.data.synthetic_long_max_steps = 20
  c.data.synthetic_max_operand = 3
  c.data.synthetic_max_value = 9
  c.data.synthetic_ops = "+-"
  c.data.synthetic_short_fraction = 0.5
  c.data.synthetic_guess_fraction = 0.15
  c.data.num_train = 8192
  c.data.num_eval = 256

  c.sampling.max_new_tokens = 176     # long solutions are 121–169 characters (+ EOS)
  c.sampling.temperature = 1.0

  c.sft.enabled = True
  c.sft.steps = SFT_STEPS
  c.sft.batch_size = 32
  c.optim.sft_lr = 2e-3
  c.optim.policy_lr = 1e-4
  c.optim.critic_lr = 2e-4            # the paper's 2 : 1
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.0

  c.reward_model.steps = 10
  c.value_pretrain.enabled = True
  c.value_pretrain.max_steps = VALUE_PRETRAIN_STEPS  # the cap (30 before the calibration
  c.value_pretrain.min_steps = VALUE_PRETRAIN_STEPS  # follow-up; the plateau rule from 5)
  c.value_pretrain.plateau_window = 5
  c.value_pretrain.plateau_smooth = 3
  c.value_pretrain.plateau_tol = 0.02
  c.value_pretrain.stop_explained_variance = 1.0  # off: its ceiling is task-dependent

  c.rl.steps = 40
  c.rl.prompts_per_step = 16
  c.rl.responses_per_prompt = 8
  c.rl.num_minibatches = 4
  c.rl.ppo_epochs = 1
  c.rl.alpha = 0.05
  c.rl.lam_policy = FIXED_LAMBDA
  c.rl.nll_coef = 0.1
  c.rl.whiten_advantages = True

  c.eval.every = 10
  c.eval.num_examples = 256
  c.eval.samples_per_problem = 4
  c.eval.batch_prompts = 64
  c.eval.correct_threshold = 1.0
  c.eval.short_response_tokens = 15   # held-out guess rate (short_frac)

  c.checkpoint.every = 20
  c.metrics.tensorboard = False
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  config_lib.apply_preset(c, preset)
  if preset in ("ppo", "no_length_adaptive"):
    c.rl.lam_policy = FIXED_LAMBDA    # the preset's literal 0.95, κ-matched (docstring)
  return c
