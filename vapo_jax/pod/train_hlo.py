"""The train programs' collectives, read from their compiled HLO: count, bytes, overlap.

  python -m vapo_jax.pod.train_hlo --config=configs/qwen32b.py --topology=v5p-128 \
      --arch=qwen2.5-32b --layers=2,4 --json=train_collectives.json [--save_hlo=DIR]
  python -m vapo_jax.pod.step_model ... --train_collectives=train_collectives.json

Compiles the four train-side programs the trainer runs (`pod.programs`: old log-probs,
values, policy and critic steps; packed or padded as the config says) for a TPU slice from
this CPU (libtpu, no TPU) at two layer counts La < Lb, reads every collective of the
compiled HLO (`hlo_stats`), and extrapolates per layer to the model's depth L:

  x(L) = x(La) + (x(Lb) − x(La)) (L − La) / (Lb − La)

(The blocks run under a scan, `ModelConfig.scan_layers`: a loop of L known trips nested in
the micro-batch loop, counted × L as below. Probe at La >= 2: XLA inlines a one-trip scan,
so a 1-layer program is not the same program as the deeper ones.)

Per program, split by where a collective sits (`split`):
  per_trip   inside the micro-batch loop's body (the outermost while loop, e.g. the FSDP
             weight gathers, tensor-parallel activation all-reduces, gradient
             reduce-scatters of one micro-batch): paid once per micro-batch;
  per_call   outside it (the optimizer's update, a final gradient reduction): once per call.
A loop nested in the micro-batch body (attention key blocks, LM-head chunks, XLA's windowed
einsums: an all-gather matmul as a ring of collective-permutes) counts its body × its trips
(`known_trip_count`, else the constant its condition compares a counter with), else once.

Overlap, as XLA scheduled it: a collective issued as an async pair (`*-start` … `*-done`)
with at least one compute instruction (fusion, convolution, custom call, dot) scheduled
between the two is `overlapped` (its transfer can hide behind that work; whether it fully
does is not known from text); a synchronous one, or a pair with nothing between, is
`exposed`. The step model counts the exposed ones in time and prints the overlapped ones
beside them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from vapo_jax.pod import hlo_stats  # noqa: E402

PROGRAMS = ("logprobs", "values", "policy_step", "critic_step")
_WORK = ("fusion", "convolution", "custom-call", "dot")


@dataclasses.dataclass
class Side:
  """Collectives of one program part: count and bytes, exposed and overlapped."""
  exposed: float = 0.0
  exposed_bytes: float = 0.0       # result bytes (as `hlo_stats`)
  overlapped: float = 0.0
  overlapped_bytes: float = 0.0
  exposed_wire: float = 0.0        # bytes a chip sends (`wire_bytes`)
  overlapped_wire: float = 0.0
  # Of those, the collective-permutes' (one link, one direction each: the step model prices
  # them apart); None in a file from before they were recorded (not known).
  exposed_permute_wire: float | None = 0.0
  overlapped_permute_wire: float | None = 0.0

  def add(self, n: float, nbytes: float, wire: float, overlapped: bool,
          permute: bool = False):
    if overlapped:
      self.overlapped += n
      self.overlapped_bytes += n * nbytes
      self.overlapped_wire += n * wire
      self.overlapped_permute_wire += n * wire * permute
    else:
      self.exposed += n
      self.exposed_bytes += n * nbytes
      self.exposed_wire += n * wire
      self.exposed_permute_wire += n * wire * permute

  @property
  def count(self) -> float:
    return self.exposed + self.overlapped

  @property
  def nbytes(self) -> float:
    return self.exposed_bytes + self.overlapped_bytes


@dataclasses.dataclass
class Split:
  """One program's collectives: per micro-batch trip and per call."""
  per_trip: Side = dataclasses.field(default_factory=Side)
  per_call: Side = dataclasses.field(default_factory=Side)
  kinds: dict = dataclasses.field(default_factory=dict)   # kind -> count (trip + call)
  probes: tuple = ()       # the layer counts it was extrapolated from

  def as_dict(self) -> dict:
    return {"per_trip": dataclasses.asdict(self.per_trip),
            "per_call": dataclasses.asdict(self.per_call), "kinds": dict(self.kinds),
            "probes": list(self.probes)}

  @classmethod
  def from_dict(cls, d: dict) -> "Split":
    def side(x: dict) -> Side:
      return Side(**{"exposed_permute_wire": None, "overlapped_permute_wire": None, **x})
    return cls(side(d["per_trip"]), side(d["per_call"]), dict(d.get("kinds", {})),
               tuple(d.get("probes", ())))


