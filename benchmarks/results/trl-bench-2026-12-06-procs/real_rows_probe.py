"""The real-model config's RL update (policy + critic) on one experience batch, by packed
row length: python real_rows_probe.py ROW_TOKENS ROW_STEPS [REPS] (one process per setting).

Since 2026-12-07, ATTN=IMPL:BLOCK sets model.attention_impl and attention_block (e.g.
ATTN=dense:512), BUDGET=N sets rl.packing_tokens_per_device and PASS=forward times the
policy's log-prob pass over the batch instead of the update."""
import json
import os
import sys
import time

sys.path.insert(0, "benchmarks")  # run from the repository root
from vapo_jax.run import host_memory  # noqa: E402

host_memory.configure(host_memory.expected_platform())
import jax  # noqa: E402
import step_record as sr  # noqa: E402
from vapo_jax import config as config_lib  # noqa: E402
from vapo_jax.run import trainer as trainer_lib  # noqa: E402
import importlib.util  # noqa: E402

row, steps = int(sys.argv[1]), int(sys.argv[2])
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
spec = importlib.util.spec_from_file_location("c", "configs/smollm2_135m.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
c = mod.get_config()
c.rl.packing_row_tokens, c.rl.packing_row_steps = row, steps
c.value_pretrain.enabled = False
c.eval.every = 0
c.checkpoint.every = 0
if os.environ.get("ATTN"):
  c.model.attention_impl, blk = os.environ["ATTN"].split(":")
  c.model.attention_block = int(blk)
c.rl.packing_tokens_per_device = int(os.environ.get("BUDGET", "0"))
cfg = config_lib.from_config_dict(c)
shapes = sr.PackedShapes()
shapes.install()
t = trainer_lib.Trainer(cfg, progress=False)
for n in ("critic", "reference", "policy"):
  try:
    t.setup(n)
  except Exception as e:  # noqa: BLE001
    print("setup", n, type(e).__name__, e, file=sys.stderr)
examples = t.parts.train_examples[:cfg.rl.rollout_prompts]
t0 = time.perf_counter()
batch, em = t.experience(examples)
jax.block_until_ready(batch)
exp_s = time.perf_counter() - t0
forward = os.environ.get("PASS") == "forward"
p = batch.tokens_BxL.shape[1] - batch.response_mask_BxR.shape[1]
times, got = [], []
for i in range(reps + 1):
  shapes.take()
  t0 = time.perf_counter()
  if forward:
    jax.block_until_ready(t.parts.experience.logprobs(
        t.state.train_state("policy").params, batch.tokens_BxL, batch.mask_BxL,
        prompt_len=p, temperature=cfg.sampling.temperature))
  else:
    t.update(batch, stage="rl", step=i, policy=True)
    jax.block_until_ready(t.state.train_state("policy").params)
  times.append(time.perf_counter() - t0)
  got = shapes.take()
print(json.dumps({"pass": "forward" if forward else "update", "row": row, "steps": steps,
                  "budget": cfg.rl.packing_tokens_per_device, "experience_s": exp_s, "times": times,
                  "shapes": sorted({(c["phase"], tuple(c["shape"])) for c in got})}), flush=True)
t.close()
