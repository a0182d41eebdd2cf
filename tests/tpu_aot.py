"""`NEEDS_LIBTPU`: the mark of a test that AOT-compiles for a TPU slice on this CPU (libtpu,
no TPU). Outside CI such tests skip without libtpu; in CI (CI=true, set by the runner) a
missing libtpu fails them, so "refuses qwen32b on v5p-8" is never silently untested."""

import os

import pytest

from vapo_jax.pod import slices

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def NEEDS_LIBTPU(test):  # noqa: N802  (a decorator named as the constant it replaced)
  if slices.libtpu_available():
    return test
  if IN_CI:
    def fail(*args, **kwargs):
      del args, kwargs
      pytest.fail('libtpu is not installed but CI must run the TPU compile checks '
                  '(.ci/run installs "jax[tpu]" matching jax)')
    fail.__name__ = test.__name__
    return fail
  return pytest.mark.skip(reason='libtpu is not installed (pip install "jax[tpu]"; '
                                 '.ci/run installs it)')(test)
