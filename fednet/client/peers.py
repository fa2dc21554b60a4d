"""Direct client-to-client hand-off of a task's model along its route (never via the server).

The holder sends HANDOFF to the next client's peer ROUTER and keeps the model until a
HANDOFF_ACK arrives; it retries with a fresh socket, then skips a dead peer; when no peer is
left it returns the model to the server as the task's RESULT, so a chain is never lost.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from fednet.metrics.accounting import SERVER, Ledger
from fednet.protocol import Message, MsgKind, tensor_bytes
from fednet.transport.channels import Channel, bind_router, connect_dealer
from fednet.types import client_name
from fednet.wire import ack_message, handoff_message, hop_done_message

log = logging.getLogger("fednet.client.peers")

ACK_TIMEOUT_S = 30.0  # a busy peer acknowledges between two local updates
RETRIES = 2


class Peers:
    """This client's peer socket and its outgoing hand-offs."""

    def __init__(self, ctx: zmq.Context, me: str, advertise: str, ledger: Ledger,
                 keys: Any = None) -> None:
        self.ctx, self.me, self.ledger = ctx, me, ledger
        self.server_setup = self.client_setup = None
        if keys is not None:  # peers: CURVE servers with the cluster key pair, ZAP-checked
            from fednet.transport import security

            self.server_setup = lambda s: security.as_server(s, keys.client_public, keys.client_secret)
            self.client_setup = lambda s: security.as_client(s, keys.client_public, keys)
        sock, self.endpoint = bind_router(ctx, advertise, 0, what="peer port",
                                          setup=self.server_setup)
        self.sock = sock
        self.chan = Channel(sock, ledger, me, router=True)
        self.last_peer_bytes = self.last_peer_tensor = 0
        self.run_id = ""  # set at WELCOME; hand-offs of other runs are rejected
        self.pump: Callable[[], None] = lambda: None  # serves our own sockets while we wait
        self.ack_timeout, self.retries, self.dead_peer = ACK_TIMEOUT_S, RETRIES, "skip"
        self.last_to_hop = 0

    def next_hop(self, task_msg: Message, reply: Message) -> int | None:
        """Index of the next hop when the reply must travel on along the route, else None."""
        if reply.kind != MsgKind.RESULT:
            return None
        route = task_msg.body.get("route", [])
        hop = int(task_msg.body.get("hop", 0))
        return hop + 1 if hop + 1 < len(route) else None

    def handoff(self, nxt: int, task_msg: Message, reply: Message) -> None:
        """Send the trained model to route[nxt] (skipping dead peers); fall back to the server."""
        b = task_msg.body
        route, endpoints = list(b["route"]), list(b.get("endpoints", []))
        self.last_peer_bytes = self.last_peer_tensor = 0
        last = nxt if self.dead_peer == "server" else len(route) - 1
        for hop in range(nxt, last + 1):
            if hop >= len(endpoints):
                break
            msg = handoff_message(task_msg, reply, hop)
            if self._send_acked(endpoints[hop], client_name(int(route[hop])), msg):
                self.last_to_hop = hop
                return
            log.warning("%s: peer %s did not acknowledge the hand-off; skipping it", self.me,
                        route[hop])
        raise PeerChainBroken(reply)

    def _send_acked(self, endpoint: str, peer: str, msg: Message) -> bool:
        for attempt in range(self.retries):
            dealer = connect_dealer(self.ctx, f"{self.me}-{attempt}-{time.monotonic_ns() % 10**6}",
                                    endpoint, self.client_setup)
            chan = Channel(dealer, self.ledger, self.me, router=False)
            try:
                n, _ = chan.send(msg, peer)
                deadline = time.monotonic() + self.ack_timeout
                while time.monotonic() < deadline:
                    if not dealer.poll(50):
                        self.pump()  # acknowledge hand-offs to us meanwhile: no mutual waits
                        continue
                    got = chan.recv()
                    if got and got[1].kind == MsgKind.HANDOFF_ACK and got[1].task_id == msg.task_id:
                        self.last_peer_bytes += n + got[2]
                        self.last_peer_tensor += tensor_bytes(msg)
                        return True
            finally:
                dealer.close(linger=0)
        return False

    def receive(self) -> tuple[Message, int] | None:
        """A HANDOFF from a peer (acknowledged at once), as a task to run; else None."""
        got = self.chan.recv()
        if got is None:
            return None
        ident, msg, n = got
        why = self._reject_reason(msg)
        if why:
            self.chan.rejects.note(ident, ValueError(why))
            return None
        try:
            self.chan.send(ack_message(msg, self.me), ident)
        except zmq.ZMQError as e:  # the sender is gone: it will retry or skip us; run the hop
            log.warning("%s: could not acknowledge a hand-off from %s: %s", self.me, ident, e)
        return msg, n

    def _reject_reason(self, msg: Message) -> str:
        """Why a peer message is not a hand-off of this run for this client ('' if it is)."""
        if msg.kind != MsgKind.HANDOFF:
            return f"unexpected {msg.kind.name} on the peer socket"
        if msg.run_id != self.run_id:
            return "hand-off of another run"
        route, hop = msg.body.get("route"), msg.body.get("hop")
        if not isinstance(route, list) or not isinstance(hop, int) or not 0 < hop < len(route):
            return "hand-off with a malformed route"
        if client_name(int(route[hop])) != self.me or client_name(int(route[hop - 1])) != msg.sender:
            return "hand-off not addressed to this client by its predecessor"
        return ""

    def hop_done(self, task_msg: Message, reply: Message) -> Message:
        """HOP_DONE for the server: the bytes of the last hand-off and its acknowledgement."""
        return hop_done_message(task_msg, reply, self.last_peer_bytes, self.last_peer_tensor,
                                self.last_to_hop)

    def close(self) -> None:
        """Close the peer socket."""
        self.sock.close(linger=0)


class PeerChainBroken(Exception):
    """No later peer on the route acknowledged; the holder must return the model to the server."""

    def __init__(self, reply: Message) -> None:
        super().__init__("no peer on the rest of the route acknowledged the hand-off")
        self.reply = reply


def to_server(reply: Message) -> Message:
    """The RESULT to send the server when the chain is cut (the model is kept)."""
    body = dict(reply.body)
    body["chain_cut"] = True
    return Message(MsgKind.RESULT, reply.sender, reply.run_id, reply.round, reply.task_id,
                   reply.sim_time, body, reply.arrays)


__all__ = ["Peers", "PeerChainBroken", "to_server", "SERVER"]
