#!/bin/bash
# H29 pilot driver (2026-12-02): the shared SFT + band check + seed-0 VP stage + seed-0 vapo
# row, then the mechanism suite on chain_or_guess. One command at a time, all at nice 19.
cd /work/wt-h29 || exit 1
export PYTHONPATH=$PWD
T="nice -n 19 /usr/bin/time -v"
echo "[driver] $(date -u +%FT%TZ) pilot start"
$T -o /work/runs/cog/pilot2.time python -m vapo_jax.tools.ablate \
  --config=configs/chain_or_guess.py --rows=vapo --seeds=0, --workdir=/work/runs/cog \
  --same_group >> /work/runs/cog/tool.log 2>&1
echo "[driver] $(date -u +%FT%TZ) pilot rc=$?"
BAND=$(grep -l "\"accepted\": true" /work/runs/cog/shared/stage-sft-*/band/sft_band.json 2>/dev/null | head -1); BAND=${BAND%/sft_band.json}
if ! grep -q '"accepted": true' "$BAND/sft_band.json" 2>/dev/null; then
  echo "[driver] band refused or missing ($BAND): stopping"; exit 3; fi
SFT=${BAND%/band}
echo "[driver] $(date -u +%FT%TZ) vb_cog start"
$T -o /work/runs/vb_cog/vb.time python benchmarks/value_bias.py \
  --config=configs/chain_or_guess.py --buckets=15,80 --sft_workdir=$SFT \
  --out=/work/runs/vb_cog > /work/runs/vb_cog/log.txt 2>&1
echo "[driver] $(date -u +%FT%TZ) vb_cog rc=$?"
