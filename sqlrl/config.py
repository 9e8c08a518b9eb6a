"""Strict configs: YAML files and ``key=value`` overrides into (nested) frozen dataclasses.

Every job's configuration is a frozen dataclass; its YAML file mirrors it field for field.

Guarantees:
- ``load_config(cls, path, overrides)`` starts from ``cls``'s defaults, applies the YAML mapping,
  then each ``dotted.key=value`` override (values are parsed as YAML scalars/lists/maps, so
  ``lr=1e-5``, ``weights={critic: 0.7, text2sql: 0.3}`` and ``tags=[a, b]`` work).
- Unknown keys (in the file or an override) are errors naming the key and the known ones; values
  are checked against the field's type (``int``, ``float`` (ints accepted), ``bool``, ``str``,
  ``X | None``, ``tuple[X, ...]``, ``dict[str, X]``, ``Literal``, nested dataclasses); a mismatch is
  a ``ConfigError`` naming the dotted key. Nothing is silently coerced (``"3"`` is not an int),
  except numeric text for a float field, because PyYAML reads ``1e-5`` as a string.
- ``to_dict(cfg)`` gives the plain mapping back (for logs and the run's ``config.yaml``), and
  ``load_config(cls, None, [])`` equals ``cls()``. The dataclass's own ``__post_init__`` validation
  runs on the result.
- ``config_changes(saved, cfg)`` lists, sorted, every dotted key where a mapping read back from a
  run's JSON/YAML differs from ``cfg`` (compared as ``to_dict`` gives it, tuples as lists; a key on one side only is
  ``<absent>`` on the other), as ``key: saved -> current`` lines; ``[]`` means the same config.
  One exception: a dataclass field missing from ``saved`` whose value in ``cfg`` is its declared
  default is not a change -- a key added to the code after the run was saved, left at a default
  that keeps the old behaviour (a missing entry of a ``dict`` field still is one).
- A key a config class renamed (``rename_keys(cls, {old: new})``: ``new`` a dotted path inside
  ``cls``) is an error naming the key to write instead, e.g. ``models.m.path was renamed: write
  models.m.policy.model`` -- never silently accepted.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections import abc
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or override that does not match the config dataclass."""


RENAMED: dict[type, dict[str, str]] = {}  # config class -> {old key: the dotted key that replaced it}


def rename_keys(cls: type, renamed: Mapping[str, str]) -> None:
    """Declare keys ``cls`` no longer has: a config giving ``old`` fails naming ``renamed[old]`` (a
    dotted key inside ``cls``, whose first part must be one of its fields)."""
    names = {f.name for f in dataclasses.fields(cls)}
    for old, new in renamed.items():
        if old in names or new.split(".")[0] not in names:
            raise ValueError(f"rename_keys({cls.__name__}): {old!r} is still a field, or {new!r} is not one")
    RENAMED.setdefault(cls, {}).update(renamed)


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data = loaded
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(data, key.strip().split("."), value)
    return _build(cls, data, "")


def from_mapping(cls: type[T], data: Mapping[str, Any]) -> T:
    """``cls`` built from a plain mapping with the same strict checks as ``load_config``."""
    return _build(cls, data, "")


def to_dict(cfg: Any) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(cfg)


def config_changes(saved: Mapping[str, Any], cfg: Any, ignore: Sequence[str] = ()) -> list[str]:
    """``key: saved -> current`` for every dotted key (not in ``ignore``) where they differ."""
    def flat(v: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(v, Mapping):
            out: dict[str, Any] = {}
            for k, x in v.items():
                out.update(flat(x, f"{prefix}{k}."))
            return out if out or not prefix else {prefix[:-1]: {}}
        return {prefix[:-1]: v}
    before, after = flat(saved), flat(to_dict(cfg))
    absent = "<absent>"
    added = _fields_at_default(cfg)
    return [f"{k}: {before.get(k, absent)} -> {after.get(k, absent)}"
            for k in sorted(before.keys() | after.keys())
            if k not in ignore and before.get(k, absent) != after.get(k, absent)
            and not (k not in before and k in added)]


def _fields_at_default(cfg: Any, prefix: str = "") -> set[str]:
    """Dotted keys of ``cfg``'s (nested) dataclass fields whose value equals the field's default."""
    out: set[str] = set()
    if not dataclasses.is_dataclass(cfg):
        return out
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out |= _fields_at_default(value, key + ".")
        elif f.default is not dataclasses.MISSING and value == f.default:
            out.add(key)
        elif f.default_factory is not dataclasses.MISSING and value == f.default_factory():
            out.add(key)
    return out


def dump_config(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def _set_dotted(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override key {'.'.join(keys)!r}: {k!r} is not a section")
        node = nxt
    node[keys[-1]] = value


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a mapping for {cls.__name__}, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    renamed = RENAMED.get(cls, {})
    moved = [u for u in unknown if u in renamed]
    if moved:
        raise ConfigError("; ".join(f"{_join(where, u)} was renamed: write {_join(where, renamed[u])} instead"
                                    for u in moved) + f" ({cls.__name__} has: {', '.join(sorted(fields))})")
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(_join(where, u) for u in unknown)}; "
                          f"{cls.__name__} has: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        key = _join(where, name)
        default = _default(fields[name])
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, Mapping) and default is not None:
            merged = {**to_dict(default), **value}  # a partial section keeps the other defaults
            kwargs[name] = _build(hints[name], merged, key)
        else:
            kwargs[name] = _coerce(hints[name], value, key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _coerce(arm, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {tp}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin in (dict, Mapping, abc.Mapping) or tp is dict:  # typing.Mapping[...]'s origin is abc's
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        kt, vt = args or (Any, Any)
        return {_coerce(kt, k, key): _coerce(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-5 (no dot) as a string: accept numeric text
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{key}: cannot read {value!r} as {tp}")
