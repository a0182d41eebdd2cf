r"""Rollout engine vs the static sampler on a long-tailed length workload (useful tokens/s).

Both sides run the same random Qwen2-style model (float32, written by transformers and
loaded by `hf_io.from_pretrained`) on the same responses. A random model never stops on its
own, so the stop lengths are forced: the model is wrapped (`Countdown`) so that a prompt
ending in token C + l makes the response C + l - 1, C + l - 2, ..., C (the stop token),
exactly l tokens, through the full forward pass at every step (the forcing is a +1e4 bias
on the real logits: the model's work is unchanged). Lengths are drawn per response from
a lognormal (median --median, sigma --sigma), clipped to [1, cap].

  static:     `static.Sampler`, --batch rows per call (the trainer's prompts_per_call),
              each call decoding until its longest row stops (cap R);
  continuous: `continuous.Engine` with --slots decode slots over all responses;
  serial:     the same engine with `EngineConfig.overlap=False` (each chunk read back before
              the next is dispatched: the loop before 2026-12-04), its ratio printed beside.

Useful tokens/s = sum of the response lengths / wall time, median of --repeats interleaved
rounds, the ratio per round. Presets:

  python benchmarks/engine_bench.py --preset=small      # sampler_bench's small model:
                                                        # 64 responses, median 64, sigma 0.8,
                                                        # cap 512, 16 rows / 16 slots
  python benchmarks/engine_bench.py --preset=longcot    # one long-CoT RL step's rollout:
                                                        # configs/longcot.py shapes, 16 x 8
                                                        # responses of 89-150 tokens, cap 160
  python benchmarks/engine_bench.py --preset=tiny --repeats=1   # smoke (tests)

A run whose load went above 1 is marked LOADED (benchmarks/quiet.py): not a result.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quiet  # pylint: disable=wrong-import-position

PRESETS = {
    "tiny": dict(vocab=512, hidden=64, inter=128, layers=2, heads=4, kv=2, prompt=16,
                 responses=12, n=1, batch=4, slots=4, cap=48, median=12, sigma=0.8),
    "small": dict(vocab=32768, hidden=512, inter=1408, layers=8, heads=8, kv=2, prompt=64,
                  responses=64, n=1, batch=16, slots=16, cap=512, median=64, sigma=0.8),
    # configs/longcot.py: D 128, F 384, 2 layers, 4 heads / 2 kv of 32; prompts of <= 72
    # tokens; 16 prompts x 8 responses in one static call; responses 89-150 tokens (+EOS).
    "longcot": dict(vocab=1024, hidden=128, inter=384, layers=2, heads=4, kv=2, prompt=72,
                    responses=128, n=8, batch=128, slots=128, cap=160, lo=90, hi=151),
}


def lengths_for(p: dict, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  b = p["responses"]
  if "lo" in p:
    ln = rng.integers(p["lo"], p["hi"], size=b)
  else:
    ln = np.round(np.exp(np.log(p["median"]) + p["sigma"] * rng.standard_normal(b)))
  return np.clip(ln, 1, p["cap"]).astype(int)


def countdown_model(model_cfg, state, stop: int):
  """The loaded model wrapped so that token C + k (k > 0) forces C + k - 1 next."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from vapo_jax.models import transformer  # pylint: disable=g-import-not-at-top

  class Countdown(transformer.Transformer):
    head_weight = None  # the samplers then call `logits`, which sees the input token

    def __call__(self, tokens_BxT, positions_BxT, kv_mask_BxS, *, cache=None, cache_index=0):
      h, c = super().__call__(tokens_BxT, positions_BxT, kv_mask_BxS, cache=cache,
                              cache_index=cache_index)
      return jnp.concatenate([h, tokens_BxT[..., None].astype(h.dtype)], -1), c

    def decode_paged(self, tokens_S, pos_S, pages, **kw):
      h, pages = super().decode_paged(tokens_S, pos_S, pages, **kw)
      return jnp.concatenate([h, tokens_S[:, None].astype(h.dtype)], -1), pages

    def logits(self, hidden):
      tok = hidden[..., -1].astype(jnp.int32)
      h = hidden[..., :-1]
      z = jnp.einsum("...d,vd->...v", h, self.embed[...].astype(h.dtype),
                     preferred_element_type=jnp.float32)
      nxt = jnp.where(tok > stop, tok - 1, -1)
      force = jnp.arange(z.shape[-1]) == nxt[..., None]
      return z + 1e4 * force

  graphdef, _ = nnx.split(nnx.eval_shape(lambda: Countdown(model_cfg, rngs=nnx.Rngs(0))))
  return graphdef, state


