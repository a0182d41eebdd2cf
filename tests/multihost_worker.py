"""One process of a local multi-process run (spawned by tests/test_multihost.py).

  python tests/multihost_worker.py OUT_DIR PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS

Runs value pretraining (1 step) and RL (2 steps) of the tiny test config on a (1, 2, 2)
mesh, then process 0 writes the final policy and critic parameters (all-gathered) and the
last metrics to OUT_DIR. With NUM_PROCESSES=1 it is the single-process reference.
"""

import json
import os
import sys

out_dir, pid, nproc, port, ndev = sys.argv[1], *map(int, sys.argv[2:6])
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ndev}"
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(here), here]

import jax  # noqa: E402
import numpy as np  # noqa: E402

from vapo_jax import distributed as dist  # noqa: E402

kind = dist.initialize("explicit" if nproc > 1 else "none",
                       coordinator=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
jax.config.update("jax_numpy_rank_promotion", "raise")

from test_trainer import tiny  # noqa: E402
from vapo_jax.run import trainer as trainer_lib  # noqa: E402

assert jax.process_count() == nproc and jax.local_device_count() == ndev, (
    jax.process_count(), jax.local_device_count())
cfg = tiny(**{"mesh.data": 1, "mesh.fsdp": 2, "mesh.tensor": 2, "rl.steps": 2})
t = trainer_lib.Trainer(cfg, out_dir, progress=False)
try:
  t.value_pretrain()
  history = t.rl()["history"]
  params = dist.to_host({"policy": t.state.policy_state.params,
                         "critic": t.state.critic_state.params})
finally:
  t.close()
if dist.is_main():
  leaves = jax.tree_util.tree_leaves_with_path(params)
  np.savez(os.path.join(out_dir, "params.npz"),
           **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves})
  with open(os.path.join(out_dir, "last.json"), "w", encoding="utf-8") as f:
    json.dump({"kind": kind, "process_count": jax.process_count(), **history[-1]}, f)
print(f"process {pid}/{nproc} done", flush=True)
