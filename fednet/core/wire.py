"""Conversions between the message model (types) and protocol Messages, plus ledger recording.

Both runtimes (in-process and ZeroMQ) build and read messages only through these functions, so
what they count and how they stamp simulated time is the same by construction. peer_layout
(compress/downlink.py) is here for the server, which sizes hand-offs it does not see.
"""
from __future__ import annotations

from typing import Any

from fednet.compress.downlink import peer_layout as peer_layout  # (re-exported)
from fednet.metrics.accounting import SERVER, Ledger
from fednet.protocol import Message, MsgKind, encoded_sizes, frame_bytes, stage_of, tensor_bytes
from fednet.protocol.handover import sizes
from fednet.protocol.proof import NO_MAC
from fednet.types import Arrays, Failure, Result, Task, client_name


def task_message(task: Task, run_id: str) -> Message:
    """The TASK the server sends to the first client of the route."""
    body = {"route": list(task.route), "hop": task.hop, "kind": task.kind, "body": task.body}
    if task.stage:
        body["stage"] = task.stage
    return Message(MsgKind.TASK, SERVER, run_id, task.round, task.task_id, task.sim_time, body,
                   task.arrays if task.wire is None else task.wire)


def message_task(msg: Message) -> Task:
    """Rebuild a Task from a TASK (or HANDOFF) message."""
    b = msg.body
    route = [int(c) for c in b.get("route", [])]
    hop = int(b.get("hop", 0))
    if not route or not 0 <= hop < len(route):
        raise ValueError(f"task {msg.task_id} has an empty route or a hop outside it")
    body = b.get("body", {})
    if not isinstance(body, dict):
        raise ValueError(f"task {msg.task_id} body is not a map")
    return Task(msg.task_id, msg.round, route, dict(msg.arrays), body, str(b.get("kind", "train")),
                hop, msg.sim_time, stage=str(b.get("stage", "")))


def result_message(cid: int, task: Task, arrays: Arrays, body: dict[str, Any], num_examples: int,
                   sim_time: float, run_id: str) -> Message:
    """The RESULT the last client of a route returns to the server (its task's stage beside
    the body: the server reads its own record of the stage, the ledger files the bytes)."""
    out: dict[str, Any] = {"n": int(num_examples), "body": body}
    if task.stage:
        out["stage"] = task.stage
    return Message(MsgKind.RESULT, client_name(cid), run_id, task.round, task.task_id, sim_time,
                   out, arrays)


def message_result(msg: Message, cid: int, arrival: float) -> Result:
    """Rebuild a Result; `arrival` is the simulated time it reached the server."""
    return Result(msg.task_id, msg.round, cid, dict(msg.arrays), dict(msg.body.get("body", {})),
                  int(msg.body.get("n", 0)), arrival)


def failure_message(cid: int, task_id: int, rnd: int, reason: str, sim_time: float,
                    run_id: str) -> Message:
    """A client's report that it could not finish a task."""
    return Message(MsgKind.FAILURE, client_name(cid), run_id, rnd, task_id, sim_time,
                   {"reason": reason[:2000]})


def message_failure(msg: Message, cid: int) -> Failure:
    """Rebuild a Failure from a FAILURE message."""
    return Failure(msg.task_id, msg.round, cid, str(msg.body.get("reason", "unknown")), msg.sim_time)


def record(ledger: Ledger, msg: Message, frames: list[Any], src: str, dst: str) -> int:
    """Account one message in the ledger; returns its size (header + payload frames)."""
    return record_sizes(ledger, msg, *frame_bytes(frames), src, dst)


def record_sizes(ledger: Ledger, msg: Message, header: int, payload: int, src: str,
                 dst: str, tensors: int | None = None) -> int:
    """Account one message of `header` + `payload` bytes (as record; fednet local has the sizes
    without frames: protocol/handover.py) and `tensors` bytes of arrays (None: counted from
    msg); returns header + payload."""
    ledger.record(msg.round, msg.kind.name, src, dst, header, payload,
                  tensor_bytes(msg) if tensors is None else tensors, stage_of(msg))
    return header + payload


def handoff_message(task_msg: Message, reply: Message, hop: int, tag: bytes = NO_MAC,
                    arrays: Arrays | None = None) -> Message:
    """The HANDOFF carrying a hop's trained model to route[hop] (same body as the TASK, plus
    the tag that proves the sender; the in-process runtime sends the all-zero placeholder);
    `arrays`: the model as it travels when not the reply's own (--compress-handoff)."""
    body = dict(task_msg.body, hop=hop, mac=tag)
    return Message(MsgKind.HANDOFF, reply.sender, reply.run_id, reply.round, reply.task_id,
                   reply.sim_time, body, reply.arrays if arrays is None else arrays)


def ack_message(handoff: Message, me: str) -> Message:
    """HANDOFF_ACK from the receiving peer (header only)."""
    return Message(MsgKind.HANDOFF_ACK, me, handoff.run_id, handoff.round, handoff.task_id,
                   handoff.sim_time)


def hop_done_message(task_msg: Message, reply: Message, peer_bytes: int, peer_tensor: int,
                     to_hop: int) -> Message:
    """HOP_DONE for the server: header only; which hop now holds the model (to_hop: the next one,
    or a later one when dead peers were skipped) and the bytes of this hand-off."""
    return Message(MsgKind.HOP_DONE, reply.sender, reply.run_id, reply.round, reply.task_id,
                   reply.sim_time, {"hop": int(task_msg.body.get("hop", 0)), "to": int(to_hop),
                                    "peer_bytes": int(peer_bytes), "peer_tensor_bytes": int(peer_tensor)})


def handoff_sizes(task_body: dict[str, Any], run_id: str, rnd: int, task_id: int, sender: int,
                  receiver: int, to_hop: int, layout: dict[str, Any]) -> tuple[int, int, int]:
    """(header bytes, tensor bytes) of the HANDOFF that carries a model of `layout` (as it
    travels) from client `sender` to `receiver` at route index `to_hop`, and the header bytes of
    its HANDOFF_ACK: from the body of the TASK the server sent and what it knows, nothing
    allocated (handoff_message and ack_message build the same messages)."""
    msg = Message(MsgKind.HANDOFF, client_name(sender), run_id, rnd, task_id, 0.0,
                  dict(task_body, hop=to_hop, mac=NO_MAC))
    header, tensors = encoded_sizes(msg, layout)
    return header, tensors, encoded_sizes(ack_message(msg, client_name(receiver)), {})[0]


def task_size(task: Task, run_id: str) -> int:
    """The bytes of `task`'s TASK as fednet local sends it (loopback-length endpoints; arrays
    not copied): what the server link's schedule charges for its download."""
    msg = task_message(task, run_id)
    if len(task.route) > 1:
        msg.body["endpoints"] = placeholder_endpoints(task.route)
    return sum(sizes(msg))


def placeholder_endpoints(route: list[int]) -> list[str]:
    """Endpoints the in-process runtime puts in multi-hop tasks: the length of a loopback endpoint
    with an ephemeral (5-digit) port, so that header bytes match a `fednet launch` run exactly."""
    return [f"tcp://127.0.0.1:{40000 + c % 20000}" for c in route]
