"""HF checkpoints in and out: config.json + (sharded) safetensors.

Name and layout map (HF torch Linear weights are [out, in]; ours [in, out],
with attention heads split out):

  model.embed_tokens.weight                [V, D]      embed           [V, D]
  (below, "L." is model.layers.i. and "b/" is blocks/i/)
  L.input_layernorm.weight           [D]         b/attn_norm/scale
  L.self_attn.q_proj.weight          [H*Dh, D]   b/attn/q       [D, H, Dh]
  L.self_attn.q_proj.bias            [H*Dh]      b/attn/q_bias  [H, Dh]
  (k_proj, v_proj likewise with K heads; q_norm/k_norm [Dh] for Qwen3)
  L.self_attn.o_proj.weight          [D, H*Dh]   b/attn/o       [H, Dh, D]
  L.post_attention_layernorm.weight  [D]         b/mlp_norm/scale
  L.mlp.{gate,up}_proj.weight        [F, D]      b/mlp/{gate,up} [D, F]
  L.mlp.down_proj.weight             [D, F]      b/mlp/down     [F, D]
  model.norm.weight                        [D]         final_norm/scale
  lm_head.weight                           [V, D]      lm_head [D, V] (untied)
  score.weight (sequence classification)   [1, D]      critic score [D]

With stacked blocks (`models.stacked`, the default) our path is blocks/<name> with a leading
layer axis [L, ...]: `hf_name` gives the HF name as a template "model.layers.{}.<name>",
and the array holds the L tensors model.layers.0 ... model.layers.L-1, one per row.

Loading places each tensor straight into its sharding with
`jax.make_array_from_callback`: the callback reads, from a memory-mapped
file, only the slice a local device owns, so no host holds a whole 32B model.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vapo_jax import hub
from vapo_jax import sharding as shd
from vapo_jax.models import lora
from vapo_jax.models import safetensors_io as st_io
from vapo_jax.models.config import ModelConfig
from vapo_jax.models.transformer import Transformer

COPY, LINEAR, IN_HEADS, OUT_HEADS, BIAS_HEADS, ROW = (
    "copy", "linear", "in_heads", "out_heads", "bias_heads", "row")

# Tensors some checkpoints carry that carry no parameters of ours.
_ALWAYS_IGNORED = (r".*rotary_emb\.inv_freq$",)

_LAYER = {
    "attn_norm/scale": ("input_layernorm.weight", COPY),
    "mlp_norm/scale": ("post_attention_layernorm.weight", COPY),
    "attn/q": ("self_attn.q_proj.weight", IN_HEADS),
    "attn/k": ("self_attn.k_proj.weight", IN_HEADS),
    "attn/v": ("self_attn.v_proj.weight", IN_HEADS),
    "attn/o": ("self_attn.o_proj.weight", OUT_HEADS),
    "attn/q_bias": ("self_attn.q_proj.bias", BIAS_HEADS),
    "attn/k_bias": ("self_attn.k_proj.bias", BIAS_HEADS),
    "attn/v_bias": ("self_attn.v_proj.bias", BIAS_HEADS),
    "attn/o_bias": ("self_attn.o_proj.bias", COPY),
    "attn/q_norm/scale": ("self_attn.q_norm.weight", COPY),
    "attn/k_norm/scale": ("self_attn.k_norm.weight", COPY),
    "mlp/gate": ("mlp.gate_proj.weight", LINEAR),
    "mlp/up": ("mlp.up_proj.weight", LINEAR),
    "mlp/down": ("mlp.down_proj.weight", LINEAR),
    "mlp/gate_bias": ("mlp.gate_proj.bias", COPY),
    "mlp/up_bias": ("mlp.up_proj.bias", COPY),
    "mlp/down_bias": ("mlp.down_proj.bias", COPY),
}


def hf_name(path: str, prefix: str = "model.") -> tuple[str, str]:
  """(HF tensor name, layout kind) of one of our parameter paths."""
  if path == "embed":
    return prefix + "embed_tokens.weight", COPY
  if path == "final_norm/scale":
    return prefix + "norm.weight", COPY
  if path == "lm_head":
    return "lm_head.weight", LINEAR
  m = re.fullmatch(r"blocks/(\d+)/(.+)", path)
  if m and m.group(2) in _LAYER:
    name, kind = _LAYER[m.group(2)]
    return f"{prefix}layers.{m.group(1)}.{name}", kind
  m = re.fullmatch(r"blocks/(.+)", path)
  if m and m.group(1) in _LAYER:  # stacked blocks: one HF tensor per layer
    name, kind = _LAYER[m.group(1)]
    return prefix + "layers.{}." + name, kind
  raise KeyError(f"No HF name for parameter {path!r}.")


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF tensor shape that holds one of our arrays of `shape`."""
  if kind == COPY:
    return tuple(shape)
  if kind == LINEAR:
    return tuple(reversed(shape))
  if kind == IN_HEADS:
    return (shape[1] * shape[2], shape[0])
  if kind == OUT_HEADS:
    return (shape[2], shape[0] * shape[1])
  if kind == BIAS_HEADS:
    return (shape[0] * shape[1],)
  if kind == ROW:
    return (1,) + tuple(shape)
  raise ValueError(kind)


