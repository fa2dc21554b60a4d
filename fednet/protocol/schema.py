"""The typed schema of every message: header fields, each kind's body, which kinds carry arrays.

The decoder checks all of it before any runtime code sees a message, so runtime code may use
body fields with the declared types. Algorithm-defined bodies (a task's and a result's `body`)
have typed known keys and bounded free-form content for the rest.
"""
from __future__ import annotations

import re
from typing import Any

from fednet.errors import ProtocolError
from fednet.protocol.fields import Bin, Bool, Free, Int, List, Map, Num, OneOf, Spec, Str
from fednet.protocol.kinds import MsgKind

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

MAX_CLIENTS = 10_000_000
"""Client ids are 0 .. MAX_CLIENTS - 1."""
MAC_BYTES = 16
"""Length of a hand-off's authentication tag."""

SENDER = Str(64)
RUN_ID = Str(64)
ROUND = Int(-2, 1 << 31)
TASK_ID = Int(-1, 1 << 62)

_CID = Int(0, MAX_CLIENTS - 1)
_COUNT = Int(0, 1 << 50)
_FREE = Free(depth=4, items=100_000, str_len=4096)

TASK_BODY = Map({
    "epochs": Int(0, 1_000_000), "lr": Num(), "evaluate": Bool(), "ckpt": Int(0, 1 << 31),
}, extra=_FREE, max_items=1024)
"""A task body: the keys the runtime reads are typed here; an algorithm's own keys are declared
with its Spec (algorithms/spec.py: task_body) and checked by the client before the algorithm
reads them (core/work.py); everything is bounded."""

RESULT_BODY = Map({
    "loss": Num(allow_nan=True), "accuracy": Num(0.0, 1.0), "test_loss": Num(allow_nan=True),
    "lr": Num(), "samples": _COUNT, "steps": _COUNT, "next_task": TASK_ID,
}, extra=_FREE, max_items=1024)
"""A result body: the statistics the runtime and every algorithm read; an algorithm's own keys
are declared with its Spec (result_body) and checked by the server (core/replies.py). The losses
may be NaN/inf here on purpose: a refusal at decode would be a rejected message with no reason
and its task would wait on its deadline; decoded, the reply reaches core/replies.loss_problem,
which makes it that client's recorded failure (its local training diverged)."""

_ROUTE = {
    "route": List(_CID, 100_000, min_len=1), "hop": Int(0, 100_000), "kind": Str(64),
    "body": TASK_BODY, "endpoints": List(Str(256), 100_000), "keys": List(Str(40), 100_000),
    "grants": List(Bin(MAC_BYTES, MAC_BYTES), 100_000), "stage": Str(32),
}
_ROUTE_REQUIRED = frozenset({"route", "hop", "kind", "body"})

