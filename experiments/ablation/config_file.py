"""An experiment config file loaded as a module (its `get_config`, and the module-level tables
the experiments read: `SFT_BAND`, `ABLATION_ROWS`, `SMOKE`).

One home for the loader that `ablate`, `sft_band` and `value_mechanisms.value_bias` share, so
that none of them imports another for it.
"""

import importlib.util


def config_module(path: str):
  """The config file at `path` as a module (its get_config, and its SFT_BAND / ABLATION_ROWS
  if any)."""
  spec = importlib.util.spec_from_file_location("_ablate_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