def run(preset: str, p: dict, args, load: quiet.Load):
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from vapo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler import continuous  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler import static as static_lib  # pylint: disable=g-import-not-at-top
  from vapo_jax.sampler.ops import SamplingConfig  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  hf_cfg = transformers.Qwen2Config(
      vocab_size=p["vocab"], hidden_size=p["hidden"], intermediate_size=p["inter"],
      num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
      num_key_value_heads=p["kv"], tie_word_embeddings=True, rms_norm_eps=1e-6)
  with tempfile.TemporaryDirectory(prefix="engine_bench_") as path:
    transformers.Qwen2ForCausalLM(hf_cfg).float().save_pretrained(path)
    model, model_cfg = hf_io.from_pretrained(path)
    jax.block_until_ready(nnx.state(model))
  stop = p["vocab"] - p["cap"] - 2
  graphdef, state = countdown_model(model_cfg, nnx.state(model), stop)
  n, cap = p["n"], p["cap"]
  lengths = lengths_for(p)
  if n > 1:  # one length per prompt's responses would not be long-tailed per response;
    lengths = lengths.reshape(-1, n)[:, 0].repeat(n)  # forcing is per prompt here
  rng = np.random.default_rng(1)
  prompts = [rng.integers(1, stop, size=p["prompt"] - 1).tolist() + [stop + int(ell)]
             for ell in lengths[::n]]
  useful = int(lengths.sum())
  cfg = SamplingConfig(max_new_tokens=cap, temperature=1.0, stop_token_ids=(stop,),
                       pad_id=0, n_per_prompt=n, max_prompt_len=p["prompt"],
                       prompt_buckets=(p["prompt"],))
  static = static_lib.Sampler.for_transformer(graphdef, model_cfg, cfg)
  eng = continuous.Engine(graphdef, model_cfg, cfg, continuous.EngineConfig(
      slots=p["slots"], page_size=16, chunk_steps=args.chunk,
      kv_tokens=p["slots"] * (p["prompt"] + cap)))
  serial = continuous.Engine(graphdef, model_cfg, cfg, dataclasses.replace(
      eng.ecfg, overlap=False))
  per_call = p["batch"] // n

  def static_all(seed):
    outs = [static(state, prompts[i:i + per_call], jax.random.key(seed))
            for i in range(0, len(prompts), per_call)]
    jax.block_until_ready(outs)
    return np.concatenate([np.asarray(o.lengths_B) for o in outs])

  def engine_all(seed, e=eng):
    return np.asarray(jax.block_until_ready(e(state, prompts, jax.random.key(seed)))
                      .lengths_B)

  got_s, got_e = static_all(0), engine_all(0)  # compile + check the forcing
  got_r = engine_all(0, serial)
  assert all(np.array_equal(g, lengths) for g in (got_s, got_e, got_r)), (
      got_s[:8], got_e[:8], got_r[:8], lengths[:8])
  rounds = quiet.interleave([("continuous", lambda: engine_all(1)),
                             ("static", lambda: static_all(1)),
                             ("serial", lambda: engine_all(1, serial))], args.repeats,
                            load=load)
  t_e, t_s, t_r = (rounds.median(k) for k in ("continuous", "static", "serial"))
  st = eng.last_stats
  print(f"preset {preset}: Qwen2 D={p['hidden']} L={p['layers']} V={p['vocab']}, float32; "
        f"{p['responses']} responses ({len(prompts)} prompts x {n}), prompt {p['prompt']}, "
        f"lengths mean {lengths.mean():.1f} median {np.median(lengths):.0f} max "
        f"{lengths.max()} (cap {cap}); static {p['batch']} rows per call, engine "
        f"{p['slots']} slots, chunk {args.chunk}")
  lines = [
      f"[{preset}] continuous engine: {useful / t_e:9.1f} useful tokens/s ({t_e:.2f} s; "
      f"slot occupancy {st['slot_occupancy']:.2f}, decode steps {st['decode_steps']:.0f})",
      f"[{preset}] static sampler   : {useful / t_s:9.1f} useful tokens/s ({t_s:.2f} s)",
      f"[{preset}] engine, no overlap: {useful / t_r:9.1f} useful tokens/s ({t_r:.2f} s)",
      f"[{preset}] " + rounds.describe_ratio("continuous", "static", "ratio"),
      f"[{preset}] " + rounds.describe_ratio("continuous", "serial",
                                             "overlap vs no overlap")]
  return lines, {"preset": preset, "useful_tokens": useful, **rounds.to_json(
      [("continuous", "static"), ("continuous", "serial")]), "engine_stats": st}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="small", choices=[*PRESETS, "all"])
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--chunk", type=int, default=16)
  quiet.add_flags(ap)
  args = ap.parse_args()
  facts = quiet.machine_facts()
  load = quiet.Load()
  names = ["small", "longcot"] if args.preset == "all" else [args.preset]
  with load:
    quiet.print_header(facts, load)
    figures = [run(name, PRESETS[name], args, load) for name in names]
  for lines, _ in figures:
    for line in lines:
      print(load.tag(line))
  print(load.verdict())
  quiet.write_json(args.json, load, facts, {r["preset"]: r for _, r in figures})


if __name__ == "__main__":
  main()