BODIES: dict[MsgKind, Spec] = {
    MsgKind.READY: OneOf("phase", {
        # a client process's ids (one, or many) at once (arrays: cids; readys also n)
        "hellos": Map({"phase": Str(8), "device": Str(64), "pid": Int(0, 1 << 31),
                       "host": Str(256), "nonce": Bin(16, 16), "proof": Bin(32, 32),
                       "token": Bin(16, 16)},
                      required=frozenset({"phase"})),
        "readys": Map({"phase": Str(8), "endpoints": List(Str(256), 1 << 21)},
                      required=frozenset({"phase"})),
    }),
    MsgKind.WELCOME: Map({"config": Free(depth=6, items=10_000, str_len=4096),
                          "run_id": RUN_ID,
                          "plugins": List(List(Str(1024), 2, min_len=2), 256),
                          "peers": Bool(), "token": Bin(16, 16),
                          "peer_keys": List(Str(40), 100_000)},
                         # one client's or a process's: per-client fields in arrays (cids)
                         required=frozenset({"config", "run_id"})),
    MsgKind.TASK: Map(_ROUTE, required=_ROUTE_REQUIRED),
    MsgKind.HANDOFF: Map({**_ROUTE, "mac": Bin(MAC_BYTES, MAC_BYTES)},
                         required=_ROUTE_REQUIRED | {"mac"}),
    MsgKind.RESULT: Map({"n": _COUNT, "body": RESULT_BODY, "chain_cut": Bool(),
                         "skipped": Int(0, 100_000), "stage": Str(32)},
                        required=frozenset({"n", "body"})),
    MsgKind.HANDOFF_ACK: Map(),
    MsgKind.HOP_DONE: Map({"hop": Int(0, 100_000), "to": Int(0, 100_000),
                           "peer_bytes": _COUNT, "peer_tensor_bytes": _COUNT,
                           "skipped": Int(0, 100_000)},
                          required=frozenset({"hop", "to", "peer_bytes", "peer_tensor_bytes"})),
    MsgKind.FAILURE: Map({"reason": Str(4096)}, required=frozenset({"reason"})),
    MsgKind.SHUTDOWN: Map(),
    MsgKind.HEARTBEAT: Map(),
    MsgKind.BYE: Map(extra=Int(0, 1 << 62), max_items=64),
    # answers: the nonce of the READY(hellos) refused, so that a late REJECT of an earlier
    # claim is told from one of the claim the client is waiting on
    MsgKind.REJECT: Map({"reason": Str(4096), "answers": Bin(16, 16)},
                        required=frozenset({"reason"})),
}
"""Every kind's body."""

WITH_ARRAYS = frozenset({MsgKind.WELCOME, MsgKind.TASK, MsgKind.RESULT, MsgKind.HANDOFF,
                         MsgKind.READY, MsgKind.SHUTDOWN, MsgKind.BYE})  # (the last 3: cids)
"""Kinds that may carry arrays; every other kind must carry none."""


def check_message(kind: MsgKind, body: object, n_arrays: int) -> dict[str, Any]:
    """Check a kind's body (and that it may carry arrays); ProtocolError names the field."""
    checked = BODIES[kind].check(body, f"{kind.name} body")
    if n_arrays and kind not in WITH_ARRAYS:
        raise ProtocolError(f"{kind.name} carries no arrays, got {n_arrays}")
    return checked


_ANY_INT, _ANY_STR = Int(), Str(1 << 20)


def check_int(value: object, field: str, spec: Int = _ANY_INT) -> int:
    """Return ``value`` if it is a plain int (not bool) in the spec's range."""
    return spec.check(value, f"header field {field!r}")


def check_str(value: object, field: str, spec: Str = _ANY_STR) -> str:
    """Return ``value`` if it is a str of the spec's length."""
    return spec.check(value, f"header field {field!r}")


def check_time(value: object, field: str) -> float:
    """Return ``value`` as a finite float, else raise ProtocolError."""
    return float(Num().check(value, f"header field {field!r}"))


def check_shape(shape: object, name: str, max_ndim: int) -> tuple[int, ...]:
    """Return ``shape`` as a tuple of non-negative ints with at most ``max_ndim`` entries."""
    if not isinstance(shape, (list, tuple)):
        raise ProtocolError(f"array {name!r}: shape must be a list, got {type(shape).__name__}")
    if len(shape) > max_ndim:
        raise ProtocolError(f"array {name!r}: {len(shape)} dimensions, limit is {max_ndim}")
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ProtocolError(f"array {name!r}: bad shape entry {dim!r}")
    return tuple(shape)


_CLIENT_NAME = re.compile(r"c([0-9]{4,7})", re.ASCII)


def parse_client(name: object) -> int | None:
    """The client id of a canonical client name ('c0007' -> 7); None for anything else
    (non-ASCII digits, a sign, spaces, leading zeros beyond the 4-digit form)."""
    if not isinstance(name, str):
        return None
    m = _CLIENT_NAME.fullmatch(name)
    if m is None:
        return None
    cid = int(m.group(1))
    return cid if f"c{cid:04d}" == name else None
