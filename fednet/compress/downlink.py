"""--compress-down: the arrays of a task as they travel from the server (fp16, int8, QSGD).

The values themselves are encoded (a client holds no reference to take a difference against),
with the same codecs as results (codecs.py) over the task's floating arrays in name order;
other arrays travel as they are. A layout array, `@down.layout` (JSON text as uint8: each
floating array's name, shape and dtype), lets the client rebuild them; it is counted in the
ledger like the rest. The server encodes each distinct model once a round (a round's clients
share one encoding, as a broadcast would) and keeps the decoded arrays as the task's arrays, so
that what it aggregates against (the uplink's reference, FedBuff's start model) is exactly what
the clients trained from. QSGD draws from the stream (seed, "compress-down", task id) of the
first task that carries the model, so `fednet local` and `fednet launch` agree bit for bit.
"""
from __future__ import annotations

import functools
import json
import math

import numpy as np

from fednet.compress import CompressionError, Spec, decode_result, encode_result
from fednet.rng import int_seed

Arrays = dict[str, np.ndarray]
LAYOUT = "@down.layout"
MAX_LAYOUT = 1 << 20  # bytes of layout JSON a client reads at most


class Downlink:
    """The server's encoder of task arrays (one cache per step)."""

    def __init__(self, spec: Spec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        self._cache: dict[int, tuple[Arrays, Arrays, Arrays]] = {}  # id -> (source, wire, decoded)
        self._round = -2

    def encode(self, arrays: Arrays, task_id: int, rnd: int) -> tuple[Arrays | None, Arrays]:
        """(the arrays as they travel, the arrays the client rebuilds from them); the
        encodings of a round are kept until the next round's first task. Without
        --compress-down: (None, arrays), the arrays as they are."""
        if not self.spec.on:  # no --compress-down: the arrays travel as they are
            return None, arrays
        if rnd != self._round:
            self._cache, self._round = {}, rnd
        got = self._cache.get(id(arrays))
        if got is not None and got[0] is arrays:
            return got[1], got[2]
        wire = encode_values(self.spec, arrays, self.seed, "compress-down", task_id)
        decoded = decode(self.spec, wire)
        self._cache[id(arrays)] = (arrays, wire, decoded)
        return wire, decoded


NO_DOWNLINK = Downlink(Spec(), 0)
"""Without --compress-down: every task's arrays travel as they are (it keeps nothing)."""


def encode_values(spec: Spec, arrays: Arrays, seed: int, purpose: str, rnd: int = -1,
                  client: int = -1) -> Arrays:
    """The arrays as they travel: the floating ones' values encoded, a layout beside them.
    QSGD draws from the run's stream (seed, purpose, rnd, client)."""
    rng = np.random.default_rng(int_seed(seed, purpose, rnd, client)) if spec.random else None
    wire, _ = encode_result(spec, arrays, {}, None, rng)
    layout = [[n, list(a.shape), a.dtype.str] for n, a in sorted(arrays.items())]
    wire[LAYOUT] = np.frombuffer(json.dumps(layout).encode(), np.uint8).copy()
    return wire


def for_peer(spec: Spec, seed: int, arrays: Arrays, task_id: int, hop: int) -> Arrays | None:
    """--compress-handoff: a hand-off's model as it travels to route[hop] (None: as it is)."""
    return encode_values(spec, arrays, seed, "compress-handoff", task_id, hop) if spec.on else None


@functools.lru_cache(maxsize=16)
def _peer_layouts(spec: Spec, dense: tuple[tuple[str, tuple[int, ...], str], ...]
                  ) -> tuple[dict, int, int]:
    zeros = {n: np.zeros(shape, np.dtype(dt)) for n, shape, dt in dense}
    wire = encode_values(spec, zeros, 0, "compress-handoff", 0, 0)
    layout = {n: (a.shape, a.dtype) for n, a in wire.items()}
    # arrays empty for a zero model (QSGD's levels) grow by at most one element per value
    grow = max((a.dtype.itemsize for a in wire.values() if a.size == 0), default=0)
    values = sum(a.size for a in zeros.values() if a.dtype.kind == "f")
    return layout, grow * values, 4 * sum(a.size == 0 for a in wire.values())


def peer_layout(spec: Spec, layout: dict[str, tuple[tuple[int, ...], np.dtype]]
                ) -> tuple[dict[str, tuple[tuple[int, ...], np.dtype]], int, int]:
    """A model of `layout` as it travels between peers under --compress-handoff `spec`: the
    layout of its arrays, and how many tensor and header bytes more it may weigh when its size
    follows its values (QSGD sends a level per nonzero value: the layout is then a zero model's,
    the least; 0, 0 for the codecs whose sizes are fixed)."""
    if not spec.on:
        return dict(layout), 0, 0
    dense = tuple((n, tuple(int(d) for d in shape), np.dtype(dt).str)
                  for n, (shape, dt) in sorted(layout.items()))
    wire, more_tensor, more_header = _peer_layouts(spec, dense)
    return dict(wire), more_tensor, more_header


def decode(spec: Spec, wire: Arrays, model: dict | None = None) -> Arrays:
    """A task's arrays rebuilt from what travelled; CompressionError when they do not decode.
    `model`: the receiver's own layout (name -> (shape, dtype)); every entry of the sender's
    layout must be one of its entries, checked before anything is allocated (a peer cannot
    make its receiver build arrays its model does not have)."""
    raw = wire.get(LAYOUT)
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1 or raw.size > MAX_LAYOUT:
        raise CompressionError(f"a --compress-down task needs its {LAYOUT} (uint8 JSON)")
    try:
        layout = json.loads(raw.tobytes().decode())
        expect = {str(n): (tuple(int(d) for d in shape), np.dtype(dt)) for n, shape, dt in layout}
    except (ValueError, TypeError) as e:
        raise CompressionError(f"{LAYOUT} is not a layout ({e})") from None
    if any(d < 0 for shape, _ in expect.values() for d in shape) or sum(
            math.prod(s) for s, _ in expect.values()) > 1 << 34:
        raise CompressionError(f"{LAYOUT}: impossible shapes")
    for name, (shape, dtype) in expect.items() if model is not None else ():
        mine = model.get(name)  # type: ignore[union-attr]  # (iterated only when model is given)
        if mine is None or tuple(mine[0]) != shape or np.dtype(mine[1]) != dtype:
            raise CompressionError(
                f"{LAYOUT}: the sender's {name[:60]!r} ({dtype} {shape}) is not this model's "
                f"({'none' if mine is None else f'{np.dtype(mine[1])} {tuple(mine[0])}'})")
    rest = {k: v for k, v in wire.items() if k != LAYOUT}
    return decode_result(spec, rest, expect, {})
