"""Fingerprints of short preset runs: every metric record and every checkpoint array, hashed.

    PYTHONPATH=<tree> python benchmarks/preset_fingerprint.py OUT.json [--presets=vapo,ppo]
        [--packing=off]

Runs each preset of `configs/tiny.py` (vapo, ppo, grpo, dapo) shrunk to a few steps of a
1-layer model (SFT 2 steps → [reward model 1] → [value pretraining 1] → RL 2 steps, a
checkpoint after every step), on one CPU device, and writes for each preset the metric
records (timings dropped) and a sha256 of every array of every checkpoint left on disk. It
reads only what both the code and the checkpoints keep across refactors (the preset names,
config fields common to every commit since 974c554, orbax's files), so running it at two
commits with PYTHONPATH set to each and comparing the two files (`--compare A B`) tells
whether a change preserved behaviour bit for bit (issue 28). `--packing=off` runs every pass
on padded rows (rl.packing = False; the presets' default is on), so both row layouts are
fingerprinted (issue 41).
"""

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import tempfile



def root() -> str:
  """The tree whose vapo_jax is imported (its configs/ and tests/ plugins are used)."""
  import vapo_jax  # pylint: disable=import-outside-toplevel
  return os.path.dirname(os.path.dirname(os.path.abspath(vapo_jax.__file__)))

PRESETS = ("vapo", "ppo", "grpo", "dapo")
# timings and what a process compiled: not reproducible
TIMING = ("time/", "_per_s", "wall_s", "_seconds", "compile/", "mem/")

SHRINK = {
    "model": dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16),
    "data": dict(max_prompt_tokens=32, num_train=64, num_eval=8),
    "sampling": dict(max_new_tokens=8),
    "reward": dict(fn="trainer_plugins:even_digits", num_workers=1),
    "sft": dict(steps=2, batch_size=8),
    "optim": dict(policy_lr=1e-3, critic_lr=1e-3),
    "reward_model": dict(steps=1),
    "value_pretrain": dict(max_steps=1, min_steps=1),
    "rl": dict(steps=2, prompts_per_step=8, responses_per_prompt=2, num_minibatches=2,
               micro_batch_size=4),
    "eval": dict(num_examples=8, samples_per_problem=2, batch_prompts=8),
    "checkpoint": dict(every=1, keep=20, async_save=False),
    "metrics": dict(tensorboard=False, plot=False),
}


