"""A reply as the round sees it: a RESULT checked against what its task expects, or a FAILURE.

Both runtimes (the in-process dispatcher and the ZeroMQ server) turn every reply into a Result
or a Failure here, so a result that does not fit its strategy's declared layout
(algorithms/layout.py) is its client's failure in either, before any aggregate reads it.
"""
from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fednet.network import latency
from fednet.algorithms.layout import Layout, vet
from fednet.compress import CompressionError, Spec, decode_counted
from fednet.network.latency import Profile
from fednet.protocol import Message, MsgKind, tensor_bytes
from fednet.types import Arrays, Failure, Result, Task
from fednet.core.verdict import DIVERGED_LOCALLY, non_finite
from fednet.core.wire import message_failure, message_result
from fednet.core.work import check_body
from fednet.data.partition import part_size
from fednet.errors import ProtocolError
from fednet.privacy.plan import noise_cause
from fednet.config import RunConfig

log = logging.getLogger("fednet.server")


def accept_reply(msg: Message, cid: int, nbytes: int, profiles: Sequence[Profile],
                 expect: Layout | None, compress: Spec | None = None,
                 reference: Arrays | None = None,
                 body: dict[str, str] | None = None,
                 bounds: Bounds | None = None,
                 noise: Callable[[Arrays], str] | None = None) -> Result | Failure:
    """Turn a RESULT/FAILURE message received with `nbytes` into a Result (arrival stamped), or
    into the client's Failure when the result does not fit `expect` (the strategy's
    result_layout of the task: algorithms/layout.py), so no aggregate ever reads it. With
    --compress (`compress`) the arrays are first rebuilt against `expect` and `reference` (the
    arrays the task sent; fednet/compress: its work, the result's server_ops, is the server's on
    the clock); a result that does not decode is refused the same way, and so is one whose body
    keys do not hold what the algorithm declares (`body`: its Spec.result_body,
    core/work.check_body). `bounds`: what the server itself knows of the task (the partition it
    gave the client, the earliest start and latest end of its simulated time): a sample count
    other than the partition's, a stamp outside the window, or NaN/inf in the arrays is the
    client's failure, so that no client weighs, times or poisons the aggregate beyond its own
    share; so is a training or test loss it reports as NaN/inf (its local training diverged:
    loss_problem), even where no array travels (Stand-Alone). `noise`: why a result of this run
    may hold NaN/inf (the noise of differential privacy, privacy/plan.noise_cause), added to
    such a failure's reason."""
    if bounds is not None and not bounds.start <= msg.sim_time <= bounds.latest:
        if msg.kind == MsgKind.FAILURE:  # a failure already: its time kept within the window
            msg.sim_time = min(max(msg.sim_time, bounds.start), bounds.latest)
        else:
            late = (f"its simulated time {msg.sim_time:.6g} s is outside its task's window "
                    f"[{bounds.start:.6g}, {bounds.latest:.6g}] s")
            log.warning("round %d: the result of client %d (task %d) was refused: %s",
                        msg.round + 1, cid, msg.task_id, late)
            return Failure(msg.task_id, msg.round, cid, f"result refused: {late}", bounds.latest)
    if msg.kind == MsgKind.FAILURE:
        return message_failure(msg, cid)
    arrival = msg.sim_time + latency.up_delay(profiles[cid], nbytes)
    wire_tensor_bytes = tensor_bytes(msg)  # as it travelled (before --compress decodes it)
    res = message_result(msg, cid, arrival)
    why: str | None = None
    if compress is not None and compress.on:
        try:
            res.arrays, res.server_ops = decode_counted(compress, res.arrays, expect,
                                                        reference or {})
        except CompressionError as e:
            why = str(e)
    why = why or vet(expect, res.arrays, res.num_examples,
                     bounds.examples if bounds is not None else None) or _body_problem(res.body,
                                                                                       body)
    why = why or loss_problem(res.body)
    if why is not None:
        log.warning("round %d: the result of client %d (task %d) was refused: %s",
                    msg.round + 1, cid, msg.task_id, why)
        cause = noise(res.arrays) if noise is not None and non_finite(why) else ""
        return Failure(res.task_id, res.round, cid,
                       f"result refused: {why}" + (f"; {cause}" if cause else ""), arrival)
    res.vetted = tuple(res.arrays.values())  # vet found them finite (layout.proven_finite)
    res.sent, res.nbytes = msg.sim_time, nbytes  # for the shared server link (network/step.py)
    res.tensor_nbytes = wire_tensor_bytes
    return res


@dataclass(frozen=True)
class Bounds:
    """What the server knows of a reply before it reads it: the examples its partition gave the
    replying client, and the simulated window its task's reply must fall in."""

    examples: int
    start: float
    latest: float


LOSSES = {"loss": "training loss", "test_loss": "test loss"}
"""The losses a result body may report (protocol/schema.RESULT_BODY), as a reason names them."""


def loss_problem(body: dict[str, Any]) -> str | None:
    """Why a result whose client reports a NaN/inf loss is unusable, or None: its local training
    diverged, so its arrays (finite or not) and its own model's accuracy mean nothing. The
    schema lets such a loss through decode (protocol/schema.RESULT_BODY) precisely so that it
    arrives here and is recorded as this client's failure with this cause, instead of being a
    rejected message with no reason that leaves its task waiting on a deadline."""
    for key, what in LOSSES.items():
        v = body.get(key)
        if isinstance(v, float) and not math.isfinite(v):
            return (f"its reported {what} is {v}: {DIVERGED_LOCALLY} (try a smaller --lr, or "
                    "--clip 5 where the algorithm has it)")
    return None


def _body_problem(got: dict[str, Any], kinds: dict[str, str] | None) -> str | None:
    try:
        check_body(got, kinds or {}, "result body")
    except ProtocolError as e:
        return str(e)
    return None


def receive(s: Any, msg: Message, cid: int, nbytes: int, task: Task) -> Result | Failure:
    """accept_reply with what the session `s` (core/session.Session) knows of the task: its
    result layout, --compress, and the arrays it sent as the reference (none when the
    algorithm's results are updates already: ClientUpdate.sends_updates)."""
    reference = {} if s.update_results else task.arrays
    bounds = Bounds(part_size(s.parts, cid), task.sim_time, s.latest_return(task))
    noise = functools.partial(dp_cause, s.cfg) if s.cfg.dp.mode != "none" else None
    return accept_reply(msg, cid, nbytes, s.profiles, s.algo.result_layout(task), s.compress,
                        reference, s.spec.result_body, bounds, noise)


def dp_cause(cfg: RunConfig, arrays: Arrays) -> str:
    """Why a result of a run under user-level DP may hold NaN/inf ('' when the noise is too
    small to be the likely cause: privacy/plan.noise_cause)."""
    values = sum(int(np.asarray(a).size) for a in arrays.values()
                 if np.asarray(a).dtype.kind == "f")
    return noise_cause(cfg, values)
