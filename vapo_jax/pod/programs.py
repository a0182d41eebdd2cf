"""The run's compiled programs, lowered from shapes alone (no weights, no devices needed).

Each program is built by the same `run/` functions the trainer builds it with (same
step functions, shardings, micro-batching and donation), from abstract parameters
(`jax.ShapeDtypeStruct` with the config's shardings), so `jax.jit(...).lower(...)` works for
any device set — fake CPU devices in tests, or a TPU pod's devices from
`jax.experimental.topologies` on a CPU host.

  policy_step   one policy update on a mini-batch (VAPO eq. 5), state donated
  critic_step   one critic update on a mini-batch
  logprobs      old log-probs of a whole rollout (in micro-batches)
  values        critic values of a whole rollout (in micro-batches)
With the rollout engine (sampling.engine = "continuous", the default), its own jitted
programs (`continuous.Engine.lowerable`, exactly what a rollout runs):

  decode_copy   the bf16 (sampling.decode_dtype) decode copy of the policy, once per step
  prefill       one prompt's dense prefill (the largest bucket)
  insert        a prefill's KV into a slot's pages, token 0 drawn
  decode_chunk  sampling.chunk_steps decode steps of every slot (`trips` = chunk_steps:
                XLA counts the loop body once)
  eval_insert, eval_decode_chunk   the same for the evaluation engine (k samples per problem;
                its prefill is the rollout's program)

With the static sampler (sampling.engine = "static", the test oracle), its own jitted
programs (`static.Sampler.lowerable`):

  prefill       the sampler's prefill of one call's prompts into its KV cache
  decode_step   one token of the sampler's decode loop for one call's rows
  eval_decode_step  the same for the evaluation sampler (k samples per problem)

With rl.packing (the default) the four train-side programs are the packed ones the trainer
runs (`rl.layout.Packed`), one per packed micro-batch shape: `policy_step[rows=16x21504]` is
the policy step on K packed micro-batches of 16 rows of 21,504 slots (`_train`).

Also the bytes that stay in device memory while each program runs (`resident`): both
TrainStates and the last rollout batch. The engine's decode copy and KV pool are resident
while it samples (`rollout_parts`: they count in every engine program, not in the train
programs: `clear_cache` frees both after the rollout). The static samplers' KV caches are
freed after each use (rl.experience, run.evaluation), so a cache counts only in its own
sampler's programs, as their (donated) argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from vapo_jax import critic as critic_lib
from vapo_jax import packing
from vapo_jax import sharding as shd
from vapo_jax.models import transformer
from vapo_jax.rl import batch as batch_lib
from vapo_jax.rl import layout as layout_lib
from vapo_jax.rl import train_state
from vapo_jax.run import learners
from vapo_jax.run import forwards, inputs, meshes, sampling
from vapo_jax.run import memory as run_memory
from vapo_jax.sampler import kv_pool

TRAIN = ("policy_step", "critic_step", "logprobs", "values")
STATIC = ("prefill", "decode_step", "eval_decode_step")
ENGINE = ("decode_copy", "prefill", "insert", "decode_chunk", "eval_insert",
          "eval_decode_chunk")
# Every name; `build` makes those of the config's sampling.engine.
PROGRAMS = TRAIN + STATIC + tuple(n for n in ENGINE if n not in STATIC)
TRAIN_RESIDENT = ("policy_state", "critic_state", "reference", "rollout_batch")


def _sds(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def abstract_model(build: Callable[[nnx.Rngs], nnx.Module], mesh, rules):
  """(graphdef, state of ShapeDtypeStructs with the rules' shardings); nothing allocated."""
  graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))))
  shardings = shd.state_shardings(abs_state, mesh, rules)
  return graphdef, jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s), abs_state, shardings)


