"""Typed algorithm parameters: a frozen dataclass per algorithm whose fields are made by param().

The annotation gives the type (bool, int, float or str), param() the default, the range or the
choices, a help line and, optionally, a command-line option of its own. Everything else derives
from these declarations: `--param` parsing and validation, the per-algorithm options and their
--help defaults, and the values config.toml records. No torch here: the CLI checks parameters
before it imports anything heavy.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any

from fednet.errors import ConfigError

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_TYPES = (bool, int, float, str)


def param(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
          le: float | None = None, lt: float | None = None, choices: tuple[str, ...] = (),
          option: str = "", note: str = "") -> Any:
    """A parameter field: default, bounds (ge/gt/le/lt) or choices, a help line, and optionally
    its own command-line option (e.g. "--mu"); `note` adds to the default in --help."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": tuple(choices),
            "option": option, "note": note}
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class NoParams:
    """The parameters of an algorithm that takes none."""


@dataclass(frozen=True)
class Info:
    """What one parameter declares."""

    name: str
    type: type
    default: Any
    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    option: str = ""
    note: str = ""

    def expected(self) -> str:
        """What a valid value looks like, e.g. 'a number >= 0' or 'one of: l1, l2'."""
        if self.type is bool:
            return "true or false"
        if self.choices:
            return "one of: " + ", ".join(self.choices)
        if self.type is str:
            return "a string"
        bounds = [f"{op} {_num(v)}" for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le),
                                                  ("<", self.lt)) if v is not None]
        kind = "an integer" if self.type is int else "a number"
        return f"{kind} {' and '.join(bounds)}" if bounds else kind


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


@functools.cache
def declared(cls: type) -> list[Info]:
    """The parameters a Params dataclass declares, in field order (computed once per class:
    register() does it, so forked client processes reuse the zygote's copy)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if tp not in _TYPES:
            raise TypeError(f"{cls.__name__}.{f.name}: parameters are bool, int, float or str")
        out.append(Info(f.name, tp, f.default, **dict(f.metadata)))
    return out


def _coerce(info: Info, value: Any) -> Any:
    """value as info.type (strings from the command line are parsed); None when it does not fit."""
    t = info.type
    if isinstance(value, str) and t is not str:
        text = value.strip().lower()
        if t is bool:
            return True if text in _TRUE else False if text in _FALSE else None
        try:
            value = int(text) if t is int else float(text)
        except ValueError:
            return None
    if t is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if t is int:
        return value if isinstance(value, int) else None
    if t is float:
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        return float(value) if ok else None
    return value if isinstance(value, str) else None


def check_value(info: Info, value: Any, algo: str) -> Any:
    """The value as the declared type, checked against its range or choices; otherwise one
    ConfigError line that names the parameter, the algorithm and what it expects."""
    v = _coerce(info, value)
    ok = v is not None and (not info.choices or v in info.choices)
    if ok and info.type in (int, float):
        ok = ((info.ge is None or v >= info.ge) and (info.gt is None or v > info.gt)
              and (info.le is None or v <= info.le) and (info.lt is None or v < info.lt))
    if not ok:
        raise ConfigError(f"--param {info.name}={value}: {algo} expects {info.name} to be "
                          f"{info.expected()}")
    return v


def parse(cls: type, raw: dict[str, Any], algo: str) -> Any:
    """An instance of cls from the given values (the rest default); an unknown name or a wrong
    value is a ConfigError. cls may define check() -> str for rules across parameters."""
    infos = {i.name: i for i in declared(cls)}
    unknown = sorted(set(raw) - set(infos))
    if unknown:
        known = ", ".join(infos) or "none"
        raise ConfigError(f"--param {unknown[0]} is not a {algo} parameter (it takes: {known}); "
                          "drop it or choose the algorithm it belongs to")
    obj = cls(**{k: check_value(infos[k], v, algo) for k, v in raw.items()})
    problem = obj.check() if hasattr(obj, "check") else ""
    if problem:
        raise ConfigError(f"{algo}: {problem}")
    return obj


def typed(cls: type, raw: dict[str, Any], algo: str) -> dict[str, Any]:
    """The given values only, each as its declared type (what config.toml records)."""
    obj = parse(cls, raw, algo)
    return {k: getattr(obj, k) for k in raw}


KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def setting(key: str, value: Any, default: Any) -> Any:
    """A run setting's value as its default's type (an int is a number; a bool is no number),
    else a ConfigError naming the key: config.from_dict checks the Python path and TOML files."""
    t = type(default)
    if not fits(value, t):
        raise ConfigError(f"'{key}' must be {KINDS[t]} (got {value!r})")
    return float(value) if t is float else value


def fits(value: Any, t: type) -> bool:
    """value may stand for a setting of type t."""
    return (isinstance(value, (int, float) if t is float else t)
            and (t is bool or not isinstance(value, bool)))
