"""Collectives in compiled HLO text: how many, how many bytes, which sit inside loop bodies.

  text = jax.jit(f).lower(*args).compile().as_text()
  stats = hlo_stats.collectives(text)            # every collective of the program
  loops = hlo_stats.while_bodies(text)           # per while loop: its body's collectives
  bad = hlo_stats.invariant_gathers(text)        # all-gathers of loop-invariant carries

A collective is an instruction whose opcode is one of `KINDS` (an async pair
`all-gather-start` / `-done` counts once, as its start). Its bytes are the bytes of its result
shape (for an all-gather: the gathered array; for an all-reduce: the reduced one). Computations
called from a computation (fusions, calls, nested loops, conditionals) are counted inside it,
each call once; a nested loop's body is counted once too (trip counts are not known from text).

The decode-weight question. Weights enter a `while` loop as elements of its carry tuple that the
body hands back unchanged (`ROOT tuple(..., get-tuple-element(param), index=i, ...)`): loop
invariants. An all-gather inside the body whose operand is derived from such an element (through
bitcasts, converts, copies, reshapes, transposes, slices, or a fusion with one array operand)
re-gathers the same bytes at every trip: with FSDP-sharded weights, a per-token weight gather.
`invariant_gathers` lists those.
"""

from __future__ import annotations

import dataclasses
import re

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
         "collective-broadcast", "ragged-all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1, "token": 0}
# Ops through which a value stays "the same array" for the invariance trace.
_PASS = ("bitcast", "convert", "copy", "reshape", "transpose", "slice", "dynamic-slice",
         "bitcast-convert", "broadcast", "copy-start", "copy-done", "optimization-barrier")

_COMP = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")