def abstract_train_state(params, tx, mesh) -> train_state.TrainState:
  """The TrainState `train_state.init_state` would create, as shapes with shardings."""
  opt_sh = train_state.opt_state_shardings(params, tx)
  opt = jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s),
                     jax.eval_shape(tx.init, train_state.trainable(params)), opt_sh)
  step = _sds((), jnp.int32, NamedSharding(mesh, PartitionSpec()))
  return train_state.TrainState(params, opt, step)


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a pytree of sharded ShapeDtypeStructs / arrays (the max)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += int(np.prod(shape)) * np.dtype(x.dtype).itemsize
  return total


@dataclasses.dataclass(frozen=True)
class Program:
  """One program to compile: the jitted function, its abstract arguments, and which of
  its argument bytes are part of the resident set (not to be counted twice)."""
  name: str
  fn: Any                      # a jax.jit-wrapped function
  args: tuple
  kwargs: dict
  resident_arg_bytes: int      # per device
  resident: tuple[str, ...] = ("policy_state", "critic_state", "reference", "rollout_batch")
  # XLA's cost analysis counts a loop body once; the micro-batch loop runs this many times.
  trips: int = 1


@dataclasses.dataclass(frozen=True)
class Plan:
  programs: list[Program]
  resident_parts: dict[str, int]  # per device, held while other programs run
  shapes: dict[str, int]       # rows, lengths, micro-batches: for the report
  # The engine's, per device: decode_copy, kv_pool, eval_kv_pool (held while it samples).
  rollout_parts: dict[str, int] = dataclasses.field(default_factory=dict)
  pools: dict[str, Any] = dataclasses.field(default_factory=dict)  # kv_pool.Pool per engine
  engines: dict[str, Any] = dataclasses.field(default_factory=dict)  # the built engines

  @property
  def held(self) -> dict[str, int]:
    """Every part a program's `resident` may name."""
    return {**self.resident_parts, **self.rollout_parts}


