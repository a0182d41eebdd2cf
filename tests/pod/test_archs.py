"""`pod.archs.from_flags`: the opening the pod commands share (decode_hlo, train_hlo,
step_model): the config, the policy's ModelConfig and the TPU slice their flags name."""

import types

import pytest

from config_files import load_config_file
from vapo_jax import config as config_lib
from vapo_jax.pod import archs
from vapo_jax.pod import slices


@pytest.mark.parametrize("arch", [None, "qwen2.5-0.5b"])
def test_from_flags_reads_config_arch_and_topology(arch):
  flags = types.SimpleNamespace(config=load_config_file("tiny.py"), arch=arch,
                                topology="v5p-8")
  cfg, mcfg, s = archs.from_flags(flags)
  assert cfg == config_lib.from_config_dict(load_config_file("tiny.py"))
  assert mcfg == archs.model_config(cfg, arch)
  assert s == slices.parse("v5p-8")


def test_from_flags_ends_a_bad_config_as_the_commands_do(capsys):
  c = load_config_file("tiny.py")
  c.model.attention_impl = "sparse"
  with pytest.raises(SystemExit) as e:
    archs.from_flags(types.SimpleNamespace(config=c, arch=None, topology="v5p-8"))
  assert e.value.code == 2
  assert "error: Invalid config: " in capsys.readouterr().err
