"""`cli.has_accelerator` / `select_platforms` on fake /sys, /dev and /proc trees."""

import pytest

from vapo_jax import cli


def _pci(root, slot, vendor, cls):
  d = root / "sys/bus/pci/devices" / slot
  d.mkdir(parents=True)
  (d / "vendor").write_text(vendor + "\n")
  (d / "class").write_text(cls + "\n")


def _touch(root, rel):
  p = root / rel
  p.parent.mkdir(parents=True, exist_ok=True)
  p.write_text("")


def test_plain_host_has_none(tmp_path):
  _pci(tmp_path, "0000:00:00.0", "0x8086", "0x060000")   # host bridge
  _pci(tmp_path, "0000:00:03.0", "0x1af4", "0x020000")   # virtio network
  _pci(tmp_path, "0000:00:04.0", "0x10de", "0x040300")   # NVIDIA HD audio: not a GPU
  assert not cli.has_accelerator(str(tmp_path))


@pytest.mark.parametrize("vendor,cls", [("0x10de", "0x030200"), ("0x10de", "0x030000"),
                                        ("0x1002", "0x038000"), ("0x1002", "0x120000"),
                                        ("0x1ae0", "0x120000"), ("0x1ae0", "0xff0000")])
def test_gpu_or_tpu_on_the_pci_bus(tmp_path, vendor, cls):
  # An H100/H200 is a 3D controller (0x0302): no /dev/nvidia* node is needed to see it.
  _pci(tmp_path, "0000:00:05.0", vendor, cls)
  assert cli.has_accelerator(str(tmp_path))


@pytest.mark.parametrize("rel", ["dev/nvidia0", "dev/kfd", "dev/accel0",
                                 "proc/driver/nvidia/gpus/0000:00:05.0/information"])
def test_device_nodes_and_driver_entry(tmp_path, rel):
  _touch(tmp_path, rel)
  assert cli.has_accelerator(str(tmp_path))


def test_select_platforms_leaves_accelerator_hosts_and_explicit_choices(monkeypatch):
  monkeypatch.setattr(cli, "has_accelerator", lambda: True)
  env = {}
  assert cli.select_platforms(env) is None and "JAX_PLATFORMS" not in env
  monkeypatch.setattr(cli, "has_accelerator", lambda: False)
  assert cli.select_platforms(env) == "cpu" and env["JAX_PLATFORMS"] == "cpu"
  env = {"JAX_PLATFORMS": "cuda"}
  assert cli.select_platforms(env) is None and env["JAX_PLATFORMS"] == "cuda"
  env = {"JAX_FORCE_TPU_INIT": "1"}
  assert cli.select_platforms(env) is None and "JAX_PLATFORMS" not in env
