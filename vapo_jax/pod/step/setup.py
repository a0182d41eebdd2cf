"""The setup of the step model: the stated efficiencies (`Knobs`), the run's sizes on a slice
(`Setup`, from the config and `run.pass_sizes`), the rollout engine as built (`EngineShape`),
the kernels a TPU slice would pick, and one program's figures (`Program`). The formulas are in
the package docstring (`vapo_jax.pod.step`)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from vapo_jax.pod.step import counts as step_counts

GB = 1e9



@dataclasses.dataclass(frozen=True)
class Knobs:
  """Stated efficiencies and switches (each a flag of the CLI, each printed)."""
  # The fraction of peak at which a program runs the FLOPs it executes (its HFU, compute
  # alone: collectives and memory-bound terms come on top), train, prefill and decode; the
  # floor's `mfu_ceiling` is the same measure (`efficiency`: the MFU and HFU printed).
  mfu: float = 0.4
  bw_efficiency: float = 0.7         # HBM bandwidth reached
  collective_latency_us: float = 7.0  # per collective in a decode step
  mfu_ceiling: float = 0.5           # the floor's, on its (model) FLOPs: the same measure
  attn_score_bytes: float = 16.0     # HBM bytes per (pair, head) of a blocked fwd (bwd 2.5×)
  decode_collectives: float | None = None  # per decode step; None: 9 L + 4
  decode_collective_bytes: float = 0.0  # per decode step and chip, over ICI (decode_hlo)
  decode_weights: str = "stationary"  # or "gathered" (FSDP weights all-gathered per step)
  # Bytes per weight a decode step reads: XLA hoists the fp32 -> bf16 casts of the stationary
  # weight shards out of the decode loop (its carry holds bf16 shards: `decode_hlo`), so 2.
  decode_weight_itemsize: float = 2.0
  # The code paths; None: as the config says (Setup.of: rl.packing -> "packed" else
  # "padded"; sampling.engine "continuous" (sampler/continuous.py) or "static"
  # (sampler/static.py)). A Setup built by hand with None runs padded / static.
  train: str | None = None           # "padded" | "packed"
  rollout: str | None = None         # "static" | "continuous"
  # The train passes' self-attention kernel; None: as model.attention_kernel picks it on
  # the TPU slice (`train_kernel`: "auto" -> jax's Pallas splash kernel where it takes one
  # shard's heads). "splash" | "jax" override it.
  train_attention: str | None = None
  engine_tp: int = 4
  engine_layout: str = "built"       # or "replicas" (see the module docstring)
  workspace_gb: float = 5.0          # per chip, kept free by the engine besides weights
  headroom: float = 0.05
  engine_admit: float = 0.9          # admit while live KV < this share of the KV budget
  # Host work per decode chunk of the built engine, ms; None: measured on this CPU at the
  # engine's sizes (`pod.host_gap`).
  host_chunk_ms: float | None = None
  # The train programs' collectives from compiled HLO (`pod.train_hlo --json`); None:
  # not counted (the report says so).
  train_collectives: str | None = None
  # Share of a chip's ICI a collective gets (a ring over one torus axis: 2 of 6 links).
  collective_bw_share: float = 1.0 / 3.0
  # Share a collective-permute gets: one link in one direction (1/6; the hand-written rings
  # of models/collective_matmul.py send one way). The optimistic reading: collective_bw_share.
  permute_bw_share: float = 1.0 / 6.0
  # A train program takes at least the time of the collectives XLA hides behind its compute
  # (`train.hidden_line`); False: hidden traffic is free (the optimistic reading).
  hidden_bound: bool = True
  # The floor's HBM efficiency; None: the estimate's bw_efficiency (equal efficiency); the
  # optimistic reading's floor reads HBM at 1.0.
  bw_ceiling: float | None = None
  # Also print the packed train side on FSDP × tensor (mesh.tensor) and FSDP-only meshes
  # (`step_terms.train_layout`; the estimate stays the config's).
  compare_layouts: bool = False
  # Seconds to compile one program where the compile check has not timed it (`compiles`).
  compile_s: float = 120.0

  @property
  def floor_bw(self) -> float:
    return self.bw_efficiency if self.bw_ceiling is None else self.bw_ceiling

  def optimistic(self) -> "Knobs":
    """The reading before issue 66: permutes at a bidirectional ring's two links, hidden
    traffic free, the floor at full HBM bandwidth."""
    return dataclasses.replace(self, permute_bw_share=self.collective_bw_share,
                               hidden_bound=False, bw_ceiling=1.0)


@dataclasses.dataclass(frozen=True)
class Setup:
  arch: step_counts.Arch
  chips: int
  tensor: int
  peak: float                 # bf16 FLOP/s per chip
  bw: float                   # HBM bytes/s per chip
  hbm: float                  # bytes per chip
  ici: float                  # ICI bytes/s per chip
  rows: int                   # B
  n: int                      # responses per prompt
  prompt_len: int             # P
  max_new: int                # R
  per_call: int               # prompts per sampler call
  windows: tuple              # ops.decode_windows(P, ...)
  epochs: int
  use_critic: bool
  param_bytes: int            # itemsize of the master weights
  eval_rows: int              # per evaluation
  eval_per_call: int          # rows per eval sampler call
  eval_every: int
  knobs: Knobs = Knobs()
  minibatches: int = 1
  eval_n: int = 1             # samples per evaluation problem
  engine: "EngineShape | None" = None      # the rollout engine as built (--engine_layout)
  eval_engine: "EngineShape | None" = None
  # --train=packed: the PackSpecs of the policy / critic steps and of the old-log-prob /
  # value forwards, as `run.learners.pass_spec` builds them (batch shards = chips / tensor).
  pack_steps: object = None
  pack_forward: object = None
  # The engine's prompt buckets, as `run.sampling.build_sampler` builds its SamplingConfig
  # ((data.max_prompt_tokens,): every prompt padded to P); () = powers of two.
  prompt_buckets: tuple = ()
  micro_rows: int = 0         # rows per padded micro-batch of an update (0: a mini-batch)
  # The old-log-prob forward runs (Config.old_logprobs "recompute"); "exact" / "behaviour"
  # save it: no `logprobs` program in the estimate or the floor.
  old_logprobs_pass: bool = True
  # Tensor shards of the train passes (config.mesh.train_layout: the train mesh's tensor size,
  # mesh.train_tensor or else mesh.tensor, when "shared"; 1 when "fsdp"); 0: `tensor`, as the
  # decode replicas.
  train_tensor: int = 0
  # {program name: compile seconds} measured by the compile check (`compiles.seconds`), and
  # how ("": whole programs; " (probes of 4, 8 layers, summed)"); rl.steps of the run.
  compile_times: dict | None = None
  compile_note: str = ""
  run_steps: int = 0

  @property
  def train_tp(self) -> int:
    return self.train_tensor or self.tensor

  @classmethod
  def of(cls, cfg, mcfg, s, knobs: Knobs = Knobs(), engines: dict | None = None
         ) -> "Setup":
    """engines: {"rollout", "eval": EngineShape} of the built engines (compile_check passes
    its plan's); default `engine_shapes`, sized from the slice's HBM the run's way."""
    from vapo_jax.sampler import ops  # pylint: disable=import-outside-toplevel
    p, r = cfg.data.max_prompt_tokens, cfg.sampling.max_new_tokens
    wins = ops.decode_windows(p, types.SimpleNamespace(max_new_tokens=r,
                                                       decode_windows=cfg.sampling.decode_windows))
    n = cfg.rl.group_size
    per_call = cfg.sampling.prompts_per_call or cfg.rl.rollout_prompts
    ev = cfg.eval
    eval_rows = ev.num_examples * ev.samples_per_problem if ev.every else 0
    # The passes' sizes as the trainer asks them of run/ (`run.pass_sizes`), on the train
    # mesh's shape over this slice's chips (no devices: `batch_shards` reads only its shape).
    from vapo_jax.run import learners, meshes, pass_sizes  # pylint: disable=import-outside-toplevel
    rows = learners.rows_of(cfg)
    train = mesh_shape(cfg, s.chips, train=True)
    train_tp = 1 if cfg.mesh.train_layout == "fsdp" else train.shape["tensor"]
    shards = pass_sizes.batch_shards(train, meshes.train_rules_of(cfg))
    spec = lambda name: learners.spec_of(cfg, name, shards)  # noqa: E731
    upd_rows, upd_micro = learners.micro_batches(cfg, "policy")
    knobs = dataclasses.replace(
        knobs, train=knobs.train or ("packed" if cfg.rl.packing else "padded"),
        rollout=knobs.rollout or ("continuous" if cfg.sampling.engine == "continuous"
                                  else "static"))
    kernel = knobs.train_attention or train_kernel(mcfg, train_tp)
    knobs = dataclasses.replace(knobs, train_attention=kernel)
    arch = dataclasses.replace(step_counts.Arch.of(mcfg), kernel=kernel)
    st = cls(arch, s.chips, cfg.mesh.tensor, s.gen.bf16_flops,
             s.gen.hbm_bandwidth, s.gen.hbm_bytes, s.gen.ici_bandwidth, rows.rollout, n, p, r,
             per_call, wins, cfg.rl.ppo_epochs, cfg.uses_critic,
             np.dtype(mcfg.param_dtype).itemsize, eval_rows,
             ev.batch_prompts * ev.samples_per_problem, max(1, ev.every or 1), knobs,
             cfg.rl.num_minibatches, ev.samples_per_problem,
             pack_steps=spec("policy"), pack_forward=spec("logprobs"),
             prompt_buckets=pass_sizes.prompt_buckets(cfg),
             micro_rows=upd_rows // max(upd_micro, 1),
             old_logprobs_pass=cfg.old_logprobs == "recompute", train_tensor=train_tp,
             run_steps=cfg.rl.steps)
    engines = engines or engine_shapes(cfg, mcfg, st)
    return dataclasses.replace(st, engine=engines["rollout"], eval_engine=engines["eval"])

  @property
  def resident(self) -> float:
    """Both TrainStates per chip (fp32 params + two Adam moments)."""
    return 3.0 * self.param_bytes * (self.arch.params + self.use_critic
                                     * self.arch.critic_params) / self.chips


def mesh_shape(cfg, chips: int, *, train: bool = False):
  """The config's (data, fsdp, tensor) mesh laid over `chips` (one -1 size takes the rest),
  as an object with the `shape` of a mesh: what `run.pass_sizes.batch_shards` reads. With
  `train`, the learners' mesh (mesh.train_tensor = t: (data, N / (data t), t) over the same
  N chips, as `run.meshes.build_train_mesh` lays it; 0: the same mesh)."""
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor]
  if -1 in sizes:
    sizes[sizes.index(-1)] = max(1, chips // max(1, -int(np.prod(sizes))))
  t = cfg.mesh.train_tensor
  if train and t and t != sizes[2]:
    n = int(np.prod(sizes))
    sizes = [sizes[0], max(1, n // (sizes[0] * t)), t]
  return types.SimpleNamespace(shape=dict(zip(shd.MESH_AXES, sizes)))


@dataclasses.dataclass(frozen=True)
class EngineShape:
  """The sizes of a built rollout engine (`continuous.EngineConfig`)."""
  slots: int
  page_size: int
  kv_tokens: int              # the pool: whole pages (all replicas)
  chunk_steps: int
  replicas: int = 1           # decode replicas: each S / R slots and kv_tokens / R
  kernel: str = "jax"         # decode attention: "tpu" (jax's Pallas kernel) or "jax"
  pages_per_block: int = 8    # EngineConfig.pages_per_block
  overlap: bool = True        # EngineConfig.overlap: the host works while a chunk runs
  decode_buckets: int = 1     # EngineConfig.decode_buckets: decode-chunk shapes (1: S rows)

  @classmethod
  def of(cls, ecfg) -> "EngineShape":
    return cls(ecfg.slots, ecfg.page_size, ecfg.num_pages * ecfg.page_size, ecfg.chunk_steps,
               ecfg.replicas, ecfg.kernel, ecfg.pages_per_block, ecfg.overlap,
               ecfg.decode_buckets)

  def row_buckets(self) -> tuple[int, ...]:
    """Rows per replica of each decode-chunk shape, largest first: (S/R) / 2^i for
    i < decode_buckets, those that are whole (`sampler.continuous.bucket_rows`)."""
    from vapo_jax.sampler import continuous  # pylint: disable=import-outside-toplevel
    return tuple(r // self.replicas for r in continuous.bucket_rows(
        self.slots, self.replicas, self.decode_buckets))


def engine_shapes(cfg, mcfg, st: "Setup") -> dict:
  """The engines `run.sampling.build_sampler` builds, analytically (no mesh, no compile): slots
  as there (sampling.slots, else the static sampler's rows), the pool by `sampler.kv_pool`
  from the chip's HBM less the train state (`Setup.resident`, the reference, the rollout
  batch and the decode copy, counted from the architecture; compile_check passes the built
  engines' own shapes instead)."""
  from vapo_jax.sampler import kv_pool  # pylint: disable=import-outside-toplevel
  sm, a = cfg.sampling, st.arch
  shards = st.tensor if (2 * mcfg.num_kv_heads) % st.tensor == 0 else 1
  tok_b = kv_pool.token_bytes(mcfg, mcfg.dtype) / shards
  ref = cfg.rl.kl_coef > 0
  batch = st.rows * (st.prompt_len + st.max_new) * 8 + st.rows * st.max_new * 4 * (5 + ref)
  dtype = mcfg.dtype if sm.decode_dtype == "auto" else sm.decode_dtype
  copy = a.params * np.dtype(dtype).itemsize / st.tensor
  resident = (st.resident + ref * a.params * st.param_bytes / st.chips
              + batch / st.chips + copy)
  mem = kv_pool.Memory(st.hbm, resident, sm.kv_headroom)
  out = {}
  for key, rows in (("rollout", st.rows),
                    ("eval", cfg.eval.batch_prompts * cfg.eval.samples_per_problem)):
    slots = sm.slots or rows
    # run.sampling.decode_replicas: the batch shards, if they divide the slots and the tensor
    # axis splits the kv heads whole.
    reps = max(1, st.chips // st.tensor)
    if slots % reps or mcfg.num_kv_heads % shards:
      reps = 1
    try:
      pool = kv_pool.size(slots=slots, page_size=sm.page_size,
                          whole_tokens=st.prompt_len + st.max_new - 1, token_bytes_=tok_b,
                          memory=mem, explicit=sm.kv_tokens, replicas=reps)
    except ValueError:  # no room for one response: `estimate` says so if it needs the engine
      out[key] = None
      continue
    pages = -(-(st.prompt_len + st.max_new - 1) // sm.page_size)
    out[key] = EngineShape(slots, sm.page_size, pool.tokens, sm.chunk_steps, reps,
                           _kernel(sm.attention_kernel, mcfg, shards, sm.page_size,
                                   (slots // reps, pages)),
                           overlap=sm.overlap, decode_buckets=sm.decode_buckets)
  return out


def train_kernel(mcfg, tp: int) -> str:
  """The train passes' self-attention kernel on a TPU slice, analytically, as
  `splash_attention.choose` picks it in `layers.Attention`: "jax" when
  model.attention_kernel is "jax", when the q and kv heads do not split alike over
  mesh.tensor, or when jax's splash kernel refuses one shard's heads
  (`splash_attention.refusal`, traced for TPU on abstract arrays); else "splash"."""
  if mcfg.attention_kernel == "jax":
    return "jax"
  from vapo_jax.models import splash_attention  # pylint: disable=import-outside-toplevel
  h, k = mcfg.num_heads, mcfg.num_kv_heads
  if (h % tp == 0) != (k % tp == 0):
    return "jax"
  split = tp if h % tp == 0 else 1
  why = splash_attention.refusal(h // split, k // split, mcfg.head_dim, mcfg.dtype,
                                 block=mcfg.attention_block, target="tpu")
  return "jax" if why else "splash"


def _kernel(want: str, mcfg, tp: int, page_size: int, table: tuple[int, int] | None = None
            ) -> str:
  """`continuous.attention_kernel` on a TPU slice, analytically: "tpu" unless "jax" is asked
  for or jax's Pallas kernel refuses one shard's shapes (`paged_attention.tpu_kernel_refusal`)."""
  if want == "jax":
    return "jax"
  from vapo_jax.models import paged_attention  # pylint: disable=import-outside-toplevel
  k2, h = 2 * mcfg.num_kv_heads, mcfg.num_heads
  if k2 % tp or (k2 // tp) % 2 or h % tp:
    return "jax"
  why = paged_attention.tpu_kernel_refusal(h // tp, k2 // tp // 2, mcfg.head_dim, mcfg.dtype,
                                           page_size)
  if table is not None and not why:
    why = paged_attention.table_refusal(*table)
  return "jax" if why else "tpu"


@dataclasses.dataclass
class Program:
  """One program's figures per chip for one RL step (all its calls)."""
  name: str
  flops: float = 0.0
  hbm_bytes: float = 0.0
  collectives: float = 0.0
  ici_bytes: float = 0.0
  terms: dict = dataclasses.field(default_factory=dict)   # seconds by cause
  note: str = ""
  steps: int = 0              # decode steps (the engine simulation's slowest replica)
  lines: list = dataclasses.field(default_factory=list)  # the step_terms, one line each
  hidden: float = 0.0         # s of collectives XLA scheduled beside compute (train programs)

  @property
  def time(self) -> float:
    return sum(self.terms.values())

