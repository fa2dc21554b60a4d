"""Typed algorithm parameters: a frozen dataclass per algorithm whose fields are made by param()
(config/declare.py, the language the run settings are declared in too).

The annotation gives the type (bool, int, float or str), param() the default, the range or the
choices, a help line and, optionally, a command-line option of its own. Everything else derives
from these declarations: `--param` parsing and validation, the per-algorithm options and their
--help defaults, and the values config.toml records. No torch here: the CLI checks parameters
before it imports anything heavy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fednet.config.declare import check_value, declared
from fednet.errors import ConfigError


@dataclass(frozen=True)
class NoParams:
    """The parameters of an algorithm that takes none."""


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
