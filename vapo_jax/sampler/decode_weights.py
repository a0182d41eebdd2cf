"""The decode copy of the policy: cast to `decode_dtype`, resharded into a decode layout.

Once per RL step (per engine call) the rollout engine turns the training parameters into
its own copy and never reads the training copy again:

  * LoRA: the adapters are folded in, W + (alpha / r) A B in float32 (`models.lora.merged`),
    so decode runs the weights the train step scores, as one matmul per projection;
  * every floating parameter is cast to `dtype` (bfloat16 at pod scale: half the bytes per
    decode step; float32 keeps the engine bit-comparable with the training forward);
  * stacked blocks (`models.stacked`, the training layout) are split back into L per-layer
    blocks: decode runs a Python loop over layers with a cache (a scan would slice every
    weight out of the stack in every decode step), so the copy keeps decode as it was;
  * the layout drops FSDP from the weights (`decode_rules`: logical axes that the training
    rules put on the batch axes -- `embed` over fsdp -- are replicated): each data x fsdp
    group holds a whole tensor-parallel replica, so a decode step needs no weight
    all-gather (the test counts all-gathers in the compiled decode loop).

The cast and the reshard run in one jit with `out_shardings`, so no host holds the model.
"""

from __future__ import annotations

import re
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from vapo_jax import sharding as shd
from vapo_jax.models import lora
from vapo_jax.models import stacked


def decode_rules(mesh: jax.sharding.Mesh | None, rules: shd.Rules = shd.DEFAULT_RULES
                 ) -> shd.Rules:
  """`rules` with every weight axis that maps onto a batch mesh axis replicated."""
  batch = set(shd.batch_axes(mesh, rules)) if mesh is not None else {"data", "fsdp"}
  out = []
  for logical, axes in rules:
    if logical != "batch" and axes is not None:
      names = (axes,) if isinstance(axes, str) else tuple(axes)
      kept = tuple(a for a in names if a not in batch)
      axes = None if not kept else (kept[0] if len(kept) == 1 else kept)
    out.append((logical, axes))
  return tuple(out)


def _cast(dtype):
  def one(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
      return x.astype(dtype)
    return x
  return one


def decode_layout(graphdef, params, dtype: Any, mesh: jax.sharding.Mesh | None = None,
                  rules: shd.Rules = shd.DEFAULT_RULES):
  """(out_graphdef, build, out_shardings, abstract copy) of `decode_copy`, nothing run.

  `params` may be abstract (ShapeDtypeStructs), e.g. for an AOT compile.
  """
  dtype = jnp.dtype(dtype)
  merge = lora.has_adapters(params)
  model0 = nnx.merge(graphdef, params)

  def build(p):
    model = nnx.merge(graphdef, p)
    if merge:
      model = lora.merged(model)
    return jax.tree.map(_cast(dtype), nnx.state(stacked.unstack(model)))

  abstract = jax.eval_shape(build, params)
  out_graphdef = graphdef
  out_cfg = lora.base_config(model0.cfg) if merge else model0.cfg
  if merge or out_cfg.scan_layers:
    out_cfg = out_cfg.replace(scan_layers=False)
    out_graphdef, _ = nnx.split(nnx.eval_shape(
        lambda: type(model0)(out_cfg, rngs=nnx.Rngs(0))))
  shardings = None
  if mesh is not None:
    shardings = shd.state_shardings(abstract, mesh, decode_rules(mesh, rules))
  return out_graphdef, build, shardings, abstract


def decode_copy(graphdef, params, dtype: Any, mesh: jax.sharding.Mesh | None = None,
                rules: shd.Rules = shd.DEFAULT_RULES):
  """(graphdef, params) of the decode copy: adapters merged, cast, decode layout.

  Args:
    graphdef, params: `nnx.split` of the policy (params: an nnx.State, any sharding).
    dtype: the decode dtype (e.g. jnp.bfloat16).
    mesh: the mesh to lay the copy out on (None: wherever jit puts it).
  Returns:
    The graphdef to merge the copy with (the adapter-free one for LoRA) and the copy.
  """
  out_graphdef, build, shardings, _ = decode_layout(graphdef, params, dtype, mesh, rules)
  return out_graphdef, jax.jit(build, out_shardings=shardings)(params)


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+)\s+([a-z][\w\-]*)\((.*)$")
_LAYOUT = ("bitcast", "copy", "convert", "reshape", "transpose", "slice", "dynamic-slice",
           "parameter", "constant")


def _parse(hlo_text: str) -> dict[str, dict[str, tuple[str, str, list[str], str]]]:
  """{computation: {instruction: (shape, opcode, operands, line)}} of HLO text."""
  comps, cur = {}, None
  for line in hlo_text.splitlines():
    m = _INSTR.match(line) if cur is not None else None
    if m:
      args = m.group(4)
      operands = re.findall(r"%([\w.\-]+)", args.split("), ")[0])
      calls = re.findall(r"calls=%?([\w.\-]+)", args)
      comps[cur][m.group(1)] = (m.group(2), m.group(3), operands, calls[0] if calls else "")
      continue
    head = re.match(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$", line)
    if head:
      cur = head.group(1)
      comps[cur] = {}
    elif line.strip() == "}":
      cur = None
  return comps


def param_all_gathers(hlo_text: str) -> list[str]:
  """All-gathers in a while-loop body of compiled HLO whose operand is a loop input (a
  weight carried into the loop): reached from a get-tuple-element of the body's parameter
  through layout and slicing only (bitcast, copy, convert, reshape, transpose, (dynamic-)
  slice, and fusions of those plus scalar index math). Activations computed in the step
  are not matched. An empty list: the loop gathers no parameter per step.
  """
  comps = _parse(hlo_text)

  def layout_only(comp: str) -> bool:
    return all(op in _LAYOUT or shape.split("{")[0].endswith("[]")
               for shape, op, _, _ in comps.get(comp, {}).values())

  found = []
  for body in set(re.findall(r"body=%?([\w.\-]+)", hlo_text)):
    instrs = comps.get(body, {})
    for name, (_, op, operands, _) in instrs.items():
      if not op.startswith("all-gather"):
        continue
      stack, seen = list(operands[:1]), set()
      while stack:
        src = stack.pop()
        if src in seen or src not in instrs:
          continue
        seen.add(src)
        shape, sop, sargs, calls = instrs[src]
        if shape.split("{")[0].endswith("[]"):
          continue  # a scalar (a loop counter, an index), not a gathered array
        if sop == "get-tuple-element":
          found.append(f"{name} <- {src}")
          break
        if sop in _LAYOUT or (sop == "fusion" and layout_only(calls)):
          stack += sargs
  return sorted(found)
