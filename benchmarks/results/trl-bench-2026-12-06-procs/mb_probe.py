"""Our GRPO policy update on the TRL bench's batch, by micro-batch size (one process per
setting): python mb_probe.py ROW_TOKENS ROW_STEPS TOKENS_PER_DEVICE [REPS]

Since 2026-12-07, ATTN=IMPL:BLOCK sets model.attention_impl and attention_block (e.g.
ATTN=dense:512), SCAN=0 runs the blocks as a Python loop (model.scan_layers=False) and
PASS=forward times the reference's log-prob pass over the batch instead of the update;
PROF=DIR wraps the last timed call in jax.profiler (a trace under DIR, summed by
benchmarks/results/cpu-passes-2026-12-07/trace_sum.py)."""
import itertools
import json
import sys
import time
import types

sys.path.insert(0, "benchmarks")  # run from the repository root
from vapo_jax.run import host_memory  # noqa: E402

host_memory.configure(host_memory.expected_platform())
import jax  # noqa: E402
import numpy as np  # noqa: E402
import trl_bench  # noqa: E402
from vapo_jax.run import trainer as trainer_lib  # noqa: E402
import step_record as sr  # noqa: E402

row, steps, budget = (int(x) for x in sys.argv[1:4])
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
args = types.SimpleNamespace(prompts=4, group=4, max_prompt=128, max_new=64, micro_batch=None,
                             device="cpu", lr=1e-6, old_logprobs="exact",
                             row_tokens=row or None, row_steps=steps)
model_dir = trl_bench.model_dir_of(types.SimpleNamespace(
    model=None, config="configs/smollm2_135m.py", preset="grpo"))
cfg = trl_bench.our_config("configs/smollm2_135m.py", "grpo", model_dir, args)
import dataclasses  # noqa: E402
import os  # noqa: E402
if os.environ.get("ATTN"):
  impl, blk = os.environ["ATTN"].split(":")
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(
      cfg.model, attention_impl=impl, attention_block=int(blk)))
if os.environ.get("SCAN"):
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(
      cfg.model, scan_layers=bool(int(os.environ["SCAN"]))))
if budget:
  cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, packing_tokens_per_device=budget))
shapes = sr.PackedShapes()
shapes.install()
t = trainer_lib.Trainer(cfg, progress=False)
examples = t.parts.train_examples[:4]
t.state.prompts = itertools.repeat(examples)
t.setup("reference")
t.setup("policy")
batch, em = t.experience(next(t.state.prompts))
jax.block_until_ready(batch)
forward = os.environ.get("PASS") == "forward"
p = batch.tokens_BxL.shape[1] - batch.response_mask_BxR.shape[1]
times = []
prof = os.environ.get("PROF")
for i in range(reps + 1):
  shapes.take()
  if prof and i == reps:
    jax.profiler.start_trace(prof)
  t0 = time.perf_counter()
  if forward:
    jax.block_until_ready(t.parts.experience.logprobs(
        t.state.ref_params, batch.tokens_BxL, batch.mask_BxL, prompt_len=p,
        temperature=cfg.sampling.temperature))
  else:
    t.update(batch, stage="rl", step=i, policy=True)
    jax.block_until_ready(t.state.train_state("policy").params)
  times.append(time.perf_counter() - t0)
  if prof and i == reps:
    jax.profiler.stop_trace()
  got = shapes.take()
print(json.dumps({"pass": "forward" if forward else "update", "row": row, "steps": steps,
                  "budget": budget, "first": times[0],
                  "times": times[1:], "median": float(np.median(times[1:])),
                  "shapes": [c["shape"] for c in got],
                  "tokens": int(np.asarray(batch.mask_BxL).sum())}), flush=True)
t.close()
