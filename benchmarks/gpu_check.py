r"""The Python half of benchmarks/gpu_check.sh: one GPU session's checks, step by step.

  python3 benchmarks/gpu_check.py env                   # versions, devices, platform choice
  python3 benchmarks/gpu_check.py smoke                 # model, train step, checkpoint: works?
  python3 benchmarks/gpu_check.py train  --json J [--dry] [--deadline EPOCH_S]
  python3 benchmarks/gpu_check.py sample --json J [--dry] [--deadline EPOCH_S]
  python3 benchmarks/gpu_check.py tiny   --json J --stdout F --metrics M --wall S --rc N
  python3 benchmarks/gpu_check.py table  --json J       # the short table, last

Each step adds its own section to the JSON file J (read, update, write), so a step that
fails or is killed still leaves the others' figures. Ratios are the peer's time over ours
(> 1: vapo_jax is faster), medians of interleaved rounds (benchmarks/quiet.py's Rounds).

train: forward + backward + AdamW on the mean next-token NLL, vapo_jax (the
`benchmarks/model_bench.py` step: jax.jit, split/merge state, donated buffers) against
transformers' Qwen2ForCausalLM with torch.optim.AdamW(fused=True), same shapes. Both in
mixed precision: float32 parameters and optimizer state, bfloat16 matmuls (our
ModelConfig(dtype=bfloat16); torch.autocast(bfloat16)), float32 log-softmax. PyTorch runs
eager, and torch.compile(model) too when the deadline leaves time for its compile.
MFU = tokens/s x 3 x forward FLOPs per token (models.config.flops_per_token, PaLM's count)
over 790 TFLOP/s, the bf16 matmul rate measured on these machines, and over this run's own
8192^3 bf16 matmul.

sample: vapo_jax's KV-cache sampler against transformers `generate`, same random Qwen2
checkpoint (written by transformers, read by hf_io.from_pretrained), both bfloat16 weights
and KV cache, sampling on (T=1, top-p 1, top-k off, no stop token: every row makes exactly
R tokens). The RL workload: P prompts x n responses (our sampler prefills a prompt once;
`generate(num_return_sequences=n)` prefills every row). Eager `generate`.

--dry: shapes small enough for a CPU (the same code paths), for testing the script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import contextlib
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BF16_PEAK = 790e12   # bf16 matmul FLOP/s measured on these H200 machines (8192^3, random)
PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
            "flax", "optax", "orbax-checkpoint", "chex", "ml_collections", "tensorboardX",
            "numpy", "torch", "transformers", "tokenizers", "safetensors", "sympy",
            "absl-py", "pytest", "pytest-xdist")
# configs/tiny.py on this repo's 2-core CPU host, seed 0 (held-out, 256 problems, k = 4).
CPU_TINY = {"wall_s": 389.0, "before": {"avg@4": 0.536, "pass@4": 0.719, "greedy": 0.629},
            "after": {"avg@4": 0.693, "pass@4": 0.750, "greedy": 0.723}}


# ------------------------------------------------------------------------------ helpers
def _update_json(path: str | None, section: str, value) -> None:
  if not path:
    return
  data = {}
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
    except (OSError, ValueError):
      data = {}
  data[section] = value
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1, default=str)
  os.replace(tmp, path)


def _left(deadline: float | None) -> float:
  return float("inf") if deadline is None else deadline - time.time()


class _Alarm(BaseException):
  """Not an Exception: torch.compile's own `except Exception` fallbacks must not eat it."""


