"""Generated hostile messages: well-formed msgpack that the schema must refuse, built by walking
the schema of every kind (fednet.protocol.schema.BODIES), plus messages that pass the schema but
are wrong for the runtime (stale, unproven, misaddressed)."""
from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np

from fednet.protocol import Message, MsgKind, PROTOCOL_VERSION, encode
from fednet.protocol import schema as S
from fednet.protocol.fields import Bin, Bool, Free, Int, List, Map, Num, OneOf, Spec, Str
from tests.schema_examples import valid_body

_MISSING = object()


def wrong_values(spec: Spec) -> list[Any]:
    """Values of the right shape for msgpack that `spec` must refuse."""
    if isinstance(spec, Int):
        out: list[Any] = ["7", 1.5, True, None, [1], {"x": 1}]
        if spec.lo > -(1 << 63):
            out.append(spec.lo - 1)
        if spec.hi < (1 << 63) - 1:
            out.append(spec.hi + 1)
        return out
    if isinstance(spec, Num):
        out = ["0.5", True, None, [0.5]]
        if not spec.allow_nan:
            out += [float("nan"), float("inf")]
        if spec.lo > float("-inf"):
            out.append(spec.lo - 1.0)
        if spec.hi < float("inf"):
            out.append(spec.hi + 1.0)
        return out
    if isinstance(spec, Bool):
        return [1, "true", None]
    if isinstance(spec, Str):
        out = [7, b"bytes", None, ["s"], "x" * (spec.max_len + 1)]
        if spec.choices:
            out.append("not-a-choice")
        return out
    if isinstance(spec, Bin):
        return ["text", 7, b"\0" * (spec.max_len + 1)] + ([b"\0" * (spec.min_len - 1)]
                                                           if spec.min_len else [])
    if isinstance(spec, List):
        out = [{"a": 1}, "list", 5]
        out += [[bad] for bad in wrong_values(spec.item)[:3]]
        if spec.max_len <= 5000:
            out.append([None] * (spec.max_len + 1))
        return out
    if isinstance(spec, Free):
        deep: Any = 0
        for _ in range(300):  # msgpack packs at most 511 levels; deep_frames() goes to 1,000
            deep = [deep]
        return [deep, {"k": b"x" * (spec.str_len + 1)}, {1: "non-str key"}]
    if isinstance(spec, (Map, OneOf)):
        return [[1, 2], "map", 3]
    return []


def _paths(spec: Spec, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Spec]]:
    yield prefix, spec
    if isinstance(spec, Map):
        for k, sub in spec.fields.items():
            yield from _paths(sub, prefix + (k,))
        if spec.extra is not None:
            yield from _paths(spec.extra, prefix + ("zz_extra",))