@dataclasses.dataclass
class Instr:
  name: str
  shape: str          # result shape text, e.g. "bf16[256,1,5120]{2,1,0}" or a tuple
  op: str
  operands: list[str]
  attrs: str          # the rest of the line after the operand list
  root: bool = False


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape text (a tuple: the sum of its arrays)."""
  total = 0
  for dtype, dims in _SHAPE.findall(shape):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * _DTYPE_BYTES.get(dtype, 4)
  return total


def _split_operands(s: str) -> tuple[list[str], str]:
  """Operand names of `a, b), attrs...` and the attribute text after the closing paren."""
  depth, i = 0, 0
  for i, ch in enumerate(s):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      if depth == 0:
        break
      depth -= 1
  inner, rest = s[:i], s[i + 1:]
  names = re.findall(r"%([\w.\-]+)", inner)
  if not names:  # HLO printed without '%' sigils
    names = [tok.strip().split(" ")[-1] for tok in inner.split(",") if tok.strip()]
  return names, rest


def parse(text: str) -> dict[str, dict[str, Instr]]:
  """{computation name: {instruction name: Instr}} (insertion order = text order)."""
  comps: dict[str, dict[str, Instr]] = {}
  cur = None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m and "=" not in line.split("->")[0].split("(")[0]:
      cur = comps.setdefault(m.group(2), {})
      continue
    if line.strip() == "}":
      cur = None
      continue
    if cur is None:
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    operands, attrs = _split_operands(m.group(5))
    cur[m.group(2)] = Instr(m.group(2), m.group(3), m.group(4), operands, attrs,
                            bool(m.group(1)))
  return comps


def _called(instr: Instr) -> list[str]:
  """Computations an instruction calls (fusion, call, while, conditional, reducers)."""
  names = re.findall(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)",
                     instr.attrs)
  for m in re.finditer(r"branch_computations=\{([^}]*)\}", instr.attrs):
    names += re.findall(r"%?([\w.\-]+)", m.group(1))
  return names


def _kind(op: str) -> str | None:
  base = op.removesuffix("-start")
  return base if base in KINDS and not op.endswith("-done") else None


@dataclasses.dataclass
class Counts:
  count: dict[str, int] = dataclasses.field(default_factory=dict)
  bytes: dict[str, int] = dataclasses.field(default_factory=dict)

  def add(self, kind: str, nbytes: int):
    self.count[kind] = self.count.get(kind, 0) + 1
    self.bytes[kind] = self.bytes.get(kind, 0) + nbytes

  @property
  def total(self) -> int:
    return sum(self.count.values())

  @property
  def total_bytes(self) -> int:
    return sum(self.bytes.values())

  def as_dict(self) -> dict:
    return {"count": dict(self.count), "bytes": dict(self.bytes), "total": self.total,
            "total_bytes": self.total_bytes}


def _count(comps, name: str, out: Counts, seen_calls=None, skip_bodies=False):
  for instr in comps.get(name, {}).values():
    k = _kind(instr.op)
    if k:
      # An async start's result is a tuple (operands, results, u32[] contexts): the result is
      # its last non-scalar array.
      shapes = [sd for sd in _SHAPE.findall(instr.shape) if sd[1]]
      if instr.op.endswith("-start") and len(shapes) > 1:
        dtype, dims = shapes[-1]
        out.add(k, shape_bytes(f"{dtype}[{dims}]"))
      else:
        out.add(k, shape_bytes(instr.shape))
    if skip_bodies and instr.op == "while":
      continue
    for c in _called(instr):
      _count(comps, c, out, seen_calls, skip_bodies)


def entry_name(comps, text: str) -> str:
  m = re.search(r"^\s*ENTRY\s+%?([\w.\-]+)", text, re.M)
  return m.group(1) if m else next(iter(comps))


def collectives(text: str) -> Counts:
  """All collectives of the program (loop bodies counted once)."""
  comps = parse(text)
  out = Counts()
  _count(comps, entry_name(comps, text), out)
  return out


@dataclasses.dataclass
class Loop:
  name: str              # the while instruction
  body: str
  collectives: Counts    # in one trip of the body (nested loops' bodies counted once)


def while_bodies(text: str) -> list[Loop]:
  """Every while loop of the program with the collectives of one trip of its body."""
  comps = parse(text)
  loops = []
  for instrs in comps.values():
    for instr in instrs.values():
      if instr.op != "while":
        continue
      body = re.search(r"body=%?([\w.\-]+)", instr.attrs).group(1)
      c = Counts()
      _count(comps, body, c)
      loops.append(Loop(instr.name, body, c))
  return loops


def _invariant_indices(body: dict[str, Instr]) -> set[int]:
  params = [i for i in body.values() if i.op == "parameter"]
  root = next((i for i in body.values() if i.root), None)
  if not params or root is None or root.op != "tuple":
    return set()
  p = params[0].name
  out = set()
  for idx, operand in enumerate(root.operands):
    src = body.get(operand)
    if src is not None and src.op == "get-tuple-element" and src.operands == [p]:
      m = re.search(r"index=(\d+)", src.attrs)
      if m and int(m.group(1)) == idx:
        out.add(idx)
  return out


def _array_operands(instrs: dict[str, Instr], instr: Instr) -> list[str]:
  """Operands that are not scalars (a fusion's index or constant inputs do not count)."""
  out = []
  for o in instr.operands:
    src = instrs.get(o)
    if src is None:
      continue
    dims = _SHAPE.findall(src.shape)
    if src.op == "constant" or (len(dims) == 1 and dims[0][1] == ""):
      continue
    out.append(o)
  return out


def _traces_to(instrs, name: str, param: str, indices: set[int], depth=0) -> int | None:
  """The invariant carry index `name` is derived from, or None."""
  instr = instrs.get(name)
  if instr is None or depth > 64:
    return None
  if instr.op == "get-tuple-element" and instr.operands == [param]:
    i = int(re.search(r"index=(\d+)", instr.attrs).group(1))
    return i if i in indices else None
  if instr.op in _PASS or instr.op.startswith("all-gather") or instr.op == "fusion":
    ops = _array_operands(instrs, instr)
    if instr.op == "fusion" and len(ops) != 1:
      return None
    if ops:
      return _traces_to(instrs, ops[0], param, indices, depth + 1)
  return None


def invariant_carry_bytes(text: str, body: str) -> dict[str, int]:
  """Bytes by dtype of the loop-invariant carry elements of while body `body` (per device):
  the weights a decode loop reads in place, in the dtype it reads them."""
  comps = parse(text)
  instrs = comps.get(body, {})
  params = [i for i in instrs.values() if i.op == "parameter"]
  if not params:
    return {}
  shapes = re.findall(r"([a-z][a-z0-9]*\[[0-9,]*\])", params[0].shape)
  out: dict[str, int] = {}
  for i in _invariant_indices(instrs):
    if i < len(shapes):
      dtype = shapes[i].split("[")[0]
      out[dtype] = out.get(dtype, 0) + shape_bytes(shapes[i])
  return out


@dataclasses.dataclass
class Gather:
  loop_body: str
  instr: str
  shape: str
  nbytes: int
  carry_index: int


def invariant_gathers(text: str) -> list[Gather]:
  """All-gathers inside a while body whose operand derives from a loop-invariant carry."""
  comps = parse(text)
  found = []
  for instrs in comps.values():
    for w in instrs.values():
      if w.op != "while":
        continue
      body_name = re.search(r"body=%?([\w.\-]+)", w.attrs).group(1)
      body = comps.get(body_name, {})
      params = [i for i in body.values() if i.op == "parameter"]
      if not params:
        continue
      indices = _invariant_indices(body)
      for instr in body.values():
        if _kind(instr.op) != "all-gather":
          continue
        ops = _array_operands(body, instr)
        idx = _traces_to(body, ops[0], params[0].name, indices) if ops else None
        if idx is not None:
          found.append(Gather(body_name, instr.name, instr.shape, shape_bytes(instr.shape),
                              idx))
  return found
