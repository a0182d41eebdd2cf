"""What every section shares: the error, the check helper, and ConfigDict -> dataclass.

A section is a frozen dataclass of one ConfigDict section's fields with a `check()` of its
own ranges; `_build` turns plain dicts into sections, field by field, and names the first
field that is unknown, removed or of the wrong type.
"""

import dataclasses
import types
import typing


class ConfigError(ValueError):
  """A config field is missing, unknown, of the wrong type, or out of range."""


def need(ok, field: str, value, allowed: str) -> None:
  """Raises `ConfigError("config.<field>=<value!r>: must be <allowed>")` unless ok."""
  if not ok:
    raise ConfigError(f"config.{field}={value!r}: must be {allowed}")


def to_dict(obj) -> dict:
  """A (nested) dataclass as nested plain dicts: section -> field -> value."""
  out = {}
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    out[f.name] = to_dict(value) if dataclasses.is_dataclass(value) else value
  return out


def build(cls, values: dict, path: str, removed: dict[str, tuple[type, str]]):
  """`cls` from a dict of its fields (nested sections built in turn); `removed`: dotted
  "section.field" -> (type, what to write instead) of fields that were removed."""
  if not isinstance(values, dict):
    raise ConfigError(f"{path} must be a section (a ConfigDict), got {type(values).__name__}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  values = dict(values)
  for name in list(values):
    gone = removed.get(f"{path}.{name}".removeprefix("config."))
    if gone is not None:
      if values.pop(name) is not None:
        raise ConfigError(f"{path}.{name} was removed: {gone[1]}")
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ConfigError(f"{path}.{unknown[0]} is not a known field; {path} has: "
                      f"{', '.join(sorted(fields))}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name in fields:
    if name not in values:
      continue
    value, hint, where = values[name], hints[name], f"{path}.{name}"
    if dataclasses.is_dataclass(hint):
      kwargs[name] = build(hint, value, where, removed)
    else:
      kwargs[name] = coerce(value, hint, where)
  return cls(**kwargs)


def coerce(value, hint, where: str):
  """value as the field's type (an int is a float too, a list a tuple), else ConfigError."""
  if hint is bool:
    if isinstance(value, bool):
      return value
  elif hint is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
  elif hint is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
  elif hint is str:
    if isinstance(value, str):
      return value
  elif hint is tuple or typing.get_origin(hint) is tuple:
    if isinstance(value, (tuple, list)):
      return tuple(tuple(v) if isinstance(v, list) else v for v in value)
  elif isinstance(hint, types.UnionType):
    return value
  name = getattr(hint, "__name__", str(hint))
  raise ConfigError(f"{where}={value!r}: must be of type {name}, got {type(value).__name__}")
