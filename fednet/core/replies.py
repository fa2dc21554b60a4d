"""A reply as the round sees it: a RESULT checked against what its task expects, or a FAILURE.

Both runtimes (the in-process dispatcher and the ZeroMQ server) turn every reply into a Result
or a Failure here, so a result that does not fit its strategy's declared layout
(algorithms/layout.py) is its client's failure in either, before any aggregate reads it.
"""
from __future__ import annotations

import logging

from fednet import latency
from fednet.algorithms.layout import Layout, vet
from fednet.latency import Profile
from fednet.protocol import Message, MsgKind
from fednet.types import Failure, Result
from fednet.wire import message_failure, message_result

log = logging.getLogger("fednet.server")


def accept_reply(msg: Message, cid: int, nbytes: int, profiles: list[Profile],
                 expect: Layout | None) -> Result | Failure:
    """Turn a RESULT/FAILURE message received with `nbytes` into a Result (arrival stamped), or
    into the client's Failure when the result does not fit `expect` (the strategy's
    result_layout of the task: algorithms/layout.py), so no aggregate ever reads it."""
    if msg.kind == MsgKind.FAILURE:
        return message_failure(msg, cid)
    arrival = msg.sim_time + latency.up_delay(profiles[cid], nbytes)
    res = message_result(msg, cid, arrival)
    why = vet(expect, res.arrays, res.num_examples)
    if why is not None:
        log.warning("round %d: the result of client %d (task %d) was refused: %s", msg.round,
                    cid, msg.task_id, why)
        return Failure(res.task_id, res.round, cid, f"result refused: {why}", arrival)
    res.sent, res.nbytes = msg.sim_time, nbytes  # for the shared server link (network/rounds.py)
    return res
