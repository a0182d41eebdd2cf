"""The decode-weight question: does the sampler's real decode loop re-gather parameters per step?

Compiles `Sampler._generate` (the prefill + windowed while loops the rollout runs) and checks
that no all-gather inside a loop body takes a loop-invariant carry (a weight) as its operand
(`hlo_stats.invariant_gathers`); and that the same check does flag a loop built to all-gather
its layer weights every trip. On 8 fake CPU devices always; for a v5p topology through libtpu
(no TPU needed; outside CI it skips without libtpu, in CI it fails).
"""


import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from vapo_jax import sharding as shd
from vapo_jax.pod import archs
from vapo_jax.pod import decode_hlo
from vapo_jax.pod import hlo_stats
from vapo_jax.pod import slices

from tpu_aot import NEEDS_LIBTPU  # pylint: disable=wrong-import-order
from test_step_model import _config  # pylint: disable=wrong-import-order

TINY = {"model.hidden_size": 64, "model.intermediate_size": 128, "model.num_layers": 2,
        "model.num_heads": 4, "model.num_kv_heads": 2, "model.head_dim": 16,
        "data.max_prompt_tokens": 16, "sampling.max_new_tokens": 16,
        "rl.prompts_per_step": 8, "rl.responses_per_prompt": 2, "rl.micro_batch_size": 4,
        "eval.batch_prompts": 4, "eval.samples_per_problem": 2,
        "sampling.prompts_per_call": 4, "mesh.tensor": 2}


def _gathering_loop(devices):
  """A loop whose every trip all-gathers layer i % 3 of FSDP-sharded stacked weights."""
  mesh = jax.make_mesh((len(devices),), ("x",), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,))
  f = jax.shard_map(lambda ws, xs: xs @ jax.lax.all_gather(ws, "x", axis=0, tiled=True),
                    mesh=mesh, in_specs=(P("x", None), P()), out_specs=P(), check_vma=False)
  prog = lambda w, x: jax.lax.fori_loop(0, 6, lambda i, x: jnp.tanh(f(w[i % 3], x)), x)  # noqa
  w = jax.ShapeDtypeStruct((3, 64, 64), jnp.float32,
                           sharding=NamedSharding(mesh, P(None, "x", None)))
  x = jax.ShapeDtypeStruct((4, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
  return jax.jit(prog).lower(w, x).compile().as_text()


def _check(devices, target):
  cfg = _config(**TINY)
  mcfg = archs.model_config(cfg)
  mesh = shd.make_mesh(1, -1, 2, devices=devices)
  r = decode_hlo.compile_generate(cfg, mcfg, mesh, target=target)
  # Four windows, each a while loop whose body runs one decode step with collectives.
  assert sum(lp.collectives.total > 0 for lp in r.loops) >= cfg.sampling.decode_windows
  assert r.per_step > 0
  assert r.weight_gathers == [], r.weight_gathers
  assert len(hlo_stats.invariant_gathers(_gathering_loop(devices))) == 1


def test_decode_loop_gathers_no_weights_cpu():
  _check(jax.devices()[:8], None)


@NEEDS_LIBTPU
def test_decode_loop_gathers_no_weights_v5p():
  _check(slices.devices(slices.parse("v5p:2x2x1")), "tpu")