def config_of(preset: str, packing: bool | None = None):
  """The shrunk preset; packing (None: the preset's own) sets rl.packing."""
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("tiny", os.path.join(root(), "configs",
                                                                     "tiny.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(preset)
  for section, fields in SHRINK.items():
    for k, v in fields.items():
      c[section][k] = v
  if packing is not None:
    c["rl"]["packing"] = packing
  return config_lib.from_config_dict(c)


def _untimed(record: dict) -> dict:
  return {k: v for k, v in record.items() if k != "time" and not any(s in k for s in TIMING)}


def _sha(x) -> str:
  import numpy as np  # pylint: disable=import-outside-toplevel
  a = np.asarray(x)
  return f"{a.dtype}{list(a.shape)}:" + hashlib.sha256(np.ascontiguousarray(a).tobytes()
                                                      ).hexdigest()[:16]


def checkpoint_hashes(directory: str) -> dict[str, dict[str, str]]:
  """step -> {array key: sha}, read with orbax alone (no vapo_jax restore targets)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint_store  # pylint: disable=import-outside-toplevel
  store = checkpoint_store.CheckpointStore(directory, keep_best=False, read_only=True)
  out = {}
  for step in sorted((int(s) for s in os.listdir(directory) if s.isdigit())):
    path = os.path.join(directory, str(step), "arrays")
    with ocp.PyTreeCheckpointer() as reader:
      meta = reader.metadata(path)
      tree = meta.item_metadata if hasattr(meta, "item_metadata") else meta
      restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
      arrays = reader.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    flat = {f"{g}/{k}": _sha(v) for g, leaves in arrays.items() for k, v in leaves.items()}
    # The saved trees' key paths too: old checkpoints restore only where they are the same.
    paths = {g: v["paths"] for g, v in store.read_meta(step)["groups"].items()}
    out[str(step)] = {"arrays": dict(sorted(flat.items())), "paths": paths}
  store.close()
  return out


def run(preset: str, packing: bool | None = None) -> dict:
  from vapo_jax.run import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  cfg = config_of(preset, packing)
  with tempfile.TemporaryDirectory() as workdir:
    t = trainer_lib.Trainer(cfg, workdir, progress=False)
    try:
      t.run()
    finally:
      t.close()
    records = []
    for line in open(os.path.join(workdir, "metrics.jsonl")):
      r = json.loads(line)
      records.append(_untimed(r))
    return {"metrics": records,
            "checkpoints": checkpoint_hashes(os.path.join(workdir, "checkpoints"))}


def program_hashes(presets, packing: bool | None = None) -> dict:
  """preset -> program -> sha256 of its lowered StableHLO text (no debug locations), on the
  process's devices (8 fake CPU devices: set XLA_FLAGS before running)."""
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import config as model_config  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  out = {}
  for preset in presets:
    cfg = config_of(preset, packing)
    m = cfg.model
    mcfg = model_config.ModelConfig(
        vocab_size=64, real_vocab_size=60, hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, eos_token_id=1, pad_token_id=0)
    mesh = shd.make_mesh(2, -1, 2, devices=jax.devices())
    plan = programs.build(cfg, mcfg, mesh)
    out[preset] = {}
    for p in plan.programs:
      text = p.fn.lower(*p.args, **p.kwargs).as_text()
      out[preset][p.name] = _hash(text)
      out[preset][p.name + " (body)"] = _hash(_body(text))
  return out


def _hash(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _body(text: str) -> str:
  """The program without @main's signature and return (where a change of the outputs'
  order or grouping shows, and nothing else)."""
  lines = text.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith("  func.func public @main"))
  end = next(i for i in range(start, len(lines)) if lines[i] == "  }")
  return "\n".join(lines[:start] + lines[start + 1:end - 1] + lines[end:])


def compare(a_path: str, b_path: str) -> int:
  a, b = json.load(open(a_path)), json.load(open(b_path))
  bad = 0
  for preset in sorted(set(a) | set(b)):
    if preset not in a or preset not in b:
      print(f"{preset}: only in one file")
      bad += 1
      continue
    if "metrics" not in a[preset]:  # --programs files
      for name in sorted(set(a[preset]) | set(b[preset])):
        same = a[preset].get(name) == b[preset].get(name)
        print(f"{preset:5s} {name:17s} {'identical' if same else 'DIFFERENT'}")
        bad += not same
      continue
    for part in ("metrics", "checkpoints"):
      if part == "metrics":
        same = ([_untimed(r) for r in a[preset][part]]
                == [_untimed(r) for r in b[preset][part]])
      else:
        same = a[preset][part] == b[preset][part]
      n = (len(a[preset][part]) if part == "metrics"
           else sum(len(v["arrays"]) for v in a[preset][part].values()))
      print(f"{preset:5s} {part:11s} {'identical' if same else 'DIFFERENT'} ({n} "
            f"{'records' if part == 'metrics' else 'arrays'})")
      bad += not same
  return 1 if bad else 0


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("out", nargs="?")
  ap.add_argument("--presets", default=",".join(PRESETS))
  ap.add_argument("--compare", nargs=2)
  ap.add_argument("--programs", action="store_true",
                  help="hash the compile check's lowered programs instead of running")
  ap.add_argument("--packing", choices=("on", "off"),
                  help="set rl.packing (default: the presets' own, on)")
  args = ap.parse_args()
  packing = None if args.packing is None else args.packing == "on"
  if args.compare:
    sys.exit(compare(*args.compare))
  sys.path.insert(0, os.path.join(root(), "tests"))  # the trainer_plugins reward
  if args.programs:
    result = program_hashes(args.presets.split(","), packing)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1, sort_keys=True)
    print(json.dumps(result, indent=1))
    return
  result = {p: run(p, packing) for p in args.presets.split(",")}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  print(f"wrote {args.out}: " + ", ".join(
      f"{p}: {len(r['metrics'])} records, {len(r['checkpoints'])} checkpoints"
      for p, r in result.items()))


if __name__ == "__main__":
  main()
