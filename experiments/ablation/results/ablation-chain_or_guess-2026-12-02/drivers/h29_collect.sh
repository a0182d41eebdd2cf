#!/bin/bash
# Copies what the runs wrote into the worktree's results folders (small files only).
R=/work/wt-h29/benchmarks/results
A=$R/ablation-chain_or_guess-2026-12-02
mkdir -p $A/pilot
for f in tool.log ${WITH_TABLE:+ablation.md ablation.jsonl ablation.png}; do  # WITH_TABLE=1 once the table is done
  [ -e /work/runs/cog/$f ] && cp /work/runs/cog/$f $A/; done
[ -d /work/runs/cog/metrics ] && rm -rf $A/metrics && cp -r /work/runs/cog/metrics $A/metrics
cp /work/runs/cog/*.time $A/pilot/ 2>/dev/null
# The refused 700-step start: its band verdict and its SFT metrics.
O=/work/runs/cog/shared/stage-sft-0f55d919
cp $O/band/sft_band.json $A/pilot/sft700_band.json
cp /work/runs/cog/shared/stage-sft-aad4bc22/PROVENANCE.txt $A/pilot/sft1000_PROVENANCE.txt 2>/dev/null
for d in vb_cog:value-bias-chain_or_guess-2026-12-02 vb_longcot:value-bias-longcot-2026-12-02; do
  src=/work/runs/${d%%:*}; dst=$R/${d##*:}
  [ -e $src/value_bias.md ] || continue
  mkdir -p $dst; cp $src/value_bias.md $src/value_bias.json $dst/; cp $src/*.time $dst/ 2>/dev/null
done
du -sh $R/*-2026-12-02
