"""vapo_jax.compat: the supported jax range and the experimental jax API it wraps."""

import re
import warnings

import jax
import pytest

from vapo_jax import compat

pytestmark = pytest.mark.floor


def test_version_tuple_and_range():
  assert compat.version_tuple("0.12.0.1") == (0, 12, 0, 1)
  assert compat.version_tuple("0.13.0rc1") == (0, 13)
  assert compat.version_tuple("0.10.2.dev20261203") == (0, 10, 2)
  for v, ok in (("0.10.1", False), ("0.10.2", True), ("0.11.1", True), ("0.12.0.1", True),
                ("0.12.9", True), ("0.13.0", False), ("0.4.38", False)):
    assert compat.jax_supported(v) == ok, v


def test_the_running_jax_is_supported_and_setup_py_says_the_same():
  assert compat.jax_supported(), jax.__version__
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    compat.warn_if_unsupported()  # in range: silent
  import os  # pylint: disable=import-outside-toplevel
  setup_py = os.path.join(os.path.dirname(__file__), "..", "..", "setup.py")
  setup = open(setup_py, encoding="utf-8").read()
  lo, hi = compat.SUPPORTED_JAX
  pin = f'"jax>={".".join(map(str, lo))},<{".".join(map(str, hi))}"'
  assert pin in setup, pin
  assert f'"jax[tpu]>={".".join(map(str, lo))},<{".".join(map(str, hi))}"' in setup


def test_the_pallas_kernel_has_the_signature_we_call():
  import inspect  # pylint: disable=import-outside-toplevel
  kernel = compat.ragged_paged_attention_kernel()
  params = inspect.signature(kernel.ragged_paged_attention).parameters
  assert list(params)[:6] == ["q", "kv_pages", "kv_lens", "page_indices", "cu_q_lens",
                              "num_seqs"]
  for kw in ("sm_scale", "num_kv_pages_per_block", "num_queries_per_block"):
    assert params[kw].kind is inspect.Parameter.KEYWORD_ONLY, kw
  assert callable(kernel.ref_ragged_paged_attention)


def test_libtpu_matches_jax_when_installed():
  """jax[tpu]==X pins libtpu; a libtpu of another jax fails to load its topologies."""
  libtpu = compat.libtpu_version()
  if libtpu is None:
    pytest.skip("libtpu is not installed")
  import importlib.metadata as md  # pylint: disable=import-outside-toplevel
  pins = [r for r in (md.requires("jax") or []) if r.startswith("libtpu")]
  want = re.search(r"==([\d.]+)\.\*", pins[0]).group(1) if pins else None
  assert want is None or libtpu.startswith(want), (libtpu, pins)