def read_slice(kind: str, hf: np.ndarray, index: tuple[slice, ...],
               shape: tuple[int, ...]) -> np.ndarray:
  """Our-layout slice `index` (of an array of `shape`) read from HF `hf`."""
  idx = tuple(slice(*s.indices(n)) for s, n in zip(index, shape))
  idx = idx + tuple(slice(0, n) for n in shape[len(idx):])
  if kind == COPY:
    return np.asarray(hf[idx])
  if kind == LINEAR:
    return np.asarray(hf[idx[1], idx[0]]).T
  if kind == IN_HEADS:
    a, h, d = idx
    dh = shape[2]
    x = np.asarray(hf[h.start * dh:h.stop * dh, a])
    return x.reshape(h.stop - h.start, dh, -1).transpose(2, 0, 1)[:, :, d]
  if kind == OUT_HEADS:
    h, d, c = idx
    dh = shape[1]
    x = np.asarray(hf[c, h.start * dh:h.stop * dh])
    return x.reshape(-1, h.stop - h.start, dh).transpose(1, 2, 0)[:, d, :]
  if kind == BIAS_HEADS:
    h, d = idx
    dh = shape[1]
    return np.asarray(hf[h.start * dh:h.stop * dh]).reshape(-1, dh)[:, d]
  if kind == ROW:
    return np.asarray(hf[(0,) + idx])
  raise ValueError(kind)


def to_hf_layout(kind: str, x: np.ndarray) -> np.ndarray:
  """Inverse of `read_slice` for a whole array."""
  if kind == COPY:
    return x
  if kind == LINEAR:
    return x.T
  if kind == IN_HEADS:
    return x.reshape(x.shape[0], -1).T
  if kind == OUT_HEADS:
    return x.reshape(-1, x.shape[2]).T
  if kind == BIAS_HEADS:
    return x.reshape(-1)
  if kind == ROW:
    return x[None]
  raise ValueError(kind)