def build(cfg, mcfg, mesh, names=PROGRAMS, budget: float | None = None, *,
          hbm: float | None = None, kv_tokens: dict[str, int] | None = None,
          lengths: tuple[np.ndarray, np.ndarray] | None = None) -> Plan:
  """The programs of one run (a `config.Config` and the policy's `ModelConfig`) on `mesh`,
  the config's (data, fsdp, tensor) mesh: the samplers' programs on it, the learners' on the
  train mesh the run lays over its devices (mesh.train_tensor, `run.meshes.build_train_mesh`).

  With a per-chip `budget` that the resident state alone exceeds, no programs are built.
  hbm: bytes per chip the engines' KV pools are sized from (`sampler.kv_pool`: the run
  sizes them from its device's HBM the same way); None: the cap of slots x one response.
  kv_tokens: {"rollout" | "eval" | "greedy": tokens} pins the pools instead (the layer
  probes of the compile check use the full model's).
  With rl.packing the train-side programs are the packed ones (`_train`); `lengths`
  = (real prompt lengths [B], response lengths [B]) of a representative rollout picks the
  packed shapes the step estimate counts (default: every sequence at full length).
  """
  # The learners and their passes lie on the train mesh (mesh.train_tensor: `mesh` itself, or
  # its devices laid out again) as mesh.train_layout says; the samplers decode from
  # mesh.rules on `mesh` (their engine's decode copy is resharded from the train layout).
  decode_mesh, mesh = mesh, meshes.build_train_mesh(cfg, mesh)
  decode_rules, rules = meshes.rules_of(cfg), meshes.train_rules_of(cfg)
  batch_axes = shd.batch_axes(mesh, rules)
  meshes.device_count_check(cfg, decode_mesh, decode_rules)
  meshes.device_count_check(cfg, mesh, rules, train=True)
  rows_sh = batch_lib.batch_sharding(mesh, batch_axes)
  graphdef, params = abstract_model(lambda r: transformer.Transformer(mcfg, rngs=r), mesh, rules)
  c_graphdef, c_params = abstract_model(critic_lib.builder(
      mcfg, head_bias=cfg.model.critic_head_bias, full=cfg.full_critic), mesh, rules)
  p_tx, c_tx = learners.optimizer(cfg, "policy"), learners.optimizer(cfg, "critic")
  p_state = abstract_train_state(params, p_tx, mesh)
  c_state = abstract_train_state(c_params, c_tx, mesh)

  n = cfg.rl.group_size
  rows = learners.rows_of(cfg)
  p_len, r_len = cfg.data.max_prompt_tokens, cfg.sampling.max_new_tokens

  def batch(b):
    return batch_lib.abstract(b, p_len, r_len, rows_sh, reference=cfg.rl.kl_coef > 0)

  rollout_batch = batch(rows.rollout)
  resident = {"policy_state": per_device_bytes(p_state),
              "critic_state": per_device_bytes(c_state) if cfg.uses_critic else 0,
              # GRPO's KL penalty keeps a frozen copy of the initial policy's weights.
              "reference": per_device_bytes(params) if cfg.rl.kl_coef > 0 else 0,
              "rollout_batch": per_device_bytes(rollout_batch)}
  shapes = {"rows": rows.rollout, "minibatch_rows": rows.minibatch,
            "micro_batches": rows.micro_batches, "forward_chunks": rows.forward_chunks,
            "prompt_len": p_len, "response_len": r_len, "devices": mesh.size,
            "train_mesh": dict(mesh.shape)}
  if budget is not None and sum(resident.values()) > budget:
    return Plan([], resident, shapes)  # Nothing can run: no programs to build.
  text = inputs.Text(encode=None, decode=None, bos_ids=(), template=None,
                    eos_ids=(int(mcfg.eos_token_id or 0),), pad_id=0,
                    vocab_size=mcfg.real_vocab_size or mcfg.vocab_size)
  per_call = cfg.sampling.prompts_per_call or cfg.rl.rollout_prompts
  engine = cfg.sampling.engine == "continuous"
  rollout_parts, memory = {}, None
  if engine:
    rollout_parts["decode_copy"] = run_memory.decode_copy_bytes(cfg, mcfg, graphdef, params,
                                                                decode_mesh, decode_rules)
    memory = kv_pool.Memory(hbm, float(sum(resident.values()) + rollout_parts["decode_copy"]),
                            cfg.sampling.kv_headroom)
  built = sampling.samplers(cfg, graphdef, mcfg, decode_mesh, decode_rules, text, memory=memory,
                            kv_tokens=kv_tokens)
  samplers = {"rollout": (built.rollout, per_call), "eval": (built.eval, cfg.eval.batch_prompts),
              "greedy": (built.greedy, cfg.eval.batch_prompts)}

  progs = []
  tokens, mask = rollout_batch.tokens_BxL, rollout_batch.mask_BxL
  in_rollout = per_device_bytes((tokens, mask))
  progs += _train(cfg, names, mesh, rules, rows, rows_sh, lengths, batch,
                  (graphdef, params, p_tx, p_state), (c_graphdef, c_params, c_tx, c_state),
                  resident, in_rollout, shapes)
  if engine:
    return _engine_plan(cfg, names, progs, resident, shapes, rollout_parts, params,
                        {k: v for k, (v, _) in samplers.items()})
  # The static samplers' own programs (`static.Sampler.lowerable`): the parameters are the
  # policy state's; a sampler's cache is its own (donated) argument.
  low = {k: s.lowerable(params, bp) for k, (s, bp) in samplers.items()}
  for name, key in (("prefill", "rollout"), ("decode_step", "rollout"),
                    ("eval_decode_step", "eval")):
    if name in names:
      own = name.removeprefix("eval_")
      progs.append(Program(name, low[key][own], low[key][own + "_args"], {},
                           per_device_bytes(params)))
  shapes.update({"prompts_per_call": per_call, "sampler_rows": per_call * n,
                 "cache_len": samplers["rollout"][0].cfg.total_cache_len})
  # generate's arguments: (parameters, prompts, prompt mask, cache, key).
  shapes.update({f"kv_cache_{k}_per_chip": per_device_bytes(v["generate_args"][3])
                 for k, v in low.items()})
  return Plan(progs, resident, shapes)

# --------------------------------------------------------------------- packed train side


