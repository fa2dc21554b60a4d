"""The command-line options of the run settings, made from their declarations (config/settings.py):
names, types, choices, help and its [default: ...], in declaration order; and the dotted keys a
command line's options set.

A setting's option is plain: its value is the setting's (click types it;
algorithms/checks.check_ranges checks its range). The few that are not name here what they need:
a click type of their own (TYPES), an eager import (EAGER), or a parser that turns the text into
settings (PARSED: options_extra.py's overrides, which --latency, --betas, --gpus and the others go
through). A declaration may hide its option from --help (--liveness).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from fednet.cli.options_extra import AlgoChoice, PerProcess, PieceChoice, load_plugins
from fednet.config import declarations
from fednet.config.declare import Info

TYPES: dict[str, Callable[[], click.ParamType]] = {
    "--algo": AlgoChoice, "--clients-per-process": PerProcess,
    "--attack": lambda: PieceChoice("attack"), "--defense": lambda: PieceChoice("defense")}
EAGER = {"--plugin": load_plugins}  # imported before click checks the other options (--algo)
PARSED = ("--gpus", "--latency", "--betas", "--server-bandwidth", "--plugin", "--track",
          "--liveness")
_ONE_VALUE = ("--gpus",)  # a tuple setting given as one comma-separated value


def help_text(info: Info) -> str:
    """The declaration's help line and its default, as --help shows them."""
    shown, note = info.default_text(), info.note
    if note.startswith(f"{shown}:"):  # "0: off" -> [default: 0 = off]
        shown, note = note.replace(":", " =", 1), ""
    if note:
        shown = f"{shown}; {note}" if shown else note
    return f"{info.help}." + (f" [default: {shown}]" if shown else "")


def option(info: Info) -> Callable[[Any], Any]:
    """The click option of one declared setting."""
    kw: dict[str, Any] = {"help": help_text(info)}
    if info.metavar:
        kw["metavar"] = info.metavar
    if info.type is bool:
        kw["default"] = None  # unset: the file's or the default's value stays
    elif info.option in TYPES:
        kw["type"] = TYPES[info.option]()
    elif info.choices:
        kw["type"] = click.Choice(info.choices)
    elif info.path:
        kw["type"] = click.Path(file_okay=False)
    elif info.option not in PARSED:
        kw["type"] = info.type
    if info.many and info.option not in _ONE_VALUE:
        kw["multiple"] = True
    if info.option in EAGER:
        kw.update(is_eager=True, callback=EAGER[info.option])
    if info.hidden:
        kw["hidden"] = True
    return click.option(info.option, info.python_name(), **kw)


HELP_ORDER = ("", "algo.", "attack.", "defense.", "data.", "train.", "latency.", "net.",
              "dp.")  # how --help lists them


def _section(info: Info) -> int:
    return max(i for i, p in enumerate(HELP_ORDER) if info.key.startswith(p))


def options() -> list[Callable[[Any], Any]]:
    """The options of every declared setting that has one, the top-level ones first, then by
    section (an option that sets several settings, such as --betas, once: from its first
    declaration)."""
    seen: set[str] = set()
    out = []
    for info in sorted(declarations(), key=_section):
        if info.option and info.option not in seen:
            seen.add(info.option)
            out.append(option(info))
    return out


def given(opts: dict[str, Any]) -> dict[str, Any]:
    """The dotted keys the given plain options set (None: not given)."""
    over: dict[str, Any] = {}
    for info in declarations():
        if info.option and info.option not in PARSED:
            v = opts.get(info.python_name())
            if v is not None:
                over[info.key] = list(v) if isinstance(v, tuple) else v
    return over