def group_size(attrs: str) -> int:
  """Devices per replica group of a collective, from its `replica_groups=`: explicit
  `{{0,1,2,3},...}`, iota `[G,N]<=[...]`, or by mesh axes `mesh['a'=4,'b'=2] {'a'}` (the
  product of the named axes' sizes); 1 when absent."""
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
  if m:
    return int(m.group(2))
  m = re.search(r"replica_groups=\{\{([0-9,\s]*)\}", attrs)
  if m:
    return len([x for x in m.group(1).split(",") if x.strip()])
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if m:
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
    n = 1
    for axis in re.findall(r"'([^']+)'", m.group(2)):
      n *= int(sizes.get(axis, 1))
    return n
  return 1


def wire_bytes(kind: str, result_bytes: float, n: int) -> float:
  """Bytes one chip sends for a collective of `result_bytes` over groups of n (ring
  algorithms): all-gather (n−1)/n · result, all-reduce 2 (n−1)/n · result, reduce-scatter
  (n−1) · result (its result is the shard), all-to-all (n−1)/n · result, a permute or
  broadcast its result."""
  if kind in ("collective-permute", "collective-broadcast", "ragged-all-to-all"):
    return float(result_bytes)
  if n <= 1:
    return 0.0
  f = {"all-gather": (n - 1) / n, "all-reduce": 2.0 * (n - 1) / n,
       "reduce-scatter": float(n - 1), "all-to-all": (n - 1) / n}[kind]
  return f * result_bytes