def _is_var(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _is_template(name: str) -> bool:
  return "{}" in name


def _tensor_names(name: str, shape: tuple[int, ...]) -> tuple[list[str], tuple[int, ...]]:
  """(HF tensor names, the shape of each in our layout) of one of our arrays: one name, or
  for a template (stacked blocks) one per row of the leading layer axis."""
  if _is_template(name):
    return [name.format(i) for i in range(shape[0])], tuple(shape[1:])
  return [name], tuple(shape)


def load_state(files: st_io.CheckpointFiles, abs_state: Any, shardings: Any,
               name_fn: Callable[[str], tuple[str, str]],
               ignore: tuple[str, ...] = (),
               zeros_if_missing: tuple[str, ...] = ()) -> Any:
  """Fills an abstract nnx State from checkpoint tensors, sharded.

  Args:
    files: the checkpoint's tensors.
    abs_state: nnx State of ShapeDtypeStructs (from `nnx.eval_shape`).
    shardings: matching State of NamedShardings.
    name_fn: our path string -> (HF name, layout kind).
    ignore: regexes of checkpoint tensors that may be left unused.
    zeros_if_missing: our paths that start at zero when the checkpoint lacks
      them (e.g. a fresh value head).

  Returns:
    The State with jax Arrays. Raises ValueError naming every missing tensor,
    unexpected tensor and shape mismatch at once.
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abs_state,
                                                         is_leaf=_is_var)
  shard_leaves = jax.tree_util.tree_leaves(shardings, is_leaf=_is_var)
  missing, mismatched, used, plan = [], [], set(), []
  for (path, var), sh in zip(leaves, shard_leaves):
    ours = path_str(path)
    name, kind = name_fn(ours)
    abs_v = var.get_value()
    names, shape = _tensor_names(name, abs_v.shape)
    want = hf_shape(kind, shape)
    if any(n not in files for n in names) and ours in zeros_if_missing:
      plan.append((var, sh.get_value() if _is_var(sh) else sh, None, kind,
                   abs_v))
      continue
    absent = [n for n in names if n not in files]
    if absent:
      missing.extend(f"{n} (for {ours}, shape {want})" for n in absent)
      continue
    used.update(names)
    bad = [n for n in names if files.shape(n) != want]
    if bad:
      mismatched.extend(f"{n}: checkpoint {files.shape(n)}, model "
                        f"expects {want} (for {ours} {abs_v.shape})" for n in bad)
      continue
    plan.append((var, sh.get_value() if _is_var(sh) else sh, name, kind,
                 abs_v))
  patterns = [re.compile(p) for p in _ALWAYS_IGNORED + tuple(ignore)]
  extra = sorted(k for k in files.keys() if k not in used
                 and not any(p.fullmatch(k) for p in patterns))
  errors = []
  if missing:
    errors.append("missing tensors:\n  " + "\n  ".join(missing))
  if extra:
    errors.append("unexpected tensors (not used by the model):\n  "
                  + "\n  ".join(extra))
  if mismatched:
    errors.append("shape mismatches:\n  " + "\n  ".join(mismatched))
  if errors:
    raise ValueError(f"Checkpoint {files.directory} does not match the model "
                     "config:\n" + "\n".join(errors))
  new_leaves = []
  for var, sharding, name, kind, abs_v in plan:
    if name is None:
      new_leaves.append(var.replace(jax.device_put(
          jnp.zeros(abs_v.shape, abs_v.dtype), sharding)))
      continue
    dtype = abs_v.dtype
    if _is_template(name):  # stacked blocks: row l of the array is model.layers.l

      def cb(index, name=name, kind=kind, shape=abs_v.shape, dtype=dtype):
        rows = range(*index[0].indices(shape[0])) if index else range(shape[0])
        return np.stack([read_slice(kind, files.array(name.format(i)), index[1:],
                                    shape[1:]).astype(dtype) for i in rows])
    else:
      hf = files.array(name)

      def cb(index, hf=hf, kind=kind, shape=abs_v.shape, dtype=dtype):
        return read_slice(kind, hf, index, shape).astype(dtype)

    arr = jax.make_array_from_callback(abs_v.shape, sharding, cb)
    new_leaves.append(var.replace(arr))
  return jax.tree_util.tree_unflatten(treedef, new_leaves)


def read_config(path: str) -> dict[str, Any]:
  if not os.path.isdir(path):
    raise FileNotFoundError(f"Checkpoint directory {path} does not exist.")
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f"{cfg_path} not found: an HF checkpoint dir "
                            "needs config.json.")
  with open(cfg_path) as fh:
    return json.load(fh)


def default_mesh():
  return shd.make_mesh(1, 1, 1, devices=jax.local_devices()[:1])


def from_pretrained(path: str, *, mesh=None,
                    rules: shd.Rules = shd.DEFAULT_RULES,
                    param_dtype: Any = jnp.float32, dtype: Any = None,
                    **overrides) -> tuple[Transformer, ModelConfig]:
  """Loads an HF Qwen2/Qwen2.5/Qwen3/Llama checkpoint directory.

  Args:
    path: directory with config.json and model.safetensors (or an index), or a
      Hub id `org/name[@revision]` (downloaded once into the Hub cache; see
      `vapo_jax.hub`), or a GGUF file (`x.gguf`, `pkg:<module>/<file>`; converted once into
      a cache, see `vapo_jax.gguf_convert`).
    mesh: device mesh to shard over (default: the first local device).
    rules: logical-to-mesh sharding rules.
    param_dtype: parameter storage dtype.
    dtype: compute dtype (default: param_dtype).
    **overrides: other `ModelConfig` fields (remat, real_vocab_size, ...); with
      lora_rank > 0 the checkpoint fills the base and fresh adapters are added.

  Returns:
    (model, cfg).
  """
  path = hub.resolve(path)
  hf = read_config(path)
  cfg = ModelConfig.from_hf(hf, param_dtype=param_dtype,
                            dtype=param_dtype if dtype is None else dtype,
                            **overrides)
  files = st_io.CheckpointFiles(path)
  mesh = default_mesh() if mesh is None else mesh
  graphdef, abs_state = nnx.split(
      nnx.eval_shape(lambda: Transformer(lora.base_config(cfg), rngs=nnx.Rngs(0))))
  shardings = shd.state_shardings(abs_state, mesh, rules)
  ignore = ("lm_head\\.weight",) if cfg.tie_word_embeddings else ()
  state = load_state(files, abs_state, shardings, hf_name, ignore)
  return lora.attach(nnx.merge(graphdef, state), cfg, mesh, rules), cfg


def gather(x: jax.Array) -> np.ndarray:
  """A whole array on this host (all-gathers across processes if needed)."""
  if jax.process_count() > 1 and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top,line-too-long
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def write_checkpoint(path: str, tensors: dict[str, Callable[[], np.ndarray]],
                     hf_config: dict[str, Any],
                     max_shard_bytes: int = 4 << 30) -> None:
  """Writes config.json and safetensors shards (+ index if more than one).

  `tensors` maps names to thunks so at most one shard is in host memory.
  Every process must call this (gathers are collective); process 0 writes.
  """
  write = jax.process_index() == 0
  if write:
    os.makedirs(path, exist_ok=True)
  groups: list[list[str]] = []
  current: dict[str, np.ndarray] = {}
  size = total = 0

  def flush():
    if write:
      st_io.write(os.path.join(path, f"_part{len(groups)}.safetensors"),
                  current)
    groups.append(list(current))
    current.clear()

  for name, thunk in tensors.items():
    arr = thunk()
    if current and size + arr.nbytes > max_shard_bytes:
      flush()
      size = 0
    current[name] = arr
    size += arr.nbytes
    total += arr.nbytes
  flush()
  if not write:
    return
  n = len(groups)
  weight_map = {}
  for i, group in enumerate(groups):
    fname = ("model.safetensors" if n == 1
             else f"model-{i + 1:05d}-of-{n:05d}.safetensors")
    os.replace(os.path.join(path, f"_part{i}.safetensors"),
               os.path.join(path, fname))
    weight_map.update({name: fname for name in group})
  if n > 1:
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
      json.dump({"metadata": {"total_size": total},
                 "weight_map": weight_map}, fh, indent=2)
  with open(os.path.join(path, "config.json"), "w") as fh:
    json.dump(hf_config, fh, indent=2)


def state_tensors(state: Any, name_fn: Callable[[str], tuple[str, str]],
                  dtype: Any = None, skip: tuple[str, ...] = ()
                  ) -> dict[str, Callable[[], np.ndarray]]:
  """HF name -> thunk giving the HF-layout numpy array of each parameter."""
  out = {}
  for path, var in jax.tree_util.tree_flatten_with_path(state,
                                                        is_leaf=_is_var)[0]:
    ours = path_str(path)
    if ours in skip:
      continue
    name, kind = name_fn(ours)

    def thunk(var=var, kind=kind, row=None):
      x = var.get_value()
      x = gather(x if row is None else x[row])
      x = to_hf_layout(kind, x)
      return np.ascontiguousarray(x.astype(dtype) if dtype is not None else x)

    if _is_template(name):  # stacked blocks: one tensor per layer
      for i in range(var.get_value().shape[0]):
        out[name.format(i)] = lambda thunk=thunk, i=i: thunk(row=i)
    else:
      out[name] = thunk
  return out


def save_pretrained(model: Transformer, cfg: ModelConfig, path: str, *,
                    dtype: Any = None, max_shard_bytes: int = 4 << 30) -> None:
  """Writes an HF directory that transformers' `*ForCausalLM` loads.

  LoRA adapters are merged into the weights they adapt (`lora.merged`), stored in
  `dtype` or else the config's param_dtype.

  Args:
    model: the transformer.
    cfg: its config.
    path: output directory (created).
    dtype: dtype to store (default: the parameters' dtype).
    max_shard_bytes: above this, split into model-0000i-of-0000n files.
  """
  if dtype is None and cfg.lora_rank:
    dtype = cfg.param_dtype
  state = nnx.state(lora.merged(model), nnx.Param)
  tensors = state_tensors(state, hf_name, dtype)
  hf_cfg = cfg.to_hf()
  if dtype is not None:
    hf_cfg["dtype"] = jnp.dtype(dtype).name
  write_checkpoint(path, tensors, hf_cfg, max_shard_bytes)


def load_tokenizer(path: str):
  """The tokenizer of an HF directory (or Hub id, see `vapo_jax.hub`), with its chat template.

  Uses transformers' AutoTokenizer (`tok.apply_chat_template(...)` works when
  the directory has a chat template). Without transformers, falls back to a
  `tokenizers.Tokenizer` from tokenizer.json with the template string (or
  None) set as its `chat_template` attribute.
  """
  path = hub.resolve(path, what="tokenizer")
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    transformers = None
  if transformers is not None:
    return transformers.AutoTokenizer.from_pretrained(path)
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("load_tokenizer needs `pip install transformers` (or at "
                      "least `pip install tokenizers`).") from e
  tj = os.path.join(path, "tokenizer.json")
  if not os.path.exists(tj):
    raise FileNotFoundError(f"{tj} not found.")
  tok = tokenizers.Tokenizer.from_file(tj)
  tok.chat_template = read_chat_template(path)
  return tok


def read_chat_template(path: str) -> str | None:
  """The chat template string of an HF directory, or None."""
  jinja = os.path.join(path, "chat_template.jinja")
  if os.path.exists(jinja):
    with open(jinja) as fh:
      return fh.read()
  tc = os.path.join(path, "tokenizer_config.json")
  if os.path.exists(tc):
    with open(tc) as fh:
      return json.load(fh).get("chat_template")
  return None
