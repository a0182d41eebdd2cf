"""The repository's config files (configs/*.py) loaded as `--config=configs/NAME:PRESET` loads
them: `load_config_file("tiny.py", "dapo")` is that file's ConfigDict for the preset."""

import importlib.util
import os

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def load_config_file(name, preset="vapo"):
  """configs/<name>'s `get_config(preset)`."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(CONFIGS, name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)
