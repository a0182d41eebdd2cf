"""Training-step throughput: vapo_jax transformer vs transformers/PyTorch, CPU.

One run prints, for the same Qwen2-style config, batch and optimizer
(forward + backward + AdamW on the mean next-token NLL, float32):

  * our tokens/s (jax.jit, split/merge state, donated buffers except on CPU),
  * PyTorch's tokens/s (transformers Qwen2ForCausalLM, torch.optim.AdamW),
  * their ratio,
  * our model-FLOPs utilisation against a float32 matmul peak measured in
    this run (best of jax and torch on a square matmul),
  * machine and versions, the load average at start and end (max sampled
    during the run); figures from a loaded run (above 1) are marked
    LOADED — not a result (benchmarks/quiet.py).

jax and torch run in interleaved rounds; the ratio is the median of the
per-round ratios, which are printed too.

Usage: python benchmarks/model_bench.py [--layers 4 --hidden 512 ...] [--json out.json]
Needs `pip install torch transformers` for the PyTorch column.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from vapo_jax import policy  # noqa: E402
from vapo_jax.models import ModelConfig, Transformer  # noqa: E402
from vapo_jax.models.config import flops_per_token  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quiet  # noqa: E402  benchmarks/quiet.py: load, interleaved rounds, LOADED marking


def add_config_flags(p) -> None:
  """The model and batch flags (also `benchmarks/ab_bench.py`'s)."""
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--hidden", type=int, default=512)
  p.add_argument("--intermediate", type=int, default=1408)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--head_dim", type=int, default=0, help="0: hidden / heads")
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--seq", type=int, default=256)


def model_config(a, config_cls=ModelConfig):
  """The Qwen2-style config of the flags (`config_cls`: a checkout's own ModelConfig)."""
  kw = {"head_dim": a.head_dim} if a.head_dim else {}
  return config_cls(vocab_size=a.vocab, hidden_size=a.hidden,
                    intermediate_size=a.intermediate, num_layers=a.layers,
                    num_heads=a.heads, num_kv_heads=a.kv_heads, qkv_bias=True,
                    tie_word_embeddings=False, rms_norm_eps=1e-6, **kw)


def _flags():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_config_flags(p)
  p.add_argument("--steps", type=int, default=5, help="timed steps per round")
  p.add_argument("--rounds", type=int, default=3,
                 help="interleaved jax/torch rounds; medians and per-round ratios")
  p.add_argument("--chunked", action="store_true",
                 help="our loss via policy.token_logprobs (chunked vocab)")
  quiet.add_flags(p)
  return p.parse_args()


def matmul_peak(n: int = 2048, reps: int = 10) -> dict[str, float]:
  """Best float32 GFLOP/s of an n x n matmul in jax and in torch."""
  out = {}
  a = jnp.asarray(np.random.RandomState(0).randn(n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = min(_time(lambda: f(a).block_until_ready()) for _ in range(reps))
  out["jax"] = 2 * n ** 3 / best / 1e9
  try:
    import torch  # pylint: disable=g-import-not-at-top
    t = torch.randn(n, n)
    t @ t
    best = min(_time(lambda: t @ t) for _ in range(reps))
    out["torch"] = 2 * n ** 3 / best / 1e9
  except ImportError:
    pass
  return out


def _time(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def jax_step_fn(cfg: ModelConfig, tokens: np.ndarray, chunked: bool,
                transformer=Transformer):
  """run(): one jitted train step (state kept between calls), returning the loss.

  `transformer`: the model class to build (`benchmarks/ab_bench.py` passes each
  checkout's own).
  """
  model = transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  opt_state = tx.init(params)
  mask = jnp.ones(tokens.shape, jnp.int32)
  toks = jnp.asarray(tokens)

  def loss_fn(params):
    m = nnx.merge(graphdef, params)
    if chunked:
      return -jnp.mean(policy.token_logprobs(m, toks, mask, chunk=64))
    h, _ = m(toks, jnp.broadcast_to(jnp.arange(toks.shape[1]), toks.shape),
             mask)
    lp = jax.nn.log_softmax(m.logits(h[:, :-1]), axis=-1)
    return -jnp.mean(jnp.take_along_axis(lp, toks[:, 1:, None], -1))

  def step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  # As the trainer's steps (vapo_jax/rl/train_state.py `_donate`): state donated except on CPU,
  # where XLA copies every donated parameter first.
  step = jax.jit(step, donate_argnums=() if jax.default_backend() == "cpu" else (0, 1))
  state = [params, opt_state]

  def run():
    state[0], state[1], loss = step(*state)
    return loss.block_until_ready()

  return run


def torch_step_fn(cfg: ModelConfig, tokens: np.ndarray):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  hf = transformers.Qwen2Config(**{k: v for k, v in cfg.to_hf().items()
                                   if k not in ("architectures", "dtype")})
  model = transformers.Qwen2ForCausalLM(hf).float().train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  ids = torch.tensor(tokens, dtype=torch.long)

  def run():
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()

  return run


def main():
  a = _flags()
  load = quiet.Load()
  with load:
    lines, results, facts = _measure(a, load)
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(a.json, load, facts, results)


def _measure(a, load):
  """Interleaved jax/torch rounds; returns (figure lines, JSON results, machine facts)."""
  cfg = model_config(a)
  facts = quiet.machine_facts(peers=("optax", "torch", "transformers"))
  quiet.print_header(facts, load)
  tokens = np.random.RandomState(0).randint(0, a.vocab, (a.batch, a.seq))
  tokens = tokens.astype(np.int32)
  n_tok = a.batch * a.seq
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    torch_run = torch_step_fn(cfg, tokens)
    torch_info = (f"torch {torch.__version__} ({torch.get_num_threads()} "
                  f"threads), transformers {transformers.__version__}")
  except ImportError as e:
    torch_run, torch_info = None, f"PyTorch column skipped: {e}"
  jax_run = jax_step_fn(cfg, tokens, a.chunked)
  t0 = time.perf_counter()
  jax_run()
  compile_s = time.perf_counter() - t0
  if torch_run:
    torch_run()
  peak: dict[str, float] = {}

  def measure_peak(_):  # best over rounds: a conservative MFU
    for k, v in matmul_peak().items():
      peak[k] = max(peak.get(k, 0.0), v)

  def best_of_steps(run):
    run()  # one untimed step first in every round
    return min(_time(run) for _ in range(a.steps))

  sides = [("jax", lambda: best_of_steps(jax_run))]
  if torch_run:
    sides.append(("torch", lambda: best_of_steps(torch_run)))
  rounds = quiet.interleave(sides, a.rounds, load=load, each_round=measure_peak)
  ours = n_tok / rounds.median("jax")
  train_flops = 3 * flops_per_token(cfg, a.seq)
  peak_gflops = max(peak.values())
  print(f"{torch_info}")
  print(f"config: layers={a.layers} hidden={a.hidden} mlp={a.intermediate} "
        f"heads={a.heads}/{a.kv_heads} vocab={a.vocab} batch={a.batch} "
        f"seq={a.seq} ({cfg.num_params / 1e6:.1f}M params, float32, "
        f"AdamW, loss={'chunked token_logprobs' if a.chunked else 'full logits'}); "
        f"{a.rounds} interleaved round(s), best of {a.steps} steps per round")
  lines = ["matmul peak (2048^2 f32, best of all rounds): " + ", ".join(
      f"{k} {v:.1f} GFLOP/s" for k, v in peak.items()),
           f"jax compile+first step: {compile_s:.1f} s",
           f"vapo_jax train step: {ours:10.1f} tokens/s  "
           f"(step {n_tok / ours * 1e3:.0f} ms)"]
  results = {"config": {k: getattr(a, k) for k in (
      "layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab", "batch",
      "seq",
      "steps", "rounds", "chunked")},
             "compile_s": compile_s, "matmul_peak_gflops": peak,
             "jax_tokens_per_s": ours}
  if torch_run:
    theirs = n_tok / rounds.median("torch")
    lines += [f"PyTorch  train step: {theirs:10.1f} tokens/s  "
              f"(step {n_tok / theirs * 1e3:.0f} ms)",
              rounds.describe_ratio("jax", "torch", "ratio vapo_jax / PyTorch")]
    results["torch_tokens_per_s"] = theirs
  mfu = ours * train_flops / (peak_gflops * 1e9)
  lines.append(f"vapo_jax MFU: {100 * mfu:.1f}% of {peak_gflops:.1f} GFLOP/s "
               f"({train_flops / 1e6:.1f} MFLOP per token, 3x forward)")
  results.update(rounds.to_json([("jax", "torch")] if torch_run else []), mfu=mfu)
  return lines, results, facts


if __name__ == "__main__":
  main()