def _with_alarm(seconds: float, fn):
  """fn() stopped by SIGALRM after `seconds` (raises _Alarm)."""
  def handler(signum, frame):
    raise _Alarm(f"over {seconds:.0f} s")
  old = signal.signal(signal.SIGALRM, handler)
  signal.alarm(max(1, int(seconds)))
  try:
    return fn()
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _matmul_peak(jax, jnp, n: int, dtype, reps: int = 10) -> float:
  """FLOP/s of an n^3 matmul in jax on random data (mean of `reps` after a warm-up)."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    out = f(a, b)
  out.block_until_ready()
  return reps * 2 * n ** 3 / (time.perf_counter() - t)


# ---------------------------------------------------------------------------------- env
def cmd_env(a) -> int:
  import quiet  # pylint: disable=import-outside-toplevel
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel
  info = {"python": sys.version.split()[0], "executable": sys.executable,
          "platform": platform.platform(), "cores": os.cpu_count(),
          "versions": quiet.versions(PACKAGES),
          "env": {k: os.environ.get(k) for k in (
              "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS",
              "JAX_DEFAULT_MATMUL_PRECISION", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")},
          "has_accelerator": cli.has_accelerator(),
          "packages": os.environ.get("GPU_CHECK_PACKAGES", "?")}
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  info["select_platforms_with_JAX_PLATFORMS_unset"] = cli.select_platforms(env) or "(left unset)"
  for mod in ("flax", "optax", "orbax.checkpoint", "ml_collections"):
    try:
      info[f"{mod}_file"] = __import__(mod, fromlist=["_"]).__file__
    except Exception as e:  # pylint: disable=broad-except
      info[f"{mod}_file"] = f"import failed: {type(e).__name__}: {e}"
  for k, v in info.items():
    print(f"{k}: {v}")
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  info["jax_backend"] = jax.default_backend()
  info["jax_devices"] = [str(d) for d in jax.devices()]
  info["device_kind"] = jax.devices()[0].device_kind
  print(f"jax.default_backend(): {info['jax_backend']}; jax.devices(): {info['jax_devices']} "
        f"({info['device_kind']})")
  # Does a float32 matmul at JAX's default precision round its inputs to TF32?
  x = np.random.RandomState(0).randn(512, 512).astype(np.float32)
  ref = x.astype(np.float64) @ x.astype(np.float64)
  for prec in ("default", "highest"):
    try:
      ctx = (contextlib.nullcontext() if prec == "default"
             else jax.default_matmul_precision(prec))
      with ctx:
        got = np.asarray(jax.jit(lambda v: v @ v)(jnp.asarray(x)), np.float64)
      err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
      info[f"f32_matmul_relerr_{prec}"] = err
      print(f"float32 512^3 matmul, precision {prec}: rel. error {err:.1e} "
            f"({'TF32-like' if err > 1e-5 else 'full float32'})")
    except Exception as e:  # pylint: disable=broad-except
      print(f"float32 matmul check ({prec}): {type(e).__name__}: {e}")
  try:
    import torch  # pylint: disable=import-outside-toplevel
    info["torch_cuda"] = torch.cuda.is_available()
    if torch.cuda.is_available():
      info["torch_device"] = torch.cuda.get_device_name(0)
    info["torch_allow_tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    print(f"torch: cuda {info['torch_cuda']} {info.get('torch_device', '')}, "
          f"allow_tf32 (matmul) {info['torch_allow_tf32_matmul']}")
  except Exception as e:  # pylint: disable=broad-except
    print(f"torch: {type(e).__name__}: {e}")
  _update_json(a.json, "env", info)
  return 0


# -------------------------------------------------------------------------------- smoke
def cmd_smoke(a) -> int:
  """The calls the runs below make of flax, optax, orbax and ml_collections: any failing?"""
  del a
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from vapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import Transformer, forward_logits, tiny_config  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import checkpoint_store  # pylint: disable=import-outside-toplevel
  from vapo_jax.run import trainer  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import tiny  # pylint: disable=import-outside-toplevel
  cfg = config_lib.from_command_line(tiny.get_config())
  print(f"config: configs/tiny.py read ({cfg.rl.steps} RL steps)")
  model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 40, (2, 8)), jnp.int32)
  mask = jnp.ones_like(tokens)
  graphdef, params = nnx.split(model, nnx.Param)
  tx = optax.adamw(1e-3)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt):
    loss, g = jax.value_and_grad(
        lambda p: jnp.mean(forward_logits(nnx.merge(graphdef, p), tokens, mask) ** 2))(params)
    up, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, up), opt, loss

  params, opt, loss = step(params, opt)
  print(f"train step: loss {float(loss):.4f} on {jax.devices()[0]}")
  with tempfile.TemporaryDirectory() as d:
    store = checkpoint_store.CheckpointStore(d, async_save=False)
    store.save(1, {"policy": params}, {})
    store.wait()
    back = store.restore(1, {"policy": params})["policy"]
    store.close()
  same = all(bool(jnp.array_equal(x, y)) for x, y in
             zip(jax.tree.leaves(params), jax.tree.leaves(back)))
  print(f"checkpoint save/restore: {'equal' if same else 'DIFFERENT'}")
  return 0 if same else 1


# -------------------------------------------------------------------------------- train
def cmd_train(a) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import model_bench  # pylint: disable=import-outside-toplevel
  import quiet  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import ModelConfig  # pylint: disable=import-outside-toplevel
  from vapo_jax.models.config import flops_per_token  # pylint: disable=import-outside-toplevel

  if a.dry:
    shape = dict(layers=2, hidden=128, inter=352, heads=4, kv=2, vocab=2048, batch=2, seq=64)
    steps, rounds = 2, 2
  else:
    shape = dict(layers=8, hidden=1024, inter=2816, heads=16, kv=4, vocab=32768, batch=8,
                 seq=1024)
    steps, rounds = 10, 3
  cuda = torch.cuda.is_available() and not a.dry
  dev = torch.device("cuda" if cuda else "cpu")
  cfg = ModelConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                    intermediate_size=shape["inter"], num_layers=shape["layers"],
                    num_heads=shape["heads"], num_kv_heads=shape["kv"], qkv_bias=True,
                    tie_word_embeddings=False, rms_norm_eps=1e-6,
                    param_dtype=jnp.float32, dtype=jnp.bfloat16)
  b, t = shape["batch"], shape["seq"]
  n_tok = b * t
  res = {"shape": shape, "params": cfg.num_params, "tokens_per_step": n_tok,
         "precision": "float32 params + AdamW state, bfloat16 matmuls, float32 log-softmax",
         "jax_backend": jax.default_backend(), "torch_device": str(dev),
         "steps_per_round": steps}
  print(f"train step: {cfg.num_params / 1e6:.0f}M params, {shape}, {res['precision']}; "
        f"jax on {jax.devices()[0]}, torch on {dev}")
  tokens = np.random.RandomState(0).randint(0, shape["vocab"], (b, t)).astype(np.int32)

  # --- ours: benchmarks/model_bench.py's step, bfloat16 compute ----------------------
  jax_run = model_bench.jax_step_fn(cfg, tokens, chunked=False)
  t0 = time.perf_counter()
  jax_run()
  res["jax_compile_s"] = time.perf_counter() - t0
  jax_run()
  print(f"jax: compile + first step {res['jax_compile_s']:.1f} s")

  # --- PyTorch: transformers Qwen2, AdamW(fused), autocast bfloat16 -------------------
  hf_cfg = transformers.Qwen2Config(**{k: v for k, v in cfg.to_hf().items()
                                       if k not in ("architectures", "dtype", "torch_dtype")})
  torch.manual_seed(0)
  model = transformers.Qwen2ForCausalLM(hf_cfg).float().to(dev).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=cuda)
  ids = torch.tensor(tokens, dtype=torch.long, device=dev)
  res["torch_attn_implementation"] = getattr(model.config, "_attn_implementation", None)

  def torch_step(m):
    def run():
      opt.zero_grad(set_to_none=True)
      with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = m(input_ids=ids, labels=ids).loss
      loss.backward()
      opt.step()
      return loss
    return run

  def sync():
    if cuda:
      torch.cuda.synchronize()

  eager = torch_step(model)
  t0 = time.perf_counter()
  first = eager()
  sync()
  res["torch_first_step_s"] = time.perf_counter() - t0
  eager()
  sync()
  print(f"torch eager: first step {res['torch_first_step_s']:.1f} s, "
        f"first loss {float(first.detach()):.3f} (ln V = {np.log(shape['vocab']):.3f})")

  def timed(run, block):
    def side():
      t0 = time.perf_counter()
      for _ in range(steps):
        out = run()
      block(out)
      return (time.perf_counter() - t0) / steps
    return side

  def jax_side():
    t0 = time.perf_counter()
    for _ in range(steps):
      jax_run()   # blocks on each step's loss (model_bench's step)
    return (time.perf_counter() - t0) / steps

  sides = [("vapo_jax", jax_side), ("torch_eager", timed(eager, lambda _: sync()))]
  rounds_ = quiet.interleave(sides, rounds)
  res.update(rounds_.to_json([("vapo_jax", "torch_eager")]))
  _update_json(a.json, "train", res)

  # --- torch.compile, if the deadline leaves room for its compile --------------------
  left = _left(a.deadline) - 15
  if a.no_compile:
    res["torch_compile"] = "skipped (--no-compile)"
  elif left < float(os.environ.get("GPU_CHECK_MIN_COMPILE_S", 45)):
    res["torch_compile"] = f"skipped: {left:.0f} s left before the deadline"
  else:
    try:
      compiled_model = torch.compile(model)
      comp = torch_step(compiled_model)

      def warm():
        t0 = time.perf_counter()
        comp()
        sync()
        comp()
        sync()
        return time.perf_counter() - t0
      res["torch_compile_s"] = _with_alarm(left, warm)
      print(f"torch.compile: compile + 2 steps {res['torch_compile_s']:.1f} s")
      sides.append(("torch_compile", timed(comp, lambda _: sync())))
      rounds_ = quiet.interleave(sides, rounds)
      res.update(rounds_.to_json([("vapo_jax", "torch_eager"), ("vapo_jax", "torch_compile")]))
      res["torch_compile"] = "ok"
    except (_Alarm, Exception) as e:  # pylint: disable=broad-except
      res["torch_compile"] = f"failed or too slow: {type(e).__name__}: {str(e)[:300]}"
  print(f"torch.compile: {res['torch_compile']}")

  med = res["median_s"]
  flops = 3 * flops_per_token(cfg, t)
  res["train_flops_per_token"] = flops
  bf16 = jnp.bfloat16
  res["measured_bf16_matmul_flops"] = _matmul_peak(jax, jnp, 1024 if a.dry else 8192, bf16)
  for side, s in med.items():
    res[f"{side}_tokens_per_s"] = n_tok / s
    res[f"{side}_mfu_vs_790T"] = n_tok / s * flops / BF16_PEAK
    res[f"{side}_mfu_vs_measured"] = n_tok / s * flops / res["measured_bf16_matmul_flops"]
  for side in [k for k in med if k != "vapo_jax"]:
    res[f"ratio_{side}"] = rounds_.ratio("vapo_jax", side)
    print(rounds_.describe_ratio("vapo_jax", side, f"ratio {side} / vapo_jax"))
  try:
    res["jax_peak_bytes"] = jax.devices()[0].memory_stats().get("peak_bytes_in_use")
  except Exception:  # pylint: disable=broad-except
    pass
  if cuda:
    res["torch_peak_bytes"] = torch.cuda.max_memory_allocated()
  for side, s in med.items():
    print(f"{side:14s} {1e3 * s:8.1f} ms/step  {n_tok / s:10.0f} tokens/s  "
          f"MFU {100 * res[f'{side}_mfu_vs_790T']:.1f}% of 790 TFLOP/s")
  print(f"this run's bf16 matmul: {res['measured_bf16_matmul_flops'] / 1e12:.0f} TFLOP/s")
  _update_json(a.json, "train", res)
  return 0


# ------------------------------------------------------------------------------- sample
def cmd_sample(a) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  import quiet  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import hf_io  # pylint: disable=import-outside-toplevel
  from vapo_jax.sampler import static as static_lib  # pylint: disable=import-outside-toplevel
  from vapo_jax.sampler.ops import SamplingConfig  # pylint: disable=import-outside-toplevel

  if a.dry:
    p = dict(vocab=2048, hidden=128, inter=352, layers=2, heads=4, kv=2)
    workloads = [dict(name="group", prompts=2, n=4, prompt=16, new=16),
                 dict(name="distinct", prompts=4, n=1, prompt=16, new=16)]
    rounds = 2
  else:
    p = dict(vocab=32768, hidden=1024, inter=2816, layers=8, heads=16, kv=4)
    workloads = [dict(name="group", prompts=16, n=8, prompt=128, new=256),
                 dict(name="distinct", prompts=64, n=1, prompt=128, new=256)]
    rounds = 3
  cuda = torch.cuda.is_available() and not a.dry
  dev = torch.device("cuda" if cuda else "cpu")
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen2Config(
      vocab_size=p["vocab"], hidden_size=p["hidden"], intermediate_size=p["inter"],
      num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
      num_key_value_heads=p["kv"], tie_word_embeddings=True, rms_norm_eps=1e-6)
  hf_model = transformers.Qwen2ForCausalLM(hf_cfg).to(torch.bfloat16).eval()
  n_params = sum(x.numel() for x in hf_model.parameters())
  with tempfile.TemporaryDirectory(prefix="gpu_check_") as path:
    hf_model.save_pretrained(path)
    model, model_cfg = hf_io.from_pretrained(path, param_dtype=jnp.bfloat16)
    jax.block_until_ready(nnx.state(model))
  hf_model = hf_model.to(dev)
  graphdef, state = nnx.split(model)
  res = {"model": p, "params": n_params, "dtype": "bfloat16 weights and KV cache",
         "sampling": "T=1, top_p=1, top_k off, no stop token", "torch_device": str(dev),
         "generate": "eager", "rounds": rounds}
  print(f"sampler: Qwen2 {n_params / 1e6:.0f}M params {p}, {res['dtype']}; jax on "
        f"{jax.devices()[0]}, torch on {dev}")
  _update_json(a.json, "sample", res)
  for w in workloads:
    if w is not workloads[0] and _left(a.deadline) < 40:
      res[w["name"]] = f"skipped: {_left(a.deadline):.0f} s left before the deadline"
      print(f"[{w['name']}] {res[w['name']]}")
      continue
    n, P, R = w["n"], w["prompt"], w["new"]
    rows = w["prompts"] * n
    new_tokens = rows * R
    prompts = np.random.RandomState(0).randint(1, p["vocab"], (w["prompts"], P))
    cfg = SamplingConfig(max_new_tokens=R, temperature=1.0, top_p=1.0, top_k=0,
                         max_prompt_len=P, pad_id=0, n_per_prompt=n)
    sampler = static_lib.Sampler.for_transformer(graphdef, model_cfg, cfg)
    prompt_list = prompts.tolist()
    t0 = time.perf_counter()
    jax.block_until_ready(sampler(state, prompt_list, jax.random.key(0)))
    compile_s = time.perf_counter() - t0
    ids = torch.tensor(prompts, dtype=torch.long, device=dev)
    mask = torch.ones_like(ids)
    gen_kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=R,
                  min_new_tokens=R, pad_token_id=0, eos_token_id=None,
                  num_return_sequences=n)
    t0 = time.perf_counter()
    with torch.inference_mode():
      hf_model.generate(input_ids=ids, attention_mask=mask,
                        **dict(gen_kw, max_new_tokens=8, min_new_tokens=8))
    torch_warm_s = time.perf_counter() - t0
    last, seen = {}, []

    def ours():
      last["out"] = jax.block_until_ready(
          sampler(state, prompt_list, jax.random.key(len(seen) + 1)))

    def theirs():
      with torch.inference_mode():
        last["gen"] = hf_model.generate(input_ids=ids, attention_mask=mask, **gen_kw)
      if cuda:
        torch.cuda.synchronize()

    rr = quiet.interleave([("vapo_jax", ours), ("transformers", theirs)], rounds,
                          each_round=seen.append)
    made = int(np.asarray(last["out"].lengths_B).sum())
    assert made == new_tokens, (made, new_tokens)
    assert tuple(last["gen"].shape) == (rows, P + R), last["gen"].shape
    t_ours, t_theirs = rr.median("vapo_jax"), rr.median("transformers")
    out = {"prompts": w["prompts"], "n_per_prompt": n, "rows": rows, "prompt_len": P,
           "new_tokens": R, "jax_first_call_s": compile_s, "torch_warmup_s": torch_warm_s,
           "vapo_jax_tokens_per_s": new_tokens / t_ours,
           "transformers_tokens_per_s": new_tokens / t_theirs,
           "ratio": rr.ratio("vapo_jax", "transformers"),
           **rr.to_json([("vapo_jax", "transformers")])}
    res[w["name"]] = out
    print(f"[{w['name']}] {w['prompts']} prompts x {n} = {rows} rows, prompt {P}, new {R}: "
          f"vapo_jax {new_tokens / t_ours:9.0f} tok/s ({t_ours:.2f} s, first call "
          f"{compile_s:.1f} s), generate {new_tokens / t_theirs:9.0f} tok/s "
          f"({t_theirs:.2f} s)")
    print(f"[{w['name']}] " + rr.describe_ratio("vapo_jax", "transformers",
                                               "ratio generate / vapo_jax"))
    _update_json(a.json, "sample", res)
  return 0


# --------------------------------------------------------------------------------- tiny
def _last_json(path: str):
  """The last top-level JSON object printed to `path` (vapo_jax.main's summary)."""
  try:
    text = open(path, encoding="utf-8", errors="replace").read()
  except OSError:
    return None
  starts = [i for i in range(len(text)) if text.startswith("{\n", i)
            and (i == 0 or text[i - 1] == "\n")]
  for i in reversed(starts):
    try:
      return json.loads(text[i:])
    except ValueError:
      continue
  return None


def cmd_tiny(a) -> int:
  summary = _last_json(a.stdout)
  rows = []
  if a.metrics and os.path.exists(a.metrics):
    with open(a.metrics, encoding="utf-8") as f:
      for line in f:
        try:
          rows.append(json.loads(line))
        except ValueError:
          pass
  stages = {}
  for r in rows:
    stages[r.get("stage")] = stages.get(r.get("stage"), 0) + 1
  res = {"rc": a.rc, "wall_s": a.wall, "metrics_rows_per_stage": stages,
         "cpu_reference": CPU_TINY}
  if summary:
    for k in ("eval_before_rl", "eval_after_rl"):
      if k in summary:
        res[k] = summary[k]
    res["summary_wall_s"] = summary.get("wall_s")
  rl = [r for r in rows if r.get("stage") == "rl"]
  if rl:
    keys = ("reward/accuracy", "time/rollout_s", "rollout_tokens_per_s", "train_tokens_per_s")
    res["rl_last"] = {k: rl[-1].get(k) for k in keys if k in rl[-1]}
    res["rl_steps_done"] = len(rl)
  _update_json(a.json, "tiny", res)
  print(f"tiny run: rc {a.rc}, wall {a.wall:.0f} s (CPU reference {CPU_TINY['wall_s']:.0f} s); "
        f"metrics rows {stages}")
  for when, key in (("before", "eval_before_rl"), ("after", "eval_after_rl")):
    ev = res.get(key)
    if ev:
      k = next((x for x in ev if x.startswith("avg@")), None)
      kp = next((x for x in ev if x.startswith("pass@")), None)
      print(f"  held-out {when} RL: {k} {ev.get(k, float('nan')):.3f} "
            f"(CPU {CPU_TINY[when]['avg@4']:.3f}), {kp} {ev.get(kp, float('nan')):.3f} "
            f"(CPU {CPU_TINY[when]['pass@4']:.3f}), greedy "
            f"{ev.get('greedy_accuracy', float('nan')):.3f} (CPU {CPU_TINY[when]['greedy']:.3f})")
    else:
      print(f"  held-out {when} RL: not reached")
  return 0


# -------------------------------------------------------------------------------- table
def cmd_table(a) -> int:
  try:
    with open(a.json, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    print(f"no results: {e}")
    return 1
  env = data.get("env", {})
  v = env.get("versions", {})
  print("=" * 78)
  print(f"device {env.get('device_kind', '?')} ({env.get('jax_backend', '?')}); jax "
        f"{v.get('jax')}, flax {v.get('flax')} ({env.get('packages', '?')} packages: "
        f"{env.get('flax_file', '?')}), "
        f"optax {v.get('optax')}, orbax {v.get('orbax-checkpoint')}, torch {v.get('torch')}, "
        f"transformers {v.get('transformers')}")
  steps = data.get("steps", {})
  if steps:
    print("steps: " + ", ".join(f"{k} {s.get('status')} ({s.get('seconds', 0):.0f} s)"
                                for k, s in steps.items()))
  if "pytest" in data:
    print(f"pytest: {data['pytest']}")
  tiny = data.get("tiny")
  if tiny:
    line = f"tiny run: rc {tiny.get('rc')}, wall {tiny.get('wall_s', 0):.0f} s (CPU 389 s)"
    for when, key in (("before", "eval_before_rl"), ("after", "eval_after_rl")):
      ev = tiny.get(key) or {}
      if ev:
        line += (f"; {when}: avg@4 {ev.get('avg@4', float('nan')):.3f} pass@4 "
                 f"{ev.get('pass@4', float('nan')):.3f} greedy "
                 f"{ev.get('greedy_accuracy', float('nan')):.3f}")
    print(line + "  (CPU: 0.536/0.719/0.629 -> 0.693/0.750/0.723)")
  tr = data.get("train")
  if tr and "median_s" in tr:
    n = tr["tokens_per_step"]
    print(f"train step ({tr['params'] / 1e6:.0f}M params, {tr['shape']['batch']}x"
          f"{tr['shape']['seq']} tokens, bf16 matmuls):")
    print(f"  {'side':14s} {'ms/step':>9s} {'tokens/s':>10s} {'MFU/790T':>9s} {'ratio':>6s}")
    for side, s in tr["median_s"].items():
      ratio = tr.get(f"ratio_{side}")
      print(f"  {side:14s} {1e3 * s:9.1f} {n / s:10.0f} "
            f"{100 * tr.get(f'{side}_mfu_vs_790T', 0):8.1f}% "
            f"{'' if ratio is None else f'{ratio:6.2f}'}")
    print(f"  (ratio = peer time / ours; torch.compile: {tr.get('torch_compile', '?')})")
  sa = data.get("sample")
  if sa:
    print(f"sampling ({sa.get('params', 0) / 1e6:.0f}M params, bf16, eager generate):")
    for name in ("group", "distinct"):
      w = sa.get(name)
      if isinstance(w, dict):
        print(f"  {name:9s} {w['rows']:4d} rows x {w['new_tokens']} new: vapo_jax "
              f"{w['vapo_jax_tokens_per_s']:9.0f} tok/s, generate "
              f"{w['transformers_tokens_per_s']:9.0f} tok/s, ratio {w['ratio']:.2f}")
      elif w:
        print(f"  {name:9s} {w}")
  print("=" * 78)
  return 0


def cmd_step(a) -> int:
  """Records a shell step's status and seconds under "steps" (and pytest's last line)."""
  data = {}
  if os.path.exists(a.json):
    with open(a.json, encoding="utf-8") as f:
      data = json.load(f)
  steps = data.get("steps", {})
  steps[a.name] = {"status": a.status, "seconds": a.seconds}
  _update_json(a.json, "steps", steps)
  if a.pytest_log:
    try:
      lines = [ln.strip() for ln in open(a.pytest_log, encoding="utf-8", errors="replace")
               if ln.strip()]
      tail = next((ln for ln in reversed(lines) if " passed" in ln or " failed" in ln
                   or " error" in ln), lines[-1] if lines else "")
    except OSError:
      tail = "no log"
    data = json.load(open(a.json, encoding="utf-8"))
    _update_json(a.json, "pytest", {**data.get("pytest", {}), a.name: tail.strip("= ")})
  return 0


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("cmd", choices=["env", "smoke", "train", "sample", "tiny", "table", "step"])
  ap.add_argument("--json", default=None)
  ap.add_argument("--dry", action="store_true")
  ap.add_argument("--deadline", type=float,
                  default=float(os.environ.get("GPU_CHECK_DEADLINE", 0)) or None,
                  help="epoch seconds at which this step is stopped (default: "
                  "$GPU_CHECK_DEADLINE, set by gpu_check.sh)")
  ap.add_argument("--no-compile", action="store_true")
  ap.add_argument("--stdout", default="")
  ap.add_argument("--metrics", default="")
  ap.add_argument("--wall", type=float, default=0.0)
  ap.add_argument("--rc", type=int, default=0)
  ap.add_argument("--name", default="")
  ap.add_argument("--status", default="")
  ap.add_argument("--seconds", type=float, default=0.0)
  ap.add_argument("--pytest-log", default="")
  a = ap.parse_args()
  return {"env": cmd_env, "smoke": cmd_smoke, "train": cmd_train, "sample": cmd_sample,
          "tiny": cmd_tiny, "table": cmd_table, "step": cmd_step}[a.cmd](a)


if __name__ == "__main__":
  sys.exit(main())
