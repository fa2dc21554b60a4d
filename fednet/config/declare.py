"""One declaration per setting: the language shared by the run settings (config/settings.py) and the
algorithms' parameters (algorithms/params.py).

A setting is a dataclass field made by setting(): the annotation gives the type (bool, int, float,
str, or a tuple of one of them), setting() the default, the range or the choices, a help line, its
command-line option and how --help shows its default. Everything else derives from it: the
command-line options and their help (cli/options.py), the type checks of the TOML and dict readers
(config/settings.py, check_type), the range checks (check_range; config/checks.py runs them for every
run setting) and the options table of docs/usage.md (tests/test_settings_docs.py compares them).
A leaf: no fednet module but errors, no torch.
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
KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def setting(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, choices: tuple[str, ...] = (),
            option: str = "", dest: str = "", metavar: str = "", shown: str = "",
            note: str = "", path: bool = False, hidden: bool = False) -> Any:
    """A declared field.

    default, help: the value when none is given, and one line of --help.
    ge/gt/le/lt, choices: the range a number must lie in, or the strings it may be.
    option: its command-line option ("--lr"; a bool's pair "--permute/--no-permute"; "" for a
    setting only a TOML file or a dict sets); dest: the option's Python name when it differs
    from the option's; metavar: what --help shows for the value.
    shown: the default as --help and the docs show it, when not the value itself ("auto");
    note: what a special value means, added to --help's default and to a range error ("0: off").
    path: the option names a folder (the command line checks it is not a file).
    hidden: --help does not list the option (docs/usage.md still does); a range error names
    the setting's key, not the option.
    """
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": tuple(choices),
            "option": option, "dest": dest, "metavar": metavar, "shown": shown, "note": note,
            "path": path, "hidden": hidden}
    return dataclasses.field(default=default, metadata=meta)


param = setting  # an algorithm's parameter is declared as a run setting is


@dataclass(frozen=True)
class Info:
    """What one setting declares (type: a tuple setting's element type, with many=True)."""

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
    dest: str = ""
    metavar: str = ""
    shown: str = ""
    note: str = ""
    path: bool = False
    hidden: bool = False
    many: bool = False
    key: str = ""  # the dotted configuration key ("train.lr"; an algorithm parameter: its name)

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

    def range_text(self) -> str:
        """The range in words, for a value of the right type: 'at least 1', 'positive',
        'in (0, 1]', 'one of: sgd, adam'."""
        if self.choices:
            return "one of: " + ", ".join(self.choices)
        lo = (f"[{_num(self.ge)}" if self.ge is not None else
              f"({_num(self.gt)}" if self.gt is not None else None)
        hi = (f"{_num(self.le)}]" if self.le is not None else
              f"{_num(self.lt)})" if self.lt is not None else None)
        if lo and hi:
            return f"in {lo}, {hi}"
        if self.gt == 0:
            return "positive"
        if self.ge is not None and self.type is int and self.ge >= 0:
            return f"at least {_num(self.ge)}"
        if lo:
            return f"{'>=' if self.ge is not None else '>'} {lo[1:]}"
        return f"{'<=' if self.le is not None else '<'} {hi[:-1]}" if hi else ""

    def default_text(self) -> str:
        """The default as --help and the docs show it: the declared text, else the value."""
        if self.shown:
            return self.shown
        return show(self.default)

    def names(self) -> list[str]:
        """The command-line names, e.g. ['--permute', '--no-permute'] ([] without an option)."""
        return [n for part in self.option.split("/") for n in part.split() if n]

    def python_name(self) -> str:
        """The option's Python name (click's dest), e.g. 'batch_size' for --batch-size."""
        return self.dest or (self.names() or [""])[0].lstrip("-").replace("-", "_")


def show(v: object) -> str:
    """A value as --help and the docs print it: true/false as on/off, floats in %g."""
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return ",".join(show(x) for x in v)
    return str(v)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def info_of(f: dataclasses.Field, tp: Any, key: str = "") -> Info:
    """The Info of one declared field (tp: its resolved annotation); a TypeError for a type the
    language does not have."""
    many = typing.get_origin(tp) is tuple
    if many:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{f.name}: a tuple setting is tuple[T, ...]")
        tp = args[0]
    if tp not in _TYPES:
        raise TypeError(f"{f.name}: settings are bool, int, float or str (or tuples of them)")
    meta = dict(f.metadata)
    if "help" not in meta:
        raise TypeError(f"{f.name}: declare it with setting() (or param())")
    return Info(f.name, tp, f.default, many=many, key=key or f.name, **meta)


@functools.cache
def declared(cls: type) -> list[Info]:
    """The settings a dataclass declares, in field order (computed once per class: register()
    does it for an algorithm's parameters, so forked client processes reuse the zygote's copy)."""
    hints = typing.get_type_hints(cls)
    return [info_of(f, hints[f.name]) for f in dataclasses.fields(cls)]


def coerce(info: Info, value: Any) -> Any:
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


def in_range(info: Info, v: Any) -> bool:
    """v (of the declared type) is one of the choices, or within the bounds."""
    if info.choices and v not in info.choices:
        return False
    if info.type not in (int, float):
        return True
    return ((info.ge is None or v >= info.ge) and (info.gt is None or v > info.gt)
            and (info.le is None or v <= info.le) and (info.lt is None or v < info.lt))


def check_value(info: Info, value: object, algo: str) -> Any:
    """An algorithm parameter's value as the declared type, checked against its range or choices;
    otherwise one ConfigError line that names the parameter, the algorithm and what it expects."""
    v = coerce(info, value)
    if v is None or not in_range(info, v):
        raise ConfigError(f"--param {info.name}={value}: {algo} expects {info.name} to be "
                          f"{info.expected()}")
    return v


def check_type(info: Info, value: Any, where: str = "") -> Any:
    """A run setting's value from a TOML file or a dict, as its declared type (no text is parsed:
    an int stands for a number, a bool for no number); else a ConfigError naming the key."""
    key = where + info.name
    if info.many:
        ok = isinstance(value, (list, tuple)) and all(fits(x, info.type) for x in value)
        if not ok:
            kind = "integers" if info.type is int else "strings" if info.type is str else "values"
            raise ConfigError(f"'{key}' must be a list of {kind} (got {value!r})")
        return tuple(float(x) if info.type is float else x for x in value)
    if not fits(value, info.type):
        raise ConfigError(f"'{key}' must be {KINDS[info.type]} (got {value!r})")
    return float(value) if info.type is float else value


def check_range(info: Info, value: Any) -> None:
    """A ConfigError naming the option (or the TOML key) when a typed value is out of range."""
    values = value if info.many else (value,)
    bad = [v for v in values if not in_range(info, v)]
    if bad:
        name = info.key if info.hidden else (info.names() or [info.key])[0]
        why = f" ({info.note})" if info.note else ""
        got = f"'{value}'" if isinstance(value, str) else repr(value)
        raise ConfigError(f"{name} must be {info.range_text()}{why} (got {got})")


def fits(value: object, t: type) -> bool:
    """value may stand for a setting of type t."""
    return (isinstance(value, (int, float) if t is float else t)
            and (t is bool or not isinstance(value, bool)))
