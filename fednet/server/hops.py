"""The hand-offs of routed tasks (FedSeq's rings), as the server accounts for them under launch.

A hand-off travels peer to peer, so the server sees only the HOP_DONE that its sender sends
after the receiver acknowledged it. The server checks that report against the route it sent
(once per hop, from the client that held the model) and enters the HANDOFF and its HANDOFF_ACK
in the ledger as two messages on the client-to-client link, exactly as the in-process runtime
records the ones it delivers: their sizes are computed from what the server itself knows (the
TASK's body it sent, the model's layout, the --compress-handoff codec: core/wire.handoff_sizes),
never taken from the report. A report that disagrees is logged and the server's figure counted;
where the codec's size follows the values (QSGD), the reported size is counted when it lies
within what the layout allows, else the nearest bound.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fednet.algorithms.layout import Layout
from fednet.core.wire import handoff_sizes, peer_layout
from fednet.metrics.accounting import Ledger
from fednet.log import Throttle
from fednet.protocol import Message
from fednet.types import Task, client_name

log = logging.getLogger("fednet.server")


@dataclass
class Sent:
    """A routed task as the server sent it: its round, route, TASK body and the layout its
    model travels with between peers (None: the strategy declares none; the report is then
    bounded by its own parts only)."""

    round: int
    route: list[int]
    body: dict[str, Any]
    layout: Layout | None
    more_tensor: int = 0
    more_header: int = 0


class Hops:
    """Routed tasks sent in this round or the last, and the hops already counted."""

    def __init__(self, run_id: str, codec: Any) -> None:  # (a compress.Spec)
        self.run_id, self.codec = run_id, codec
        self.sent: dict[int, Sent] = {}
        self.counted: set[tuple[int, int]] = set()  # (task id, hop) whose HOP_DONE was counted
        self._warn = Throttle(log, per_s=5)

    def send(self, task: Task, body: dict[str, Any], layout: Layout | None) -> None:
        """Keep what the hand-offs of `task` will be checked and sized against."""
        travels, more_t, more_h = (None, 0, 0) if layout is None else peer_layout(self.codec,
                                                                                  layout)
        self.sent[task.task_id] = Sent(task.round, list(task.route), body, travels, more_t, more_h)

    def new_round(self, rnd: int) -> None:
        """Forget tasks older than the last round (late HOP_DONEs count for one round after)."""
        self.sent = {t: s for t, s in self.sent.items() if s.round >= rnd - 1}
        self.counted = {h for h in self.counted if h[0] in self.sent}

    def problem(self, cid: int, msg: Message) -> str:
        """Why this HOP_DONE is not a report the server expects ('' when it is): a task sent in
        this round or the last, a hop of its route held by `cid`, a later hop, once."""
        s, b = self.sent.get(msg.task_id), msg.body
        if (s is None or s.round != msg.round or not b["hop"] < b["to"] < len(s.route)
                or s.route[b["hop"]] != cid or (msg.task_id, b["hop"]) in self.counted):
            return f"unexpected HOP_DONE for task {msg.task_id}"
        return ""

    def count(self, ledger: Ledger, cid: int, msg: Message) -> None:
        """Enter the reported hand-off and its acknowledgement in `ledger` (problem() was '')."""
        s, b = self.sent[msg.task_id], msg.body
        self.counted.add((msg.task_id, b["hop"]))
        receiver = s.route[b["to"]]
        said_tensor, said_total = int(b["peer_tensor_bytes"]), int(b["peer_bytes"])
        if s.layout is None:  # nothing to size it by: the report within its own parts
            ack = handoff_sizes(s.body, self.run_id, msg.round, msg.task_id, cid, receiver,
                                b["to"], {})[2]
            tensor = min(said_tensor, said_total)
            header = max(0, said_total - tensor - ack)
        else:
            header, tensor, ack = handoff_sizes(s.body, self.run_id, msg.round, msg.task_id, cid,
                                                receiver, b["to"], s.layout)
            if s.more_tensor:  # a size that follows the values, within its bounds
                tensor = min(max(said_tensor, tensor), tensor + s.more_tensor)
                header = min(max(said_total - said_tensor - ack, header),
                             header + s.more_header)
            if (said_tensor, said_total) != (tensor, header + tensor + ack):
                self._warn.warning("client %d's report of its hand-off of task %d (%d bytes, "
                                   "%d of tensors) is not what its route and model give: the "
                                   "server counts %d (%d)", cid, msg.task_id, said_total,
                                   said_tensor, header + tensor + ack, tensor)
        me, peer = client_name(cid), client_name(receiver)
        ledger.record(msg.round, "HANDOFF", me, peer, header, tensor, tensor)
        ledger.record(msg.round, "HANDOFF_ACK", peer, me, ack, 0, 0)