def _trip_count(instr: hlo_stats.Instr, comps=None) -> int | None:
  """A while loop's trips: XLA's `known_trip_count` where recorded, else from its condition
  `ROOT compare(get-tuple-element, constant(N)), direction=LT` (a counter from 0 by 1, as
  XLA's scans and windowed einsums are), else None."""
  m = re.search(r'known_trip_count[^0-9]*"?n"?\s*[:=]\s*"?(\d+)', instr.attrs)
  if m:
    return int(m.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", instr.attrs)
  body = (comps or {}).get(cond.group(1), {}) if cond else {}
  root = next((i for i in body.values() if i.root), None)
  if root is None or root.op != "compare" or "direction=LT" not in root.attrs:
    return None
  for o in root.operands:
    src = body.get(o)
    if src is not None and src.op == "constant" and src.operands and (
        src.operands[0].isdigit()):
      return int(src.operands[0])
  return None


def _result_bytes(instr: hlo_stats.Instr) -> int:
  """As `hlo_stats`: an async start's result is its tuple's last non-scalar array."""
  shapes = [sd for sd in hlo_stats._SHAPE.findall(instr.shape) if sd[1]]  # pylint: disable=protected-access
  if instr.op.endswith("-start") and len(shapes) > 1:
    dtype, dims = shapes[-1]
    return hlo_stats.shape_bytes(f"{dtype}[{dims}]")
  return hlo_stats.shape_bytes(instr.shape)


def _overlapped(instrs: list[hlo_stats.Instr], i: int) -> bool:
  """Whether async start instrs[i] has compute scheduled before its matching done."""
  start = instrs[i]
  if not start.op.endswith("-start"):
    return False
  done_op = start.op.removesuffix("-start") + "-done"
  for later in instrs[i + 1:]:
    if later.op == done_op and start.name in later.operands:
      return False
    if later.op in _WORK or later.op == "while":
      return True
  return False


def _walk(comps, name: str, mult: float, side: Side, kinds: dict, depth: int = 0):
  """Adds the collectives of computation `name` (× mult) to side, recursing into calls."""
  if depth > 64:
    return
  instrs = list(comps.get(name, {}).values())
  for i, instr in enumerate(instrs):
    k = hlo_stats._kind(instr.op)  # pylint: disable=protected-access
    if k:
      nb = _result_bytes(instr)
      side.add(mult, nb, wire_bytes(k, nb, group_size(instr.attrs)), _overlapped(instrs, i),
               k == "collective-permute")
      kinds[k] = kinds.get(k, 0.0) + mult
    if instr.op == "while":
      body = re.search(r"body=%?([\w.\-]+)", instr.attrs).group(1)
      _walk(comps, body, mult * (_trip_count(instr, comps) or 1), side, kinds, depth + 1)
      continue
    for c in hlo_stats._called(instr):  # pylint: disable=protected-access
      _walk(comps, c, mult, side, kinds, depth + 1)


def _loop_of_entry(comps, entry: str) -> hlo_stats.Instr | None:
  """The micro-batch loop: the entry's while loop with the most collectives in its body."""
  best, most = None, -1
  for instr in comps.get(entry, {}).values():
    if instr.op != "while":
      continue
    body = re.search(r"body=%?([\w.\-]+)", instr.attrs).group(1)
    c = hlo_stats.Counts()
    hlo_stats._count(comps, body, c)  # pylint: disable=protected-access
    if c.total > most:
      best, most = instr, c.total
  return best


def split(text: str) -> Split:
  """A compiled program's collectives per micro-batch trip (the entry's largest while loop,
  its nested loops × their known trip counts) and per call (everything else)."""
  comps = hlo_stats.parse(text)
  entry = hlo_stats.entry_name(comps, text)
  loop = _loop_of_entry(comps, entry)
  out = Split()
  instrs = list(comps.get(entry, {}).values())
  for i, instr in enumerate(instrs):
    k = hlo_stats._kind(instr.op)  # pylint: disable=protected-access
    if k:
      nb = _result_bytes(instr)
      out.per_call.add(1, nb, wire_bytes(k, nb, group_size(instr.attrs)),
                       _overlapped(instrs, i), k == "collective-permute")
      out.kinds[k] = out.kinds.get(k, 0.0) + 1
    if instr.op == "while":
      body = re.search(r"body=%?([\w.\-]+)", instr.attrs).group(1)
      if instr is loop:
        _walk(comps, body, 1.0, out.per_trip, out.kinds)
      else:
        _walk(comps, body, float(_trip_count(instr, comps) or 1), out.per_call, out.kinds)
      continue
    for c in hlo_stats._called(instr):  # pylint: disable=protected-access
      _walk(comps, c, 1.0, out.per_call, out.kinds)
  return out


def extrapolate(a: Split, b: Split, la: int, lb: int, layers: int) -> Split:
  """Every field linear in the layer count through (la, a) and (lb, b), at `layers`."""
  def lin(x, y):
    if x is None or y is None:   # not recorded (a file from before the permutes' bytes)
      return None
    return max(0.0, x + (y - x) * (layers - la) / (lb - la))

  def side(x: Side, y: Side) -> Side:
    return Side(*(lin(getattr(x, f.name), getattr(y, f.name))
                  for f in dataclasses.fields(Side)))

  kinds = {k: lin(a.kinds.get(k, 0.0), b.kinds.get(k, 0.0)) for k in {*a.kinds, *b.kinds}}
  return Split(side(a.per_trip, b.per_trip), side(a.per_call, b.per_call), kinds, (la, lb))


def compile_texts(cfg, mcfg, mesh, names=PROGRAMS, lengths=None, log=print) -> dict:
  """{program name (without its packed shape): compiled HLO text} on `mesh` (TPU forms),
  in the order of `names`. With packing, the first packed shape `programs.build` gives per
  pass (qwen32b: n = 16 rows whatever the lengths; the collectives of one micro-batch do
  not depend on K, the scan's trip count)."""
  import time  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from vapo_jax.models import platform  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import programs  # pylint: disable=import-outside-toplevel
  if mesh.devices.flat[0].platform != "tpu":
    # A mesh of host devices (tests): the Pallas TPU kernels do not compile there.
    mcfg = mcfg.replace(attention_kernel="jax")
  plan = programs.build(cfg, mcfg, mesh, names, lengths=lengths)
  first = {}
  for prog in plan.programs:
    first.setdefault(prog.name.split("[")[0], prog)
  out = {}
  for name in names:
    if name not in first:
      continue
    prog, t0 = first[name], time.perf_counter()
    with platform.targeting("tpu"), jax.default_device(mesh.devices.flat[0]):
      out[name] = prog.fn.lower(*prog.args, **prog.kwargs).compile().as_text()
    log(f"  compiled {prog.name} at {mcfg.num_layers} layers ({time.perf_counter() - t0:.0f} s)",
        flush=True)
  return out


def probe(cfg, mcfg, mesh, layers: tuple[int, int], names=PROGRAMS, lengths=None,
          save_hlo: str | None = None, log=print) -> dict:
  """{program: Split at mcfg.num_layers}, extrapolated from compiles at `layers` (one
  program at both layer counts before the next; each text saved as soon as compiled)."""
  from vapo_jax.pod import fitting  # pylint: disable=import-outside-toplevel
  la, lb = layers
  out = {}
  for name in names:
    texts = {}
    for n in (la, lb):
      # The model's mix of kept, rematerialised and selective blocks, in proportion (as
      # compile_check's probes): `replace(num_layers=n)` alone rematerialised every block of
      # a probe below remat_layers and refused a selective config.
      texts[n] = compile_texts(cfg, fitting.probe_model(mcfg, n), mesh, (name,), lengths,
                               log).get(name)
      if save_hlo and texts[n]:
        import gzip  # pylint: disable=import-outside-toplevel
        os.makedirs(save_hlo, exist_ok=True)
        with gzip.open(os.path.join(save_hlo, f"{name}_L{n}.hlo.gz"), "wt") as f:
          f.write(texts[n])
    if texts[la] and texts[lb]:
      out[name] = extrapolate(split(texts[la]), split(texts[lb]), la, lb, mcfg.num_layers)
      log(f"  {name:12s} {describe(out[name])}", flush=True)
  return out


def from_saved(directory: str, depth: int, names=PROGRAMS) -> dict:
  """`probe`'s result from the HLO texts it saved (`--save_hlo`, `<name>_L<layers>.hlo.gz`):
  {program: Split at depth}, per program from the two largest layer counts saved."""
  import glob  # pylint: disable=import-outside-toplevel
  import gzip  # pylint: disable=import-outside-toplevel
  out = {}
  for name in names:
    found = {}
    for path in glob.glob(os.path.join(directory, f"{name}_L*.hlo.gz")):
      m = re.search(r"_L(\d+)\.hlo\.gz$", path)
      if m and os.path.getsize(path) > 0:
        found[int(m.group(1))] = path
    if len(found) < 2:
      continue
    la, lb = sorted(found)[-2:]
    with gzip.open(found[la], "rt") as fa, gzip.open(found[lb], "rt") as fb:
      out[name] = extrapolate(split(fa.read()), split(fb.read()), la, lb, depth)
    out[name].probes = (la, lb)
  return out


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  from vapo_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import archs  # pylint: disable=import-outside-toplevel
  from vapo_jax.pod import slices  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  cfg, mcfg, s = archs.from_flags(f)
  layers = tuple(int(x) for x in f.layers)
  print(f"{s.name}, {mcfg.num_layers} layers, probes {layers}:")
  if f.from_hlo:
    res = from_saved(f.from_hlo, mcfg.num_layers, tuple(f.programs))
  else:
    if not slices.libtpu_available():
      sys.exit('libtpu is not installed: pip install "jax[tpu]==<jax version>" (no TPU '
               "needed)")
    from vapo_jax.pod import fitting  # pylint: disable=import-outside-toplevel
    refusal = fitting.probe_refusal(mcfg, layers)
    if refusal:
      sys.exit(f"error: {refusal}")
    mesh = shd.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor,
                         devices=slices.devices(s))
    res = probe(cfg, mcfg, mesh, layers, tuple(f.programs), save_hlo=f.save_hlo)
  if f.from_hlo:
    for name, sp in res.items():
      print(f"  {name:12s} {describe(sp)}")
  if f.json:
    write_json(f.json, cfg, mcfg, s.name, res,
               source=f"saved HLO texts in {f.from_hlo}" if f.from_hlo else "")


