#!/bin/bash
# H29 driver 3 (2026-12-02 02:16): the long-CoT mechanism suite, then a chain_or_guess
# precondition follow-up (value pretraining's branch calibration at longer budgets).
# The chain_or_guess table is paused (its precondition failed; docs/value_mechanisms.md §5).
cd /work/wt-h29 || exit 1
export PYTHONPATH=$PWD
T="nice -n 19 /usr/bin/time -v"
mkdir -p /work/runs/lc_sft /work/runs/vb_longcot /work/runs/vb_cog_budgets
echo "[driver] $(date -u +%FT%TZ) lc_sft start"
$T -o /work/runs/lc_sft/sft.time python -m vapo_jax.tools.ablate \
  --config=configs/longcot.py --rows=vapo --seeds=0, --config.rl.steps=0 \
  --workdir=/work/runs/lc_sft --same_group >> /work/runs/lc_sft/tool.log 2>&1
echo "[driver] $(date -u +%FT%TZ) lc_sft rc=$?"
LB=$(grep -l '"accepted": true' /work/runs/lc_sft/shared/stage-sft-*/band/sft_band.json 2>/dev/null | head -1)
if [ -n "$LB" ]; then
  $T -o /work/runs/vb_longcot/vb.time python benchmarks/value_bias.py \
    --config=configs/longcot.py --sft_workdir=${LB%/band/sft_band.json} \
    --out=/work/runs/vb_longcot > /work/runs/vb_longcot/log.txt 2>&1
  echo "[driver] $(date -u +%FT%TZ) vb_longcot rc=$?"
else echo "[driver] longcot band refused or missing: no vb_longcot"; fi
$T -o /work/runs/vb_cog_budgets/vb.time python benchmarks/value_bias.py \
  --config=configs/chain_or_guess.py --buckets=15,80 \
  --sft_workdir=/work/runs/cog/shared/stage-sft-aad4bc22 --budgets=12,30,64,128 \
  --reward_model=False --out=/work/runs/vb_cog_budgets > /work/runs/vb_cog_budgets/log.txt 2>&1
echo "[driver] $(date -u +%FT%TZ) vb_cog_budgets rc=$?"