def _abstract_plan(n: int, k: int, t: int, b: int, rows_sh) -> dict:
  """The packing plan's arrays (`rl.layout.PLAN_KEYS`) as ShapeDtypeStructs, rows on axis 0."""
  big, small = _sds((n, k, t), jnp.int32, rows_sh), _sds((b,), jnp.int32, rows_sh)
  return {**{key: big for key in layout_lib.TABLE_KEYS},
          **{key: small for key in layout_lib.PLAN_KEYS if key not in layout_lib.TABLE_KEYS}}


def packed_shapes(spec: packing.PackSpec, calls: list[tuple[np.ndarray, np.ndarray]],
                  rows: int) -> list[tuple[int, int, int, float]]:
  """(n, K_cap, T, trips) of the programs one packed pass needs.

  The pass runs len(calls) times per RL step (a mini-batch of `rows` sequences each; calls
  holds their (prompt, response) lengths). A packed pass compiles one program per row length
  T its plans use (spec.row_len, or with rl.packing_row_steps the length each plan picks):
  n rows of T per micro-batch, fixed for that T, over plan tables of K_cap = ceil(rows / n)
  micro-batches (`PackSpec.micro_cap`), the micro-batch count K a loop's trip count at run
  time. trips is the calls' K summed over the calls with that T, per call (so the step
  estimate's calls x trips is every packed micro-batch of the step). Rows of spec.row_len
  are always compiled, for the fit (trips 0 when no call uses them).
  """
  trips: dict[int, float] = {}
  for p_B, l_B in calls:
    _, k, t = packing.plan(p_B, l_B, spec).shape
    trips[t] = trips.get(t, 0.0) + k / len(calls)
  trips.setdefault(spec.row_len, 0.0)
  return [(spec.at(t).max_rows, spec.at(t).micro_cap(rows), t, trips[t]) for t in sorted(trips)]


def _train(cfg, names, mesh, rules, rows, rows_sh, lengths, batch, policy, critic,
           resident, in_rollout, shapes) -> list[Program]:
  """The train-side programs the trainer runs (`run.learners.learner_step`, `logprobs_fn`,
  `values_fn`), on the run's row layout (`run.learners.pass_layout`). Padded: one program per
  pass, trips = its micro-batches. Packed: one per packed micro-batch shape [n, T]
  (`packed_shapes`), named e.g. `policy_step[rows=16x21504]`, trips = its packed
  micro-batches per call."""
  graphdef, params, p_tx, p_state = policy
  c_graphdef, c_params, c_tx, c_state = critic
  p_len, r_len = cfg.data.max_prompt_tokens, cfg.sampling.max_new_tokens
  if lengths is None:
    lengths = (np.full(rows.rollout, p_len), np.full(rows.rollout, r_len))
  p_B, l_B = (np.asarray(x, np.int64)[:rows.rollout] for x in lengths)
  mini = rows.minibatch
  mini_calls = [(p_B[i:i + mini], l_B[i:i + mini]) for i in range(0, rows.rollout, mini)]
  out = []

  def add(name, pass_name, calls, b, make):
    """make(rows argument after the batch's) -> (jitted fn, args, kwargs, resident bytes)."""
    layout = learners.pass_layout(cfg, pass_name, mesh, rules)
    if isinstance(layout, layout_lib.Padded):
      fn, args, kwargs, held = make(None)
      out.append(Program(name, fn, args, kwargs, held, trips=layout.micro_batches))
      return
    for n, k, t, trips in packed_shapes(layout.spec, calls, b):
      fn, args, kwargs, held = make(_abstract_plan(n, k, t, b, rows_sh))
      out.append(Program(f"{name}[rows={n}x{t}]", fn, args, kwargs, held, trips=trips))
    shapes[f"{name}_packed_shapes"] = [[layout.spec.at(t).micro_cap(b),
                                        layout.spec.at(t).max_rows, t]
                                       for t in layout.spec.row_lens()]

  tokens, mask = batch(rows.rollout).tokens_BxL, batch(rows.rollout).mask_BxL
  steps = [("policy_step", "policy", graphdef, p_tx, p_state, True),
           ("critic_step", "critic", c_graphdef, c_tx, c_state, cfg.uses_critic)]
  for prog, learner, gd, tx, state, on in steps:
    if prog not in names or not on:
      continue
    step = learners.learner_step(cfg, learner, gd, tx, state, mesh, rules)
    held = resident[f"{learner}_state"]
    add(prog, learner, mini_calls, mini, lambda plan, step=step, state=state, held=held: (
        (step, (state, batch(mini)), {}, held) if plan is None else
        (step.compiled, (state, layout_lib.PackedBatch(batch(mini), plan)), {}, held)))
  passes = [("logprobs", forwards.logprobs_fn, graphdef, params,
             {"prompt_len": p_len, "temperature": cfg.sampling.temperature}, True),
            ("values", forwards.values_fn, c_graphdef, c_params, {"prompt_len": p_len},
             cfg.uses_critic)]
  for prog, make_fn, gd, prm, kw, on in passes:
    if prog not in names or not on:
      continue
    run = make_fn(cfg, gd, mesh, rules)
    held = per_device_bytes(prm) + in_rollout
    add(prog, prog, [(p_B, l_B)], rows.rollout, lambda plan, run=run, prm=prm, kw=kw,
        held=held: ((run, (prm, tokens, mask), kw, held) if plan is None else
                    (run.jitted, (prm, tokens, mask, plan), kw, held)))
  return out


