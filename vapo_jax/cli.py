"""What every command shares: a quiet start on a CPU host, and one-line errors.

  vapo_jax.cli.run(main)            # instead of absl.app.run(main)

**Platforms.** With libtpu installed (the `tpu` extra, needed by the compile check) and
JAX_PLATFORMS unset, JAX's first backend initialisation also tries the TPU backend, and
libtpu logs several lines ("Failed to find host bounds for accelerator type", "could not
determine TPU worker hostnames", ...) before it gives up on a host with no TPU chip.
`select_platforms()` sets JAX_PLATFORMS=cpu when the host has no accelerator at all (no
TPU chip nor NVIDIA or AMD GPU on its PCI bus, no GPU device node, no NVIDIA driver entry),
so libtpu is never probed there. A TPU VM, a GPU host, an explicit JAX_PLATFORMS or
JAX_FORCE_TPU_INIT is left alone.

**Errors.** A mistake a user makes — an unknown config field (with ml_collections' "Did
you mean" suggestion), an invalid config value, a missing file or directory, a Hub id that
is unknown or not cached while offline, a GGUF file that is damaged or of an unsupported
architecture, data that does not match its layout, a missing
optional package — ends the command with `error: <one line>` on stderr and exit status 2.
`--traceback` shows the whole traceback instead. Any other exception is a bug and keeps
its traceback; the watchdog's and SIGTERM's exit codes (3, 143) are untouched.
"""

from __future__ import annotations

import gc
import glob
import os
import re
import sys
from typing import Callable

EXIT_USER_ERROR = 2
_GOOGLE_PCI_VENDOR = "0x1ae0"   # TPU chips (and only TPU chips here) carry Google's vendor id
_GPU_PCI_VENDORS = ("0x10de", "0x1002")   # NVIDIA, AMD
_GPU_PCI_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")  # VGA, 3D, other display, accel


def has_accelerator(root: str = "/") -> bool:
  """Whether this host shows a TPU chip or a GPU (read from /sys, /proc and /dev only).

  A GPU counts by its device node, or by the PCI bus (an NVIDIA or AMD display or 3D
  controller) or the loaded NVIDIA driver's /proc entry: the /dev/nvidia* nodes can be
  missing until the first CUDA call creates them (nvidia-modprobe), and a GPU host must
  not be pinned to the CPU for that. `root` is for tests.
  """
  def path(p):
    return os.path.join(root, p.lstrip("/"))

  for dev in glob.glob(path("/sys/bus/pci/devices/*")):
    vendor, cls = _read(os.path.join(dev, "vendor")), _read(os.path.join(dev, "class"))
    if vendor == _GOOGLE_PCI_VENDOR:
      return True
    if vendor in _GPU_PCI_VENDORS and cls.startswith(_GPU_PCI_CLASSES):
      return True
  return bool(glob.glob(path("/dev/nvidia[0-9]*")) or os.path.exists(path("/dev/kfd"))
              or glob.glob(path("/dev/accel[0-9]*"))
              or glob.glob(path("/proc/driver/nvidia/gpus/*")))


def _read(file: str) -> str:
  try:
    with open(file, encoding="ascii") as f:
      return f.read().strip().lower()
  except (OSError, ValueError):
    return ""


def select_platforms(environ=None) -> str | None:
  """Sets JAX_PLATFORMS=cpu on a host without accelerators (see the module docstring).

  Call before JAX initialises a backend. Returns the value set, or None when nothing changed.
  """
  env = os.environ if environ is None else environ
  if env.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in env or has_accelerator():
    return None
  env["JAX_PLATFORMS"] = "cpu"
  if environ is None and "jax" in sys.modules:  # jax read the variable at import
    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update("jax_platforms", "cpu")
  return "cpu"


