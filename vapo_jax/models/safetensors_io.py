"""Minimal safetensors reader/writer on numpy memory maps.

The format: an 8-byte little-endian header length N, N bytes of JSON mapping
each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
relative to the end of the header), then the raw little-endian bytes.

Reading through `np.memmap` means slicing a tensor touches only the pages of
that slice, so a host that owns 1/8 of a weight reads about 1/8 of it. Our own
reader also handles bfloat16 (via ml_dtypes) without torch.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class SafetensorsFile:
  """Lazy view of one .safetensors file: `f.shape(name)`, `f.array(name)`."""

  def __init__(self, path: str):
    self.path = path
    with open(path, "rb") as fh:
      (n,) = struct.unpack("<Q", fh.read(8))
      header = json.loads(fh.read(n))
    self.metadata = header.pop("__metadata__", {})
    self._header = header
    self._offset = 8 + n
    self._mmap = None

  def keys(self) -> list[str]:
    return list(self._header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._header[name]["shape"])

  def dtype(self, name: str) -> np.dtype:
    code = self._header[name]["dtype"]
    if code not in _DTYPES:
      raise ValueError(f"{self.path}: tensor {name} has unsupported dtype "
                       f"{code}.")
    return np.dtype(_DTYPES[code])

  def array(self, name: str) -> np.ndarray:
    """A read-only memory-mapped array; slicing it reads only that slice."""
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    begin, end = self._header[name]["data_offsets"]
    raw = self._mmap[self._offset + begin:self._offset + end]
    return raw.view(self.dtype(name)).reshape(self.shape(name))


def write(path: str, tensors: dict[str, np.ndarray],
          metadata: dict[str, str] | None = None) -> None:
  """Writes `tensors` (name -> numpy array) as one safetensors file."""
  header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
  offset = 0
  arrays = []
  for name, arr in tensors.items():
    arr = np.ascontiguousarray(arr)
    if arr.dtype not in _NAMES:
      raise ValueError(f"Cannot write {name} of dtype {arr.dtype}.")
    header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + arr.nbytes]}
    offset += arr.nbytes
    arrays.append(arr)
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  tmp = path + ".tmp"
  with open(tmp, "wb") as fh:
    fh.write(struct.pack("<Q", len(blob)))
    fh.write(blob)
    for arr in arrays:
      fh.write(arr.reshape(-1).view(np.uint8).data)
  os.replace(tmp, path)


class CheckpointFiles:
  """All tensors of an HF checkpoint dir: one file or index-sharded files."""

  def __init__(self, directory: str):
    index = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    self.directory = directory
    self._files: dict[str, SafetensorsFile] = {}
    self._where: dict[str, str] = {}
    if os.path.exists(index):
      with open(index) as fh:
        weight_map = json.load(fh)["weight_map"]
      for name, fname in weight_map.items():
        fpath = os.path.join(directory, fname)
        if not os.path.exists(fpath):
          raise FileNotFoundError(f"{index} lists {fname} (for {name}) but "
                                  f"{fpath} does not exist.")
        self._where[name] = fpath
    elif os.path.exists(single):
      for name in self._open(single).keys():
        self._where[name] = single
    else:
      raise FileNotFoundError(
          f"No model.safetensors or model.safetensors.index.json in "
          f"{directory} (pytorch .bin checkpoints are not supported; convert "
          f"with transformers' save_pretrained(safe_serialization=True)).")

  def _open(self, fpath: str) -> SafetensorsFile:
    if fpath not in self._files:
      self._files[fpath] = SafetensorsFile(fpath)
    return self._files[fpath]

  def keys(self) -> list[str]:
    return list(self._where)

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def shape(self, name: str) -> tuple[int, ...]:
    return self._open(self._where[name]).shape(name)

  def array(self, name: str) -> np.ndarray:
    return self._open(self._where[name]).array(name)
