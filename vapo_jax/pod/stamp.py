"""Stamps on the pod tools' compiled evidence: which code and which settings made a file, and
the step model's refusal of a file made for another config.

`train_hlo --json` and `decode_hlo --json` write, beside their figures,

  "stamp": {"kind": "train_collectives" | "decode_collectives",
            "digest": sha256 of the settings, 12 hex digits,
            "settings": {name: value},   the settings that shape the compiled program
            "commit": git HEAD ("+dirty" when tracked files differ; "" outside a checkout),
            "jax", "libtpu": versions, "made": UTC time, "command": the command line}

The settings: every field of the resolved model config (`archs.model_config`: widths, depth,
dtypes, the remat mix `model.remat*`, `model.scan_layers`, the attention kernel,
`model.collective_matmul`, ...; token ids left out), every `mesh.*` field, the slice, and the
train rows' shapes (`rl.packing*`, `rl.micro_batch_size`, `data.max_prompt_tokens`,
`sampling.max_new_tokens`); a decode file adds `sampling.*` and the sampler call's prompts.

`check` refuses a file whose settings differ from the config asked about, in one line that
names the first settings that differ and the command that remakes the file; a file with no
stamp (made before stamps) is refused unless asked for (`allow_unstamped`), and then read
with a line saying that nothing was checked. `find` looks for the stamped file of a config
in `FOLDER` (benchmarks/hlo/ of the checkout): the step model's default. `since` says how
far the making commit is behind HEAD and whether code that shapes the programs changed since.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import hashlib
import json
import os
import shlex
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDER = os.path.join(ROOT, "benchmarks", "hlo")
KINDS = ("train_collectives", "decode_collectives")
# Paths whose changes can change a compiled train or decode program (`since`).
SHAPING = ("vapo_jax/models", "vapo_jax/policy.py", "vapo_jax/critic.py", "vapo_jax/rl",
           "vapo_jax/run", "vapo_jax/sampler", "vapo_jax/packing.py", "vapo_jax/sharding.py",
           "vapo_jax/pod/programs.py")
_SKIP = ("bos_token_id", "eos_token_id", "pad_token_id")


class StampError(ValueError):
  """A stamped file that does not belong to the config asked about (one line)."""


def _plain(v):
  """A JSON value for a setting (dtypes by name, tuples as lists)."""
  if isinstance(v, (list, tuple)):
    return [_plain(x) for x in v]
  if isinstance(v, dict):
    return {str(k): _plain(x) for k, x in v.items()}
  if v is None or isinstance(v, (bool, int, float, str)):
    return v
  try:
    return np.dtype(v).name
  except TypeError:
    return str(v)


def settings(cfg, mcfg, slice_name: str, kind: str = "train_collectives") -> dict:
  """{name: value} of the settings that shape the program a `kind` file was compiled from."""
  out = {"slice": slice_name}
  for f in dataclasses.fields(mcfg):
    if f.name not in _SKIP:
      out[f"model.{f.name}"] = _plain(getattr(mcfg, f.name))
  for f in dataclasses.fields(cfg.mesh):
    out[f"mesh.{f.name}"] = _plain(getattr(cfg.mesh, f.name))
  for f in dataclasses.fields(cfg.rl):
    if f.name.startswith("packing") or f.name == "micro_batch_size":
      out[f"rl.{f.name}"] = _plain(getattr(cfg.rl, f.name))
  out["data.max_prompt_tokens"] = cfg.data.max_prompt_tokens
  out["sampling.max_new_tokens"] = cfg.sampling.max_new_tokens
  if kind == "decode_collectives":
    for f in dataclasses.fields(cfg.sampling):
      out[f"sampling.{f.name}"] = _plain(getattr(cfg.sampling, f.name))
    out["rl.rollout_prompts"] = cfg.rl.rollout_prompts
    out["rl.group_size"] = cfg.rl.group_size
  return out


def digest(values: dict) -> str:
  text = json.dumps(values, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def _git(*args) -> str:
  try:
    return subprocess.run(("git", "-C", ROOT) + args, capture_output=True, text=True,
                          timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def commit() -> str:
  """git HEAD of the checkout, "+dirty" when a tracked file differs; "" outside one."""
  head = _git("rev-parse", "HEAD")
  if head and _git("status", "--porcelain", "--untracked-files=no"):
    head += "+dirty"
  return head


def versions() -> dict:
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  out = {}
  for name in ("jax", "libtpu"):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


def make(cfg, mcfg, slice_name: str, kind: str, argv=None, source: str = "") -> dict:
  """The stamp of a file made now from this config (`source`: e.g. "saved HLO texts in
  DIR", where the figures were not compiled by this process: commit left empty)."""
  values = settings(cfg, mcfg, slice_name, kind)
  return {"kind": kind, "digest": digest(values), "settings": values,
          "commit": "" if source else commit(), "source": source or "compiled",
          **versions(),
          "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": shlex.join(["python", "-m"] + list(argv if argv is not None
                                                         else _module_argv()))}


def _module_argv() -> list:
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  name = spec.name if spec is not None else os.path.basename(sys.argv[0])
  return [name] + sys.argv[1:]


def config_args(argv=None) -> list:
  """The command line's --config, --config.* overrides, --arch and --topology."""
  argv = sys.argv[1:] if argv is None else argv
  return [a for a in argv if a.startswith(("--config", "--arch", "--topology"))]


def default_name(kind: str, slice_name: str, values: dict) -> str:
  return f"{kind}_{slice_name}_{digest(values)}.json"


def remake(kind: str, slice_name: str, values: dict, argv=None) -> str:
  """The command that makes the stamped `kind` file of this config into FOLDER."""
  args = config_args(argv)
  if not any(a.startswith("--topology") for a in args):
    args.append(f"--topology={slice_name}")
  out = os.path.relpath(os.path.join(FOLDER, default_name(kind, slice_name, values)))
  if kind == "train_collectives":
    return shlex.join(["python", "-m", "vapo_jax.pod.train_hlo", *args, "--layers=4,8",
                       f"--json={out}"])
  return shlex.join(["python", "-m", "vapo_jax.pod.decode_hlo", *args, "--layers=2,4",
                     f"--json={out}"])


def read(path: str) -> dict | None:
  with open(path, encoding="utf-8") as f:
    return json.load(f).get("stamp")


def differences(made: dict, want: dict) -> list[tuple[str, object, object]]:
  """[(setting, in the file, in the config)] of the settings that differ."""
  keys = sorted(set(made) | set(want))
  return [(k, made.get(k, "(absent)"), want.get(k, "(absent)")) for k in keys
          if made.get(k, "(absent)") != want.get(k, "(absent)")]


def check(path: str, cfg, mcfg, slice_name: str, kind: str, *, allow_unstamped=False,
          argv=None) -> str:
  """A line saying which file was read and what its stamp holds; StampError when the file
  was made for other settings, or has no stamp and `allow_unstamped` is off."""
  want = settings(cfg, mcfg, slice_name, kind)
  st = read(path)
  again = remake(kind, slice_name, want, argv)
  if st is None:
    if not allow_unstamped:
      raise StampError(f"{path} has no stamp (made before stamps): nothing ties it to this "
                       f"config; remake it: {again}  (or pass --allow_unstamped to read it "
                       "unchecked)")
    return (f"{kind}: {path}, UNSTAMPED: read unchecked (--allow_unstamped); its settings "
            f"and code are not known to be this config's; remake it: {again}")
  if st.get("kind", kind) != kind:
    raise StampError(f"{path} is a {st.get('kind')} file, not {kind}")
  diff = differences(st.get("settings", {}), want)
  if diff or st.get("digest") != digest(want):
    shown = "; ".join(f"{k}={json.dumps(a)} in the file, {json.dumps(b)} here"
                      for k, a, b in diff[:4])
    more = f" (+{len(diff) - 4} more)" if len(diff) > 4 else ""
    raise StampError(f"{path} was made for other settings: {shown}{more}; remake it: {again}")
  return f"{kind}: {path} (stamp {st['digest']}: {describe(st)})"


def describe(st: dict) -> str:
  made = st.get("commit") or f"commit unknown ({st.get('source', '?')})"
  return (f"made at {made[:12]}{'+dirty' if made.endswith('+dirty') else ''} on "
          f"{st.get('made', '?')[:10]}, jax {st.get('jax')}, libtpu {st.get('libtpu')}"
          + since(st.get("commit", "")))


def since(made: str) -> str:
  """"; N commits behind HEAD, M files that shape the programs changed since" (or "")."""
  ref = made.removesuffix("+dirty")
  behind = _git("rev-list", "--count", f"{ref}..HEAD") if ref else ""
  if not behind.isdigit():   # not in this checkout's history (or no checkout)
    return ""
  changed = [x for x in _git("diff", "--name-only", ref, "HEAD", "--", *SHAPING).splitlines()
             if x]
  if behind == "0":
    return "; HEAD"
  tail = (f", {len(changed)} files that shape the programs changed since (git diff "
          f"--stat {ref[:12]} HEAD -- vapo_jax/models ...)" if changed
          else ", none of the files that shape the programs changed since")
  return f"; {behind} commits behind HEAD{tail}"


def find(cfg, mcfg, slice_name: str, kind: str, folder: str = FOLDER) -> str | None:
  """The newest stamped `kind` file in `folder` made for this config's settings."""
  want = digest(settings(cfg, mcfg, slice_name, kind))
  best, made = None, ""
  for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    try:
      st = read(path)
    except (OSError, ValueError, AttributeError):
      continue
    if st and st.get("kind") == kind and st.get("digest") == want and st.get("made",
                                                                             "") >= made:
      best, made = path, st.get("made", "")
  return best


def train_programs(cfg) -> list[str]:
  """The train programs a step of this config runs (`pod.step.train.train_side`)."""
  names = ["logprobs"] if cfg.old_logprobs == "recompute" else []
  names += ["values"] if cfg.uses_critic else []
  return names + ["policy_step"] + (["critic_step"] if cfg.uses_critic else [])


def resolve_train(given: str | None, cfg, mcfg, slice_name: str, *, allow_unstamped=False,
                  folder: str = FOLDER, argv=None) -> tuple[str | None, str]:
  """(file for `Knobs.train_collectives` or None for the layout's arithmetic, the line that
  says which). given: --train_collectives (None: find the stamped file in `folder`;
  "layout": the layout's arithmetic, which cannot see model.collective_matmul's rings and is
  refused for such a config)."""
  values = settings(cfg, mcfg, slice_name, "train_collectives")
  again = remake("train_collectives", slice_name, values, argv)
  found = given if given and given != "layout" else None
  if not given:
    found = find(cfg, mcfg, slice_name, "train_collectives", folder)
  if found:
    line = check(found, cfg, mcfg, slice_name, "train_collectives",
                 allow_unstamped=allow_unstamped, argv=argv)
    with open(found, encoding="utf-8") as f:
      has = set(json.load(f).get("programs", {}))
    lack = [p for p in train_programs(cfg) if p not in has]
    if lack and mcfg.collective_matmul:
      raise StampError(f"{found} lacks {', '.join(lack)}, and the layout's arithmetic cannot "
                       f"count model.collective_matmul's rings; add them: {again} "
                       f"--programs={','.join(lack)}")
    return found, line + (f"; {', '.join(lack)} from the layout's arithmetic (not in the "
                          "file)" if lack else "")
  where = ("--train_collectives=layout" if given else
           f"no stamped train_collectives file for this config (settings "
           f"{digest(values)}) in {os.path.relpath(folder)}")
  if mcfg.collective_matmul:
    raise StampError(f"{where}, and the layout's arithmetic cannot count "
                     "model.collective_matmul's rings; make the file (libtpu, no TPU): "
                     f"{again}")
  return None, (f"train_collectives: from the layout's arithmetic ({where}; the compiled "
                f"figures: {again})")
