"""models.platform.choose_kernel: the "auto" / "jax" / "tpu" choice that the train passes'
splash attention and the engine's paged attention share."""

import pytest

from vapo_jax.models import platform


def _said():
  said = []
  return said, lambda *a, **kw: said.append(a[0])


def test_jax_never_asks_and_tpu_is_refused_with_the_setting_and_reason():
  said, log = _said()
  asked = []
  assert platform.choose_kernel("jax", lambda: asked.append(1), "s.k", "[x] fallback",
                                log) == "jax"
  assert not asked
  assert platform.choose_kernel("tpu", lambda: None, "s.k", "[x] fallback", log) == "tpu"
  with pytest.raises(ValueError, match=r"^s\.k='tpu': too wide; use 'auto' or 'jax'$"):
    platform.choose_kernel("tpu", lambda: "too wide", "s.k", "[x] fallback", log)
  with pytest.raises(ValueError, match="must be 'auto', 'jax' or 'tpu'"):
    platform.choose_kernel("splash", lambda: None, "s.k", "[x] fallback", log)
  assert not said


def test_auto_falls_back_saying_each_reason_once_per_fallback_and_nothing_off_tpu():
  said, log = _said()
  off = f"{platform.OFF_TPU}, and this program is traced for cpu"
  assert platform.choose_kernel("auto", lambda: None, "s.k", "[a] jax", log) == "tpu"
  assert platform.choose_kernel("auto", lambda: off, "s.k", "[a] jax", log) == "jax"
  assert not said
  for _ in range(2):
    assert platform.choose_kernel("auto", lambda: "test-only reason", "s.k", "[a] jax",
                                  log) == "jax"
    assert platform.choose_kernel("auto", lambda: "test-only reason", "t.k", "[b] jax",
                                  log) == "jax"
  assert said == ["[a] jax: test-only reason", "[b] jax: test-only reason"]
