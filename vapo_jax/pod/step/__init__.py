"""The step model: one RL step on a TPU slice, counted from the code's shapes: FLOPs, HBM
bytes, collectives, time at stated efficiencies, and the step's physical floor beside it.

The command is `python -m vapo_jax.pod.step_model`. Its parts: `setup` (Knobs, Setup,
EngineShape, Program), `counts` (FLOPs), `terms` (the terms beyond FLOPs and bytes), `train`
(the train side), `rollout` (the samplers), `report` (the step, its floor, the printed report),
`efficiency` (the train programs' MFU and HFU), `compiles` (the compile line, once per run).

The code paths follow the config (rl.packing: packed train rows; sampling.engine: the
continuous engine of `sampler/continuous.py`, or the static sampler of `sampler/static.py`);
`--train` / `--rollout=static|continuous` override them.

Everything is per chip and analytic (no compile; `decode_hlo` gives the collectives of the
compiled decode loop, `--decode_collectives` takes its count). The FLOP counts are in
`counts`. Notation: L layers, D width,
F MLP width, H query / K kv heads of Dh, V vocabulary (padded embedding rows included), N
parameters, P = data.max_prompt_tokens, R = sampling.max_new_tokens, C = attention_block.

FLOPs (2 per multiply-add):
  matmul per token   m = 2 L (D Dh (H + 2K) + H Dh D + 3 D F)      (+ 2 D V for the LM head)
  attention          a = 4 L H Dh per (query, key) pair computed    (q·k and p·v)
  pairs              exactly what the kernels compute (`attention_pairs`): blocked causal =
                     per query group [a, e) of `attention._query_groups`, (e − a) · ⌈e/C⌉ C;
                     causal dense = per `causal_query_blocks` block (e − a) · e; decode = W
                     keys per row at window W
  train pass         fwd + remat fwd + bwd: 4 m − down per token (the recompute's last
                     matmul, the MLP down projection 2 L D F, is dead: XLA drops it),
                     4.5 a per pair (bwd 2.5 a:
                     `attention._backward` has five pair products), LM head 4× (checkpointed
                     chunks of 128 positions over the R response positions)
Efficiency: MFU below is the knob `--mfu`, the fraction of peak at which a program runs the
FLOPs it executes (an HFU of its compute; the floor's `--mfu_ceiling` the same measure on its
own FLOPs); the report prints both MFU and HFU of the train programs (`efficiency`).

Time of a program = its matmul FLOPs / (peak · MFU) + max(attention FLOPs / (peak · MFU),
attention score bytes / (BW · bw_eff)) for the train side (the pure-JAX blocked scan writes
its [B, K, G, T, C] float32 scores to HBM: `--attn_score_bytes` per (pair, head) forward;
where model.attention_kernel runs jax's Pallas splash kernel on the TPU slice, `train_kernel`,
the pairs are its per-row live blocks × c² (`step_counts.splash_pairs`), 5.5 a per pair in
an update with remat, and its bytes the key / value blocks it reads, 4 Dh / c per pair and
head), and per decode step max(FLOPs / (peak · MFU), bytes / (BW · bw_eff)) + collectives ·
latency. `--compare_layouts` also prints the packed train side on FSDP × tensor and
FSDP-only meshes (`step_terms.train_layout`).

Padded and static (`--train=padded --rollout=static`): every train row is P + R tokens; the
rollout is B / (prompts_per_call · n) sampler calls, each a prefill of P-token prompts and
the windowed while loops of `sampler.static._generate` (`ops.decode_windows`), which stop
at the call's longest row (steps t = 1 .. max ℓ − 1); each step reads the weight shards in place
(`--decode_weights=stationary`: the TPU compile shows no weight gather in the loop, and XLA
hoists the fp32 -> bf16 casts out of it, so (N − untied embedding) · 2 / chips bytes,
`--decode_weight_itemsize`; `gathered` adds a per-step gather of N · 4 / tensor) and the
whole window W of the cache for every row.
Alternatives: `--train=packed` (the code's planner, `packing.plan`, on the sampled lengths
with each pass's PackSpec as the trainer builds it: rows of rl.packing_row_tokens, K packed
micro-batches of n rows from the token budget, each computed whole: n K T tokens, the LM head
at every slot, and the attention key blocks `attention._live_blocks` keeps for that layout,
`step_counts.packed_pairs`), `--rollout=continuous` (continuous batching, bf16 decode weights, KV
read at live lengths, slots refilled FIFO while the live KV fits; one bf16 reshard per step).
Its layout, `--engine_layout`: `built` (default) is `sampler/continuous.py` as it is: decode
replicas of mesh.tensor chips (one per data x fsdp shard, `EngineConfig.replicas`), each with
S / R of the slots and its own part of the pool, heads split over mesh.tensor, the slots,
pages and pool of the run's own `EngineConfig` (`Setup.engine`: sampling.slots / page_size /
chunk_steps, the pool sized by `sampler.kv_pool` from HBM less the train state); `replicas`
is what replicas of `--engine_tp` chips would buy, each with no slot limit and a KV budget
of HBM less train state, weights and `--workspace_gb`.

Floor: real tokens only, exact causal attention per sequence (T (T+1) / 2 pairs), no remat
(fwd 1, bwd 2 matmul, 2.5 attention), LM head on response tokens, at `--mfu_ceiling`; rollout
as the engine with 100 % bandwidth, no collective latency, compute at peak.

Terms a real step pays beyond FLOPs and bytes (`step_terms`, each printed on its own line):
the engine's prefill as it runs, the host gap per decode chunk, the Pallas decode kernel's
KV blocks, the train programs' collectives: from compiled HLO where `--train_collectives`
has the program (for the config's mesh.train_layout), else from the train layout's
arithmetic (`step_terms.layout_collectives`: FSDP gathers and reduce-scatters taken as
overlapped with compute, tensor-parallel all-reduces exposed). What is still not counted
is printed as the report's last line (`step_terms.NOT_COUNTED`).
"""


# The public names, so that `from vapo_jax.pod import step` reads as the old `step_model` did.
from vapo_jax.pod.step.setup import (  # noqa: E402,F401
    GB, EngineShape, Knobs, Program, Setup, engine_shapes, train_kernel)
from vapo_jax.pod.step.train import packed_groups, train_side  # noqa: E402,F401
from vapo_jax.pod.step.rollout import (  # noqa: E402,F401
    continuous_rollout, kv_budget, static_rollout)
from vapo_jax.pod.step.report import (  # noqa: E402,F401
    ENGINE_ONLY, Step, crosscheck, estimate, floor, format_report, layouts, lengths_for,
    program_flops, run)
