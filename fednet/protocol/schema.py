"""Header layout and validation helpers shared by the encoder and the decoder."""
from __future__ import annotations

import math
from typing import Any

from fednet.errors import ProtocolError

# Short header keys (msgpack map keys).
K_VERSION = "v"
K_KIND = "k"
K_SENDER = "s"
K_RUN_ID = "run"
K_ROUND = "rnd"
K_TASK_ID = "tid"
K_SIM_TIME = "t"
K_BODY = "b"
K_ARRAYS = "a"

_SCALARS = (str, bytes, bool, int, float, type(None))


def check_body(body: Any, where: str = "body") -> dict[str, Any]:
    """Check that ``body`` is a dict tree of msgpack-native values with str keys."""
    if not isinstance(body, dict):
        raise ProtocolError(f"{where} must be a dict, got {type(body).__name__}")
    stack: list[Any] = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    raise ProtocolError(
                        f"{where} has a non-str key of type {type(key).__name__}"
                    )
                if not isinstance(value, _SCALARS):
                    stack.append(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                if not isinstance(value, _SCALARS):
                    stack.append(value)
        else:
            raise ProtocolError(
                f"{where} holds a value of unsupported type {type(node).__name__}"
            )
    return body


def check_int(value: Any, field: str) -> int:
    """Return ``value`` if it is a plain int (not bool), else raise ProtocolError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"header field {field!r} must be an int, got {type(value).__name__}")
    return value


def check_str(value: Any, field: str) -> str:
    """Return ``value`` if it is a str, else raise ProtocolError."""
    if not isinstance(value, str):
        raise ProtocolError(f"header field {field!r} must be a str, got {type(value).__name__}")
    return value


def check_time(value: Any, field: str) -> float:
    """Return ``value`` as a finite float, else raise ProtocolError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"header field {field!r} must be a float, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ProtocolError(f"header field {field!r} must be finite, got {value!r}")
    return value


def check_shape(shape: Any, name: str, max_ndim: int) -> tuple[int, ...]:
    """Return ``shape`` as a tuple of non-negative ints with at most ``max_ndim`` entries."""
    if not isinstance(shape, (list, tuple)):
        raise ProtocolError(f"array {name!r}: shape must be a list, got {type(shape).__name__}")
    if len(shape) > max_ndim:
        raise ProtocolError(f"array {name!r}: {len(shape)} dimensions, limit is {max_ndim}")
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ProtocolError(f"array {name!r}: bad shape entry {dim!r}")
    return tuple(shape)
