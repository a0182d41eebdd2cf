"""The supported jax range, and every place where vapo_jax leans on jax's experimental API.

Supported: jax 0.10.2 (Python 3.11; CI's floor leg) to 0.12.x (Python 3.12/3.13; CI's
newest leg), flax 0.12.8+, optax 0.2.8+, orbax-checkpoint 0.12.4+ (setup.py, README
"Supported versions"). Whatever differs between these versions is handled here and nowhere
else; the rest of the package imports these names instead of reaching into
`jax.experimental` itself, so a move in a later jax is one edit in this file.

What the range needs today (checked on jax 0.10.2 and 0.12.0.1):
  * jax's TPU Pallas kernel `ragged_paged_attention` (and its reference): the same module
    path and the same signature (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
    *, sm_scale, num_kv_pages_per_block, num_queries_per_block, ...) in both.
  * jax's TPU Pallas splash attention (`splash_attention_kernel`, `splash_attention_mask_info`):
    the same files in both apart from scratch-buffer plumbing inside the kernels. vapo_jax
    builds the kernel's block tables (`MaskInfo`: data_next, mask_next, block_mask,
    partial_mask_blocks, q_sequence) itself and constructs `SplashAttentionKernel(fwd, dq,
    dkv, **options)` directly, both the same in 0.10.2 and 0.12.0.1; `splash_attention`
    below is the one place that knows these names.
  * TPU topologies from libtpu without a TPU (`jax.experimental.topologies`): the same
    `get_topology_desc` keywords in both; libtpu must match the installed jax
    (`pip install "jax[tpu]==<jax version>"`: libtpu 0.0.42.1 for 0.10.2, 0.0.50.1 for
    0.12.0.1).

Floor 1: imports jax only (the kernel and topologies modules lazily, where used).
"""

import importlib.metadata
import warnings

import jax

SUPPORTED_JAX = ((0, 10, 2), (0, 13))  # jax >= 0.10.2, < 0.13


def version_tuple(version: str) -> tuple[int, ...]:
  """`"0.12.0.1"` -> (0, 12, 0, 1); stops at the first part that is not a number (`rc1`)."""
  out = []
  for part in version.split("."):
    if not part.isdigit():
      break
    out.append(int(part))
  return tuple(out)


def jax_version() -> tuple[int, ...]:
  """The running jax's version as numbers."""
  return version_tuple(jax.__version__)


def jax_supported(version: str | None = None) -> bool:
  """True when `version` (default: the running jax) is in the supported range."""
  v = version_tuple(version or jax.__version__)[:3]
  return SUPPORTED_JAX[0] <= v < SUPPORTED_JAX[1]


def warn_if_unsupported() -> None:
  """One warning when the running jax is outside the supported range (it may still work)."""
  if not jax_supported():
    lo, hi = SUPPORTED_JAX
    warnings.warn(f"jax {jax.__version__} is outside vapo_jax's tested range "
                  f"(>= {'.'.join(map(str, lo))}, < {'.'.join(map(str, hi))}); "
                  "see README 'Supported versions'", stacklevel=2)


def libtpu_version() -> str | None:
  """The installed libtpu's version, or None without it."""
  try:
    return importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    return None


def ragged_paged_attention_kernel():
  """jax's TPU Pallas module for ragged paged attention (`ragged_paged_attention`,
  `ref_ragged_paged_attention`, ...); importing it needs no TPU."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel
  return kernel


class _Splash:
  """jax's splash attention as vapo_jax uses it (`models.splash_attention`)."""

  def __init__(self):
    # pylint: disable=import-outside-toplevel
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel, splash_attention_mask_info)
    self.kernel = splash_attention_kernel
    self.mask_info = splash_attention_mask_info

  def make_kernel(self, fwd, dq, dkv, *, block: int, mask_function, interpret: bool = False,
                  residual_name: str | None = None):
    """A `SplashAttentionKernel` from our own (forward, dq, dkv) `MaskInfo` tables, one
    block size c everywhere; called as kernel(q [H, L, Dh], k, v [K, L, Dh], SegmentIds).
    dq None: the fused backward (one kernel for dq, dk, dv; it writes a dq partial per key
    block, [L / c, H, L, Dh], summed after), else separate dq and dk/dv kernels.
    residual_name: the `checkpoint_name` of the forward's residuals (output, log-sum-exp)."""
    sk = self.kernel
    c = block
    fused = dq is None
    sizes = sk.BlockSizes(block_q=c, block_kv=c, block_kv_compute=c, block_q_dkv=c,
                          block_kv_dkv=c, block_kv_dkv_compute=c,
                          block_q_dq=None if fused else c, block_kv_dq=None if fused else c,
                          use_fused_bwd_kernel=fused)
    return sk.SplashAttentionKernel(
        fwd, dq, dkv, block_sizes=sizes, is_mqa=False, save_residuals=False,
        mask_value=sk.DEFAULT_MASK_VALUE, attn_logits_soft_cap=None,
        residual_checkpoint_name=residual_name, mask_function=mask_function, interpret=interpret)


def splash_attention() -> _Splash:
  """jax's TPU Pallas splash attention: `.kernel`, `.mask_info` (modules) and
  `.make_kernel(...)`; importing it needs no TPU."""
  return _Splash()


def tpu_topology_devices(topology_name: str, host_bounds, chip_config_name: str | None = None):
  """The devices of a TPU slice described by libtpu (no TPU needed; libtpu must be there).

  topology_name: e.g. "v5p:2x2x1"; host_bounds: the chips per host (x, y, z).
  """
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  kw = {"chip_config_name": chip_config_name} if chip_config_name else {}
  return topologies.get_topology_desc(platform="tpu", topology_name=topology_name,
                                      chips_per_host_bounds=host_bounds, num_slices=1,
                                      **kw).devices