def _set(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    if not path:
        return value
    node = body
    for k in path[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            return body
    if value is _MISSING:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return body


def wrong_bodies(kind: MsgKind) -> Iterator[tuple[str, Any]]:
    """(what, body) pairs: the kind's valid body with one field wrong, missing or unexpected."""
    base = valid_body(kind)
    spec = S.BODIES[kind]
    if isinstance(spec, OneOf):
        variants = [(tag, m) for tag, m in spec.variants.items()]
    else:
        variants = [("", spec)]
    for tag, m in variants:
        b0 = dict(base, **{spec.key: tag}) if tag else base  # type: ignore[union-attr]
        for path, sub in _paths(m):
            for bad in wrong_values(sub):
                name = f"{kind.name}{'/' + tag if tag else ''} {'.'.join(path) or 'body'}"
                yield f"{name}={_short(bad)}", _set(b0, path, bad)
            if path and isinstance(m, Map) and path[0] in m.required and len(path) == 1:
                yield f"{kind.name} without {path[0]}", _set(b0, path, _MISSING)
        if m.extra is None:
            yield f"{kind.name} with an unexpected field", dict(b0, unexpected_field=1)
        else:
            yield f"{kind.name} with a wrong extra field", dict(b0, unexpected_field="x")


def _short(v: Any) -> str:
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother = 2, 20, 20
    return r.repr(v)


def _raw(header: dict[str, Any], arrays: list[bytes]) -> list[bytes] | None:
    try:
        return [msgpack.packb(header, use_bin_type=True), *arrays]
    except (TypeError, ValueError, OverflowError):
        return None


def deep_frames(kind: MsgKind, field: str, depth: int = 1000, sender: str = "c0000",
                run_id: str = "") -> list[bytes]:
    """A message whose `field` is a list nested `depth` deep (built by hand: msgpack's packer
    stops at 511 levels, an attacker's does not)."""
    mark = "@@DEEP@@"
    h = header(kind, sender, run_id, dict(valid_body(kind), **{field: mark}))
    raw = msgpack.packb(h, use_bin_type=True)
    packed_mark = msgpack.packb(mark)
    return [raw.replace(packed_mark, b"\x91" * depth + b"\xc0")]


def header(kind: MsgKind, sender: str, run_id: str = "", body: Any = None, rnd: int = 0,
           tid: int = 1) -> dict[str, Any]:
    """A header map with the given fields (body unchecked)."""
    return {S.K_VERSION: PROTOCOL_VERSION, S.K_KIND: int(kind), S.K_SENDER: sender,
            S.K_RUN_ID: run_id, S.K_ROUND: rnd, S.K_TASK_ID: tid, S.K_SIM_TIME: 0.0,
            S.K_BODY: body if body is not None else valid_body(kind), S.K_ARRAYS: []}


def schema_attacks(sender: str = "c0000", run_id: str = "") -> Iterator[tuple[str, list[bytes]]]:
    """Frame lists the decoder must refuse: every kind, every field wrong in every way, and
    wrong header fields."""
    for kind in MsgKind:
        for what, body in wrong_bodies(kind):
            frames = _raw(header(kind, sender, run_id, body), [])
            if frames is not None:
                yield what, frames
    h = header(MsgKind.HEARTBEAT, sender, run_id)
    for key, values in [(S.K_SENDER, [7, "x" * 65, None]), (S.K_RUN_ID, [1, "r" * 65]),
                        (S.K_ROUND, ["0", -3, 1 << 40, 2.0]), (S.K_TASK_ID, ["1", -2, True]),
                        (S.K_SIM_TIME, ["0", float("nan"), float("inf")]),
                        (S.K_KIND, [0, 99, "TASK"]),
                        (S.K_VERSION, [0, PROTOCOL_VERSION + 1, str(PROTOCOL_VERSION)]),
                        (S.K_ARRAYS, [{"a": 1}, [["x", "float32", [1]]]]), ("extra", [1])]:
        for v in values:
            frames = _raw(dict(h, **{key: v}), [])
            if frames is not None:
                yield f"header {key}={_short(v)}", frames
    for kind, field in ((MsgKind.FAILURE, "reason"), (MsgKind.BYE, "x"), (MsgKind.RESULT, "body")):
        yield f"{kind.name} {field} nested 1,000 deep", deep_frames(kind, field, sender=sender,
                                                                    run_id=run_id)
    arr = np.zeros(4, np.float32).tobytes()  # arrays on a kind that carries none
    frames = _raw(dict(h, **{S.K_ARRAYS: [["w", "float32", [4]]]}), [arr])
    assert frames is not None
    yield "HEARTBEAT with arrays", frames


def runtime_attacks(sender: str, run_id: str, route: list[int], key: str = ""
                    ) -> Iterator[tuple[str, Message]]:
    """Messages that pass the schema but that the runtime must refuse: results of tasks never
    sent, hop reports out of range, hellos without proof, registrations out of order, hand-offs
    with a forged tag or addressed to someone else; with `key` (the sender's own CURVE key),
    hand-offs whose route keys name that key, and the same with made-up grants."""
    w = {"w": np.zeros(16, np.float32)}
    for tid in (1, 10**9):
        yield "stale RESULT", Message(MsgKind.RESULT, sender, run_id, 0, tid, 0.0,
                                      valid_body(MsgKind.RESULT), w)
        yield "stale FAILURE", Message(MsgKind.FAILURE, sender, run_id, 0, tid, 0.0,
                                       valid_body(MsgKind.FAILURE))
        yield "HOP_DONE beyond the route", Message(
            MsgKind.HOP_DONE, sender, run_id, 0, tid, 0.0,
            {"hop": 0, "to": 99, "peer_bytes": 1 << 40, "peer_tensor_bytes": 1 << 40})
    cid = int(sender[1:])
    one = {"cids": np.array([cid], np.int64)}
    yield "hello without proof", Message(MsgKind.READY, sender, body=valid_body(MsgKind.READY),
                                         arrays=one)
    yield "hello with a wrong proof", Message(MsgKind.READY, sender, body=dict(
        valid_body(MsgKind.READY), nonce=b"n" * 16, proof=b"p" * 32), arrays=one)
    yield "hello for another id", Message(MsgKind.READY, sender, body=valid_body(MsgKind.READY),
                                          arrays={"cids": np.array([(cid + 1) % 10], np.int64)})
    yield "ready before hello", Message(MsgKind.READY, sender, run_id, body={"phase": "readys"},
                                        arrays={**one, "n": np.array([10**9], np.int64)})
    yield "BYE from nobody", Message(MsgKind.BYE, sender, run_id, body={"server_to_client": 1})
    yield "server-only kind", Message(MsgKind.TASK, sender, run_id, body=valid_body(MsgKind.TASK))
    for hop in range(1, len(route)):
        body = {"route": route, "hop": hop, "kind": "train", "body": {"epochs": 1},
                "endpoints": ["tcp://127.0.0.1:1"] * len(route), "mac": b"\x01" * 16}
        prev = f"c{route[hop - 1]:04d}"
        yield "forged HANDOFF from the predecessor", Message(
            MsgKind.HANDOFF, prev, run_id, 0, 1, 0.0, body, w)
        if key:
            own = dict(body, keys=[key] * len(route), mac=b"\0" * 16)
            for rnd, tid in ((0, 1), (1, 5)):  # this round's first task, a later round's
                yield "HANDOFF naming the sender's own key", Message(
                    MsgKind.HANDOFF, prev, run_id, rnd, tid, 0.0, own, w)
                yield "HANDOFF with made-up grants", Message(
                    MsgKind.HANDOFF, prev, run_id, rnd, tid, 0.0,
                    dict(own, grants=[b"\x07" * 16] * len(route)), w)


def frames_of(msg: Message) -> list[bytes]:
    """Encode without the sender-side schema check."""
    return [bytes(memoryview(f)) for f in encode(msg, check=False)]