def write_json(path: str, cfg, mcfg, slice_name: str, res: dict, source: str = "") -> dict:
  """Writes the figures with their stamp (`pod.stamp`: commit, settings, versions). A file
  already there with the same settings keeps the programs not made now (programs compiled
  in separate processes go into one file); one of other settings is replaced."""
  from vapo_jax.pod import stamp  # pylint: disable=import-outside-toplevel
  st = stamp.make(cfg, mcfg, slice_name, "train_collectives", source=source)
  programs = {}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as fh:
      old = json.load(fh)
    if (old.get("stamp") or {}).get("digest") == st["digest"]:
      programs = old.get("programs", {})
      st["merged"] = sorted({*old["stamp"].get("merged", [old["stamp"].get("commit", "")]),
                             st["commit"]} - {""})
  programs.update({k: v.as_dict() for k, v in res.items()})
  out = {"stamp": st, "slice": slice_name, "layers": mcfg.num_layers,
         "train_layout": cfg.mesh.train_layout,
         # The train passes' tensor shards: 1 with "fsdp", else the train mesh's.
         "train_tp": (1 if cfg.mesh.train_layout == "fsdp"
                      else cfg.mesh.train_tensor or cfg.mesh.tensor),
         "programs": programs}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as fh:
    json.dump(out, fh, indent=1)
  return out


