#!/bin/bash
# H29 table driver (2026-12-02): the chain_or_guess 3-seed table (ABLATION_ROWS), then the
# long-CoT mechanism suite, then the fresh seeds; one command at a time, all at nice 19.
# Resumable: rerun this script (tools.ablate skips finished runs and resumes the rest).
cd /work/wt-h29 || exit 1
export PYTHONPATH=$PWD
T="nice -n 19 /usr/bin/time -v"
mkdir -p /work/runs/lc_sft /work/runs/vb_longcot /work/runs/cog_fresh
echo "[driver] $(date -u +%FT%TZ) table start"
$T -o /work/runs/cog/table.time python -m vapo_jax.tools.ablate \
  --config=configs/chain_or_guess.py --seeds=0,1,2 --workdir=/work/runs/cog \
  --same_group >> /work/runs/cog/tool.log 2>&1
echo "[driver] $(date -u +%FT%TZ) table rc=$?"
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
$T -o /work/runs/cog_fresh/table.time python -m vapo_jax.tools.ablate \
  --config=configs/chain_or_guess.py --seeds=3,4,5 --workdir=/work/runs/cog_fresh \
  --same_group >> /work/runs/cog_fresh/tool.log 2>&1
echo "[driver] $(date -u +%FT%TZ) fresh rc=$?"
