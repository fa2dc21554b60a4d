"""A small typed-schema language for message bodies: every field has a type, a range and a size.

`Spec.check(value, path)` returns the value or raises ProtocolError naming the path
("TASK body.route[2]: expected an int, got str"). The specs are plain data, so tests can walk
them and generate well-formed but wrong messages for every field (tests/fuzz_schema.py).
Checks are iterative where input can nest (no recursion on attacker-controlled depth beyond
the declared limits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fednet.errors import ProtocolError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _type_name(v: object) -> str:
    return type(v).__name__


class Spec:
    """A field type; subclasses check one value."""

    def check(self, v: object, path: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Spec):
    """A plain int (never bool) in [lo, hi]."""

    lo: int = INT64_MIN
    hi: int = INT64_MAX

    def check(self, v: object, path: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ProtocolError(f"{path}: expected an int, got {_type_name(v)}")
        if not self.lo <= v <= self.hi:
            raise ProtocolError(f"{path}: {v} is outside {self.lo}..{self.hi}")
        return v


@dataclass(frozen=True)
class Num(Spec):
    """An int or float (never bool); finite unless allow_nan; in [lo, hi] when finite."""

    lo: float = -math.inf
    hi: float = math.inf
    allow_nan: bool = False

    def check(self, v: object, path: str) -> float | int:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProtocolError(f"{path}: expected a number, got {_type_name(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            if self.allow_nan:
                return v
            raise ProtocolError(f"{path}: expected a finite number, got {v!r}")
        if not self.lo <= v <= self.hi:
            raise ProtocolError(f"{path}: {v!r} is outside {self.lo:g}..{self.hi:g}")
        return v


@dataclass(frozen=True)
class Bool(Spec):
    """True or False."""

    def check(self, v: object, path: str) -> bool:
        if not isinstance(v, bool):
            raise ProtocolError(f"{path}: expected a bool, got {_type_name(v)}")
        return v


@dataclass(frozen=True)
class Str(Spec):
    """A str of at most max_len characters (and, when given, one of `choices`)."""

    max_len: int = 256
    choices: frozenset[str] | None = None

    def check(self, v: object, path: str) -> str:
        if not isinstance(v, str):
            raise ProtocolError(f"{path}: expected a str, got {_type_name(v)}")
        if len(v) > self.max_len:
            raise ProtocolError(f"{path}: {len(v)} characters, limit is {self.max_len}")
        if self.choices is not None and v not in self.choices:
            raise ProtocolError(f"{path}: {v[:40]!r} is not one of {sorted(self.choices)}")
        return v


@dataclass(frozen=True)
class Bin(Spec):
    """Bytes of a length in [min_len, max_len]."""

    min_len: int = 0
    max_len: int = 256

    def check(self, v: object, path: str) -> bytes:
        if not isinstance(v, bytes):
            raise ProtocolError(f"{path}: expected bytes, got {_type_name(v)}")
        if not self.min_len <= len(v) <= self.max_len:
            raise ProtocolError(f"{path}: {len(v)} bytes, expected {self.min_len}..{self.max_len}")
        return v


@dataclass(frozen=True)
class List(Spec):
    """A list of `item`, at most max_len long."""

    item: Spec
    max_len: int = 4096
    min_len: int = 0

    def check(self, v: object, path: str) -> list[Any]:
        if not isinstance(v, list):
            raise ProtocolError(f"{path}: expected a list, got {_type_name(v)}")
        if not self.min_len <= len(v) <= self.max_len:
            raise ProtocolError(f"{path}: {len(v)} items, expected {self.min_len}..{self.max_len}")
        for i, x in enumerate(v):
            self.item.check(x, f"{path}[{i}]")
        return v


@dataclass(frozen=True)
class Free(Spec):
    """A bounded tree of msgpack scalars, lists and str-keyed maps (algorithm-defined content):
    at most `depth` levels of nesting, `items` values in all, strings of at most `str_len`."""

    depth: int = 4
    items: int = 100_000
    str_len: int = 4096

    def check(self, v: object, path: str) -> Any:
        stack: list[tuple[Any, int]] = [(v, 0)]
        count = 0
        while stack:
            node, d = stack.pop()
            count += 1
            if count > self.items:
                raise ProtocolError(f"{path}: more than {self.items} values")
            if node is None or isinstance(node, (bool, int, float)):
                continue
            if isinstance(node, (str, bytes)):
                if len(node) > self.str_len:
                    raise ProtocolError(f"{path}: a string of {len(node)}, limit {self.str_len}")
                continue
            if isinstance(node, (list, tuple, dict)):
                if d >= self.depth:
                    raise ProtocolError(f"{path}: nested deeper than {self.depth} levels")
                if isinstance(node, dict):
                    for k, x in node.items():
                        if not isinstance(k, str) or len(k) > 256:
                            raise ProtocolError(f"{path}: a map key must be a str of <= 256")
                        stack.append((x, d + 1))
                else:
                    stack.extend((x, d + 1) for x in node)
                continue
            raise ProtocolError(f"{path}: unsupported value of type {_type_name(node)}")
        return v


@dataclass(frozen=True)
class Map(Spec):
    """A str-keyed map: declared `fields` (those in `required` must be present) are checked by
    their spec; other keys are refused, or checked by `extra` when it is given."""

    fields: dict[str, Spec] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    extra: Spec | None = None
    max_items: int = 256

    def check(self, v: object, path: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ProtocolError(f"{path}: expected a map, got {_type_name(v)}")
        if len(v) > self.max_items:
            raise ProtocolError(f"{path}: {len(v)} keys, limit is {self.max_items}")
        for k in self.required:
            if k not in v:
                raise ProtocolError(f"{path}: field {k!r} is missing")
        for k, x in v.items():
            if not isinstance(k, str):
                raise ProtocolError(f"{path}: keys must be str, got {_type_name(k)}")
            spec = self.fields.get(k, self.extra)
            if spec is None:
                raise ProtocolError(f"{path}: unexpected field {k[:40]!r}")
            spec.check(x, f"{path}.{k}")
        return v


@dataclass(frozen=True)
class OneOf(Spec):
    """A map whose `key` field selects the spec that checks the whole map (e.g. READY's phase)."""

    key: str
    variants: dict[str, Map]

    def check(self, v: object, path: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ProtocolError(f"{path}: expected a map, got {_type_name(v)}")
        tag = v.get(self.key)
        if not isinstance(tag, str) or tag not in self.variants:
            raise ProtocolError(f"{path}.{self.key}: expected one of {sorted(self.variants)}")
        return self.variants[tag].check(v, path)
