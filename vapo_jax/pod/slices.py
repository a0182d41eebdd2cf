"""TPU slices by name: chips, topology, HBM, peak FLOP/s — what the compile check needs.

Names, as `gcloud compute tpus tpu-vm create --accelerator-type` spells them:

  v4-N, v5p-N          N = TensorCores = 2 × chips (megacore: one JAX device per chip)
  v5litepod-N, v5e-N   N = chips (one TensorCore each)
  v6e-N                N = chips
  GEN:AxBxC            an explicit chip topology, e.g. v5p:4x4x4 (= v5p-128) or v5e:2x2

Per-chip figures (Google Cloud TPU documentation, 2026): HBM capacity, dense bf16 peak,
HBM bandwidth and inter-chip interconnect bandwidth (ICI: the per-chip Gbps figure / 8).
Slices of more than one host have 4 chips per host ((2, 2, 1) host bounds); single-host
slices of 8 chips (v5e-8, v6e-8) have (2, 4, 1).
"""

from __future__ import annotations

import dataclasses
import math
import re

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Generation:
  name: str                 # "v5p"
  hbm_bytes: int            # per chip
  bf16_flops: float         # dense peak per chip, FLOP/s
  hbm_bandwidth: float      # bytes/s per chip
  cores_per_chip: int       # TensorCores counted in the slice name
  dims: int                 # 3 (v4, v5p: 3-D torus) or 2 (v5e, v6e)
  chip_config: str | None   # chip_config_name for get_topology_desc
  topology_prefix: str      # platform name libtpu expects in "v5p:4x4x4"
  ici_bandwidth: float = 0.0  # bytes/s per chip, inter-chip interconnect (all links)


GENERATIONS = {
    "v4": Generation("v4", 32 * GIB, 275e12, 1228e9, 2, 3, "megacore", "v4", 2400e9 / 8),
    "v5e": Generation("v5e", 16 * GIB, 197e12, 819e9, 1, 2, None, "v5e", 1600e9 / 8),
    "v5p": Generation("v5p", 95 * GIB, 459e12, 2765e9, 2, 3, "megacore", "v5p", 4800e9 / 8),
    "v6e": Generation("v6e", 32 * GIB, 918e12, 1640e9, 1, 2, None, "v6e", 3584e9 / 8),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "trillium": "v6e"}

# Chip count -> topology; 3-D slices as Cloud TPU's default shapes, 2-D as v5e/v6e pods.
_SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
              128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16),
              2048: (8, 16, 16), 4096: (16, 16, 16)}
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
              128: (8, 16), 256: (16, 16)}


@dataclasses.dataclass(frozen=True)
class Slice:
  """One pod slice: its generation, chip topology and what a program may use per chip."""
  name: str                       # as given, e.g. "v5p-128"
  gen: Generation
  shape: tuple[int, ...]          # chips per dimension

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def hosts(self) -> int:
    return max(1, self.chips // (8 if self.chips == 8 and self.gen.dims == 2 else 4))

  @property
  def topology_name(self) -> str:
    return f"{self.gen.topology_prefix}:{'x'.join(map(str, self.shape))}"

  @property
  def accelerator_type(self) -> str:
    """The gcloud --accelerator-type of this slice."""
    n = self.chips * self.gen.cores_per_chip
    return f"v5litepod-{n}" if self.gen.name == "v5e" else f"{self.gen.name}-{n}"

  def host_bounds(self) -> tuple[int, int, int]:
    if self.chips < 4:
      return (1, 1, 1)
    if self.chips == 8 and self.gen.dims == 2:
      return (2, 4, 1)
    return (2, 2, 1)


def parse(name: str) -> Slice:
  """A `Slice` from "v5p-128", "v5litepod-16", "v6e-8" or "v5p:4x4x4"; ValueError if unknown."""
  m = re.fullmatch(r"([a-z0-9]+?)(?:[-:])([0-9x]+)", name.strip().lower())
  if not m:
    raise ValueError(f"unknown TPU slice {name!r}; use e.g. v5p-128, v5litepod-16, v6e-8, "
                     "v4-32 or v5p:4x4x4")
  gen_name = ALIASES.get(m.group(1), m.group(1))
  if gen_name not in GENERATIONS:
    raise ValueError(f"unknown TPU generation {m.group(1)!r} in {name!r}; known: "
                     f"{sorted(GENERATIONS)} (and {sorted(ALIASES)})")
  gen = GENERATIONS[gen_name]
  size = m.group(2)
  if "x" in size:
    shape = tuple(int(x) for x in size.split("x"))
    if len(shape) != gen.dims:
      raise ValueError(f"{name!r}: {gen.name} topologies have {gen.dims} dimensions")
    return Slice(name, gen, shape)
  n = int(size)
  if n % gen.cores_per_chip:
    raise ValueError(f"{name!r}: {gen.name}-N counts TensorCores, a multiple of "
                     f"{gen.cores_per_chip}")
  chips = n // gen.cores_per_chip
  table = _SHAPES_3D if gen.dims == 3 else _SHAPES_2D
  if chips not in table:
    raise ValueError(f"{name!r}: no standard {gen.name} slice of {chips} chips; known chip "
                     f"counts {sorted(table)} (or give GEN:AxBxC)")
  return Slice(name, gen, table[chips])


def devices(s: Slice):
  """The slice's devices from libtpu's topology description (no TPU needed)."""
  import os  # pylint: disable=import-outside-toplevel
  # Another process on this machine may hold libtpu's lock; compiling needs no TPU.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from vapo_jax import compat  # pylint: disable=import-outside-toplevel
  return compat.tpu_topology_devices(s.topology_name, s.host_bounds(), s.gen.chip_config)


def libtpu_available() -> bool:
  """True when libtpu is installed (the check can compile for TPUs on this machine)."""
  try:
    import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    return True
  except ImportError:
    return False
