"""A valid body for every message kind (tests build messages from these)."""
from __future__ import annotations

from typing import Any

from fednet.protocol import Message, MsgKind

_BODIES: dict[MsgKind, dict[str, Any]] = {
    MsgKind.READY: {"phase": "hellos", "device": "cpu", "pid": 1234, "host": "h1"},
    MsgKind.WELCOME: {"config": {"clients": 4, "algo": {"name": "fedavg", "params": {}}},
                      "run_id": "r" * 32, "token": b"\1" * 16},
    MsgKind.TASK: {"route": [7], "hop": 0, "kind": "train", "body": {"lr": 0.1, "epochs": 2}},
    MsgKind.HANDOFF: {"route": [3, 7], "hop": 1, "kind": "train", "body": {"lr": 0.1},
                      "endpoints": ["tcp://127.0.0.1:40003", "tcp://127.0.0.1:40007"],
                      "mac": b"\0" * 16},
    MsgKind.RESULT: {"n": 12, "body": {"loss": 0.5, "samples": 24, "steps": 3}},
    MsgKind.HANDOFF_ACK: {},
    MsgKind.HOP_DONE: {"hop": 0, "to": 1, "peer_bytes": 1000, "peer_tensor_bytes": 800},
    MsgKind.FAILURE: {"reason": "RuntimeError: boom"},
    MsgKind.SHUTDOWN: {},
    MsgKind.HEARTBEAT: {},
    MsgKind.BYE: {"server_to_client": 10, "client_to_server": 20, "rejected": 0},
    MsgKind.REJECT: {"reason": "client id out of range"},
}


def valid_body(kind: MsgKind | int) -> dict[str, Any]:
    """A fresh valid body of that kind."""
    import copy

    return copy.deepcopy(_BODIES[MsgKind(kind)])


def msg(kind: MsgKind | int, sender: str = "c0007", **kw: Any) -> Message:
    """A Message of `kind` with a valid body unless `body` is given."""
    kw.setdefault("body", valid_body(kind))
    return Message(kind, sender, **kw)  # type: ignore[arg-type]
