"""What a config value must be (:class:`Rule`) and its check (:func:`check_value`): the
launcher schema's one place for types, ranges and choices, each failure a one-line
:class:`~dgl_rsc.ConfigError` naming the key path."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

from ..base.names import did_you_mean
from ..core.config import ConfigError

__all__ = ["Rule", "check_value"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a value must be: ``kind`` (int, float, bool, str, "seeds" or "device"), an
    optional range ``[lo, hi]`` (open ends with ``lo_open``/``hi_open``) or ``choices``."""

    kind: Any
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    choices: Optional[tuple] = None
    optional: bool = False  # None is allowed too


def _fail(msg: str):
    raise ConfigError(msg)


def _nearest(value, choices) -> str:
    return did_you_mean(value, choices)


def check_value(path: str, value, rule: Rule):
    """``value`` converted and checked against ``rule``, or a ConfigError naming ``path``."""
    if value is None and rule.optional:
        return None
    if rule.choices is not None and value not in rule.choices:
        opts = ", ".join(map(str, rule.choices))
        _fail(f"{path}={value!r} is not one of {opts}.{_nearest(value, rule.choices)}")
    if rule.kind is bool and not isinstance(value, bool):
        _fail(f"{path} must be true or false, got {value!r}.")
    if rule.kind is str and not isinstance(value, str):
        _fail(f"{path} must be a string, got {value!r}.")
    if rule.kind == "device" and not (
        value in ("auto", "cpu", "cuda")
        or (isinstance(value, str) and value.startswith("cuda:") and value[5:].isdigit())
    ):
        _fail(f"{path} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}.")
    if rule.kind == "seeds":
        if not isinstance(value, (list, tuple)) or not value:
            _fail(f"{path} must be a non-empty list of seeds, got {value!r}.")
        value = tuple(check_value(f"{path}[{i}]", s, Rule(int, 0)) for i, s in enumerate(value))
        if len(set(value)) != len(value):
            _fail(f"{path} holds a seed twice: {list(value)}.")
    if rule.kind in (int, float):
        value = _number(path, value, rule)
    return value


def _number(path: str, value, rule: Rule):
    kind = rule.kind
    if kind is float and isinstance(value, str):
        try:
            value = float(value)  # PyYAML reads 1e-3 as a string
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(f"{path} must be {'an integer' if kind is int else 'a number'}, got {value!r}.")
    lo, hi = rule.lo, rule.hi
    left, right = "(" if rule.lo_open else "[", ")" if rule.hi_open else "]"
    span = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
    # NaN fails every comparison; an int is exact at any size, but float() of it may overflow
    too_big = not (kind is int and isinstance(value, int)) and abs(value) > sys.float_info.max
    if too_big or not -float("inf") < value < float("inf"):
        _fail(f"{path}={value!r} is not a finite number; give one in {span}.")
    if kind is int and isinstance(value, float) and not value.is_integer():
        _fail(f"{path} must be an integer, got {value!r}.")
    value = kind(value)
    if (lo is not None and (value <= lo if rule.lo_open else value < lo)) or (
        hi is not None and (value >= hi if rule.hi_open else value > hi)
    ):
        _fail(f"{path}={value!r} is out of range; it must lie in {span}.")
    return value