def describe(sp: Split) -> str:
  t, c = sp.per_trip, sp.per_call
  return (f"per micro-batch {t.count:.0f} collectives, {t.nbytes / 1e9:.2f} GB, sent "
          f"{(t.exposed_wire + t.overlapped_wire) / 1e9:.2f} GB/chip (exposed {t.exposed:.0f}, "
          f"{t.exposed_wire / 1e9:.2f} GB sent); per call {c.count:.0f}, {c.nbytes / 1e9:.2f} GB "
          f"(exposed {c.exposed:.0f}); kinds "
          + ", ".join(f"{k} {v:.0f}" for k, v in sorted(sp.kinds.items())))


def load(path: str) -> dict:
  """{program: Split} from a --json file of this tool."""
  with open(path, encoding="utf-8") as fh:
    return {k: Split.from_dict(v) for k, v in json.load(fh)["programs"].items()}


def layout_of(path: str) -> str:
  """The config.mesh.train_layout a --json file was compiled with ("shared" before the
  field was written)."""
  with open(path, encoding="utf-8") as fh:
    return json.load(fh).get("train_layout", "shared")


def train_tp_of(path: str, tensor: int) -> int:
  """The train passes' tensor shards a --json file was compiled with: its "train_tp", else
  (a file from before config.mesh.train_tensor) 1 for the "fsdp" layout, `tensor`
  (mesh.tensor) for "shared"."""
  with open(path, encoding="utf-8") as fh:
    got = json.load(fh).get("train_tp")
  if got is not None:
    return int(got)
  return 1 if layout_of(path) == "fsdp" else tensor


if __name__ == "__main__":
  from absl import flags as _flags  # pylint: disable=ungrouped-imports
  from ml_collections import config_flags
  from vapo_jax import cli  # pylint: disable=import-outside-toplevel,ungrouped-imports
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  _flags.DEFINE_string("topology", "v5p-128", "TPU slice, e.g. v5p-128")
  _flags.DEFINE_string("arch", None, "Architecture (archs.KNOWN name or config.json).")
  _flags.DEFINE_list("layers", ["2", "4"], "Two layer counts to compile (real width).")
  _flags.DEFINE_list("programs", list(PROGRAMS), "Train programs to compile.")
  _flags.DEFINE_string("json", None, "Write the extrapolated collectives here.")
  _flags.DEFINE_string("save_hlo", None, "Also keep the compiled HLO texts here (gzip).")
  _flags.DEFINE_string("from_hlo", None, "Compile nothing: read the texts --save_hlo kept.")
  cli.run(main)
