"""The real-model config's RL update (policy + critic) on one experience batch, by packed
row length: python real_rows_probe.py ROW_TOKENS ROW_STEPS [REPS] (one process per setting)."""
import json
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
cfg = config_lib.from_config_dict(c)
shapes = sr.PackedShapes()
shapes.install()
t = trainer_lib.Trainer(cfg, progress=False)
for n in ("critic", "reference", "policy"):
  try:
    t.setup(n)
  except Exception as e:  # noqa: BLE001
    print("setup", n, type(e).__name__, e, file=sys.stderr)
examples = t.parts.train_examples[:cfg.prompts_per_step]
t0 = time.perf_counter()
batch, em = t.experience(examples)
jax.block_until_ready(batch)
exp_s = time.perf_counter() - t0
times, got = [], []
for i in range(reps + 1):
  shapes.take()
  t0 = time.perf_counter()
  t.update(batch, stage="rl", step=i, policy=True)
  jax.block_until_ready(t.state.train_state("policy").params)
  times.append(time.perf_counter() - t0)
  got = shapes.take()
print(json.dumps({"row": row, "steps": steps, "experience_s": exp_s, "times": times,
                  "shapes": sorted({(c["phase"], tuple(c["shape"])) for c in got})}), flush=True)
t.close()