def _engine_plan(cfg, names, progs, resident, shapes, rollout_parts, params, engines) -> Plan:
  """The engine programs (`ENGINE`) after the train ones; the pools' bytes as rollout_parts."""
  pools = {k: e.pool for k, e in engines.items()}
  progs = list(progs)
  for key, prefix, part in (("rollout", "", "kv_pool"), ("eval", "eval_", "eval_kv_pool")):
    more, rollout_parts[part] = _engine_programs(engines[key], params, prefix, part, names)
    progs += more
  e = engines["rollout"]
  rows = shapes["rows"]
  # As compile_check's static estimate: every response runs to max_new_tokens, S at a time.
  steps = -(-rows // e.ecfg.slots) * e.cfg.max_new_tokens
  shapes.update({"prompts_per_call": cfg.rl.rollout_prompts, "sampler_rows": rows,
                 "slots": e.ecfg.slots, "page_size": e.ecfg.page_size,
                 "kv_pages": e.ecfg.num_pages, "kv_tokens": e.ecfg.num_pages * e.ecfg.page_size,
                 "chunk_steps": e.ecfg.chunk_steps, "engine_decode_steps": steps,
                 "engine_chunks": -(-steps // e.ecfg.chunk_steps),
                 "eval_slots": engines["eval"].ecfg.slots,
                 "eval_kv_pages": engines["eval"].ecfg.num_pages,
                 "eval_rows": cfg.eval.batch_prompts * cfg.eval.samples_per_problem})
  return Plan(progs, resident, shapes, rollout_parts, pools, engines)


def _engine_programs(engine, params, prefix: str, pool_part: str, names
                     ) -> tuple[list[Program], int]:
  """The engine's own jitted programs with their abstract arguments (`Engine.lowerable`),
  and its KV pool's bytes per device."""
  low = engine.lowerable(params)
  copy_b = per_device_bytes(low["prefill_args"][0])
  pool_b = per_device_bytes(low["insert_args"][0])
  held = TRAIN_RESIDENT + ("decode_copy", pool_part)
  spec = {"decode_copy": (TRAIN_RESIDENT, per_device_bytes(params), 1),
          "prefill": (held, copy_b, 1), "insert": (held, pool_b, 1),
          "decode_chunk": (held, copy_b + pool_b, engine.ecfg.chunk_steps)}
  out = []
  for name, (res, res_in, trips) in spec.items():
    full = prefix + name
    if full not in names or (prefix and name in ("decode_copy", "prefill")):
      continue  # the evaluation engine's copy and prefill are the rollout's programs
    out.append(Program(full, low[name], low[name + "_args"], {}, res_in, res, trips))
  return out, pool_b
