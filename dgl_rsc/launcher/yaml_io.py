"""Reading the launcher's YAML: a strict safe loader (no Python objects, no key given twice),
``--set`` overrides, and the resolved config as YAML text."""

from __future__ import annotations

import copy
import os

import yaml

from ..core.config import ConfigError
from .schema import RunConfig, resolve

__all__ = [
    "StrictLoader",
    "parse_yaml",
    "load_yaml",
    "apply_overrides",
    "load_config",
    "dump_yaml",
]


def _fail(msg: str):
    raise ConfigError(msg)


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (the same types, nothing executable) that refuses a key given
    twice in one mapping; plain PyYAML keeps the last value silently."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base' entries may be overridden, as YAML intends
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping (lines {first} and "
                    f"{line}); keep one of them", key_node.start_mark,
                )  # fmt: skip
            seen[key] = line
        return super().construct_mapping(node, deep)


def _yaml_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return " ".join(str(exc).split())
    text = "; ".join(p for p in (getattr(exc, "context", None), exc.problem) if p)
    return f"{text} (line {mark.line + 1}, column {mark.column + 1})"


def parse_yaml(data, where: str):
    """Parse YAML ``data`` (bytes in UTF-8, or str) with :class:`StrictLoader`; errors
    become a :class:`ConfigError` that starts with ``where``."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start}); save it with UTF-8 encoding."
            ) from None
    try:
        return yaml.load(data, Loader=StrictLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {_yaml_message(exc)}.") from None


def load_yaml(path: str) -> dict:
    """Read a YAML file with :func:`parse_yaml`; errors become :class:`ConfigError`."""
    if not os.path.exists(path):
        _fail(f"config file '{path}' does not exist.")
    if not os.path.isfile(path):
        _fail(f"config file '{path}' is not a file; give the path of a .yaml config.")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"config file '{path}' cannot be read: {exc.strerror}.") from None
    data = parse_yaml(data, f"'{path}'")
    return {} if data is None else data


def apply_overrides(raw: dict, sets=()) -> dict:
    """A copy of ``raw`` with ``"section.key=value"`` overrides (value read as YAML)."""
    raw = copy.deepcopy(raw)
    for item in sets:
        key, eq, text = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            _fail(f"--set takes section.key=value (for example train.lr=0.01), got {item!r}.")
        value = parse_yaml(text, f"--set {item!r}: the value") if text.strip() else None
        node = raw
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                _fail(f"--set {item!r}: {'.'.join(parts[: i + 1])} is not a section.")
            node = node[part]
        node[parts[-1]] = value
    return raw


def load_config(path: str, sets=()) -> RunConfig:
    """:func:`load_yaml`, :func:`apply_overrides`, then :func:`resolve`."""
    return resolve(apply_overrides(load_yaml(path), sets))


def dump_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML text (sections in the documented order)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)
