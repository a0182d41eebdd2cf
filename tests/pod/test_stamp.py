"""`pod.stamp`: a train_hlo file carries the commit, the settings that shape its programs and
the versions; the step model refuses a file made for other settings (another remat mix, no
collective matmuls) in one line that names the setting and the command that remakes it,
finds the stamped file of its config in a folder, and refuses the layout's arithmetic where
it cannot see model.collective_matmul."""

import importlib.util
import json
import os

import pytest

from vapo_jax import config as config_lib
from vapo_jax.pod import archs
from vapo_jax.pod import stamp
from vapo_jax.pod import train_hlo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGV = ["--config=configs/tiny.py", "--topology=v5p-8"]


def _cfg(**model):
  spec = importlib.util.spec_from_file_location("t", os.path.join(ROOT, "configs/tiny.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.model.update(remat=True, **model)
  cfg = config_lib.from_config_dict(c)
  return cfg, archs.model_config(cfg)


def _split():
  side = train_hlo.Side(exposed=2, exposed_wire=2e6, exposed_permute_wire=1e6)
  return train_hlo.Split(side, train_hlo.Side(), {"collective-permute": 2}, (4, 8))


def _write(path, cfg, mcfg, names=("logprobs", "values", "policy_step", "critic_step")):
  return train_hlo.write_json(str(path), cfg, mcfg, "v5p-8", {n: _split() for n in names})


def test_the_file_carries_commit_settings_and_versions(tmp_path):
  cfg, mcfg = _cfg(collective_matmul=True, remat_selective=1)
  out = _write(tmp_path / "c.json", cfg, mcfg)
  st = out["stamp"]
  assert st["kind"] == "train_collectives" and len(st["digest"]) == 12
  assert st["settings"]["model.collective_matmul"] is True
  assert st["settings"]["model.remat_selective"] == 1
  assert st["settings"]["mesh.tensor"] == cfg.mesh.tensor
  assert st["settings"]["rl.packing"] == cfg.rl.packing and st["settings"]["slice"] == "v5p-8"
  assert st["jax"] and "libtpu" in st and st["made"]
  assert len(st["commit"].removesuffix("+dirty")) == 40   # run from the checkout
  assert st["command"].startswith("python -m ")
  # Read back: the step model's figures, and a line saying which file and what made it.
  assert train_hlo.load(str(tmp_path / "c.json"))["policy_step"].per_trip.exposed == 2
  line = stamp.check(str(tmp_path / "c.json"), cfg, mcfg, "v5p-8", "train_collectives")
  assert str(tmp_path / "c.json") in line and st["digest"] in line and "made at" in line


@pytest.mark.parametrize("other, setting", [
    ({"collective_matmul": False, "remat_selective": 1}, "model.collective_matmul"),
    ({"collective_matmul": True, "remat_selective": 0}, "model.remat_selective"),
])
def test_a_file_for_other_settings_is_refused_in_one_line(tmp_path, other, setting):
  cfg, mcfg = _cfg(collective_matmul=True, remat_selective=1)
  path = str(tmp_path / "c.json")
  _write(path, *_cfg(**other))
  with pytest.raises(stamp.StampError) as e:
    stamp.check(path, cfg, mcfg, "v5p-8", "train_collectives", argv=ARGV)
  msg = str(e.value)
  assert "\n" not in msg and f"{setting}=" in msg and path in msg
  # The command that remakes it, for this config's settings.
  assert ("remake it: python -m vapo_jax.pod.train_hlo --config=configs/tiny.py "
          "--topology=v5p-8 --layers=4,8 --json=") in msg
  assert stamp.digest(stamp.settings(cfg, mcfg, "v5p-8")) in msg
  # Another slice is another program.
  _write(path, cfg, mcfg)
  with pytest.raises(stamp.StampError, match="slice="):
    stamp.check(path, cfg, mcfg, "v5p-16", "train_collectives")


def test_an_unstamped_file_is_read_only_when_asked(tmp_path):
  cfg, mcfg = _cfg(collective_matmul=True)
  path = tmp_path / "old.json"
  path.write_text(json.dumps({"train_tp": 1, "programs": {"policy_step":
                                                          _split().as_dict()}}))
  with pytest.raises(stamp.StampError, match="has no stamp"):
    stamp.check(str(path), cfg, mcfg, "v5p-8", "train_collectives")
  line = stamp.check(str(path), cfg, mcfg, "v5p-8", "train_collectives",
                     allow_unstamped=True)
  assert "UNSTAMPED" in line and "remake it" in line


def test_the_stamped_file_is_found_or_the_command_that_makes_it_given(tmp_path):
  cfg, mcfg = _cfg(collective_matmul=True)
  folder = str(tmp_path)
  # Nothing made yet: the layout's arithmetic cannot see the rings, so it is refused.
  with pytest.raises(stamp.StampError, match="cannot count model.collective_matmul") as e:
    stamp.resolve_train(None, cfg, mcfg, "v5p-8", folder=folder, argv=ARGV)
  assert "python -m vapo_jax.pod.train_hlo --config=configs/tiny.py" in str(e.value)
  with pytest.raises(stamp.StampError):
    stamp.resolve_train("layout", cfg, mcfg, "v5p-8", folder=folder)
  # Without the rings the arithmetic is the config's own, and says so.
  plain = _cfg(collective_matmul=False)
  got, line = stamp.resolve_train(None, *plain, "v5p-8", folder=folder)
  assert got is None and "from the layout's arithmetic" in line
  # A file of other settings in the folder is not picked; the config's own is.
  _write(tmp_path / "a.json", *plain)
  _write(tmp_path / "b.json", cfg, mcfg)
  got, line = stamp.resolve_train(None, cfg, mcfg, "v5p-8", folder=folder)
  assert got == str(tmp_path / "b.json") and got in line
  # A file that lacks a program the step runs: with the rings, refused.
  _write(tmp_path / "b.json", cfg, mcfg, names=("policy_step",))
  os.remove(tmp_path / "b.json")
  _write(tmp_path / "c.json", cfg, mcfg, names=("policy_step",))
  with pytest.raises(stamp.StampError, match="lacks logprobs, values, critic_step"):
    stamp.resolve_train(None, cfg, mcfg, "v5p-8", folder=folder)


def test_programs_made_apart_go_into_one_file(tmp_path):
  cfg, mcfg = _cfg()
  path = tmp_path / "c.json"
  _write(path, cfg, mcfg, names=("policy_step",))
  out = _write(path, cfg, mcfg, names=("values",))
  assert set(out["programs"]) == {"policy_step", "values"}
  # Other settings replace the file instead.
  out = _write(path, *_cfg(remat_selective=1), names=("values",))
  assert set(out["programs"]) == {"values"}


def test_a_decode_file_is_stamped_with_the_samplers_settings(tmp_path):
  from vapo_jax.pod import decode_hlo  # pylint: disable=import-outside-toplevel
  cfg, mcfg = _cfg()

  class Probe:   # what decode_hlo.compile_generate returns, at 2 and 4 layers
    def __init__(self, n):
      self.per_step, self.per_step_bytes, self.weight_gathers = 10 * n + 4, 1e6 * n, []
  path = str(tmp_path / "d.json")
  out = decode_hlo.write_json(path, cfg, mcfg, "v5p-8", {2: Probe(2), 4: Probe(4)})
  depth = mcfg.num_layers
  assert out["collectives_per_step"] == pytest.approx(10 * depth + 4)
  assert out["stamp"]["settings"]["sampling.slots"] == cfg.sampling.slots
  assert "made at" in stamp.check(path, cfg, mcfg, "v5p-8", "decode_collectives")
  with pytest.raises(stamp.StampError, match="is a decode_collectives file"):
    stamp.check(path, cfg, mcfg, "v5p-8", "train_collectives")