def user_error(exc: BaseException) -> str | None:
  """The one-line message of an exception that is a user's mistake, else None."""
  # pylint: disable=import-outside-toplevel
  from absl import flags
  from vapo_jax import config as config_lib
  from vapo_jax import gguf_convert
  from vapo_jax import hub
  sources = sys.modules.get("vapo_jax.data.sources")  # not loaded: not its DataError
  if isinstance(exc, config_lib.ConfigError):
    return f"Invalid config: {_text(exc)}"
  if isinstance(exc, (flags.Error, hub.HubError, gguf_convert.GGUFError)) or (
      sources is not None and isinstance(exc, sources.DataError)):
    return _text(exc)
  if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError,
                      PermissionError)):
    if exc.filename and exc.strerror:
      return f"{exc.strerror}: {exc.filename}"
    return _text(exc)
  if isinstance(exc, ImportError) and "pip install" in str(exc):
    return _text(exc)
  if isinstance(exc, OSError) and "config file" in str(exc):  # ml_collections' loader
    return f"cannot load the --config file: {str(exc).strip().splitlines()[-1].strip()}"
  return None


def flag_error(exc: BaseException, argv) -> str:
  """One line for a command line that does not parse.

  An override of a field the config lacks (`--config.rl.stepz=3`) raises ml_collections'
  AttributeError(KeyError("'stepz'\\nDid you mean \"steps\" instead of \"stepz\"?")); it
  becomes `unknown config field in --config.rl.stepz=3: Did you mean "steps" ...`.
  """
  inner = exc.args[0] if isinstance(exc, AttributeError) and exc.args else exc
  if not isinstance(inner, KeyError):
    return _text(exc)
  lines = [line.strip() for line in str(inner.args[0] if inner.args else "").splitlines()]
  key = lines[0].strip("'\"") if lines else ""
  flag = next((a for a in argv if re.search(rf"\.{re.escape(key)}(=|$)", a)), key)
  hint = " ".join(line for line in lines[1:] if line)
  return f"unknown config field in {flag}" + (f": {hint}" if hint else "")


def _text(exc: BaseException) -> str:
  """An exception's message on one line (a KeyError's without its quotes)."""
  text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  if len(lines) > 3:  # a traceback quoted in a message: its head and its last line
    lines = [lines[0], lines[-1]]
  return " ".join(lines) or type(exc).__name__


def fail(message: str) -> None:
  """Prints `error: message` on stderr and exits with status 2."""
  sys.stderr.write(f"error: {message}\n")
  sys.stderr.flush()
  sys.exit(EXIT_USER_ERROR)


def _want_traceback(argv) -> bool:
  from absl import flags  # pylint: disable=import-outside-toplevel
  if flags.FLAGS.is_parsed() and "traceback" in flags.FLAGS:
    return flags.FLAGS.traceback
  return any(a in ("--traceback", "-traceback") for a in argv)


def run(main: Callable, argv=None) -> None:
  """`absl.app.run(main)` with a quiet platform choice and one-line user errors."""
  # pylint: disable=import-outside-toplevel
  from absl import app
  from absl import flags
  select_platforms()
  if "traceback" not in flags.FLAGS:
    flags.DEFINE_bool("traceback", False, "Show the full traceback of a user error "
                      "(a bad flag, config, path, Hub id or data row).")
  argv = list(sys.argv if argv is None else argv)

  def parse(args):
    try:
      return flags.FLAGS(args)
    except (flags.Error, AttributeError, KeyError) as e:  # see flag_error
      if _want_traceback(args):
        raise
      fail(flag_error(e, args))

  def guarded(args):
    try:
      config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
      if config is not None:  # a config file that failed to load raises its error on access
        getattr(config, "to_dict", None)
      return main(args)
    except Exception as e:  # pylint: disable=broad-except
      message = user_error(e)
      if message is None or _want_traceback(args):
        raise
    # Out of the except block, so the exception's frames and what they hold are freed now:
    # objects left to interpreter teardown can abort it (a `datasets` Arrow table whose
    # threads outlive Arrow's pools: "terminate called without an active exception").
    gc.collect()
    fail(message)

  app.run(guarded, argv=argv, flags_parser=parse)
