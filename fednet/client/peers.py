"""Direct client-to-client hand-off of a task's model along its route (never via the server).

The holder sends HANDOFF to the next client's peer ROUTER and keeps the model until a
HANDOFF_ACK arrives; it retries with a fresh socket, then skips a dead peer (at once when the
peer's port refuses the connection); when no peer is left it returns the model to the server as
the task's RESULT, so a chain is never lost. With --dead-peer skip a receiver accepts a hand-off
from any earlier member of its route whose tag (key under --secure) proves it.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from fednet import opcount
from fednet.config.liveness import DEFAULT as LIVENESS, Liveness
from fednet.metrics.accounting import SERVER, Ledger
from fednet.network.availability import Availability
from fednet.network.churn import next_online_hop, passed_over
from fednet.network.latency import Profile, protocol_time
from fednet.protocol import Message, MsgKind, tensor_bytes
from fednet.protocol.proof import check_grant, check_handoff, handoff_tag
from fednet.transport.channels import Channel, Rejects, bind_router, connect_dealer
from fednet.transport.gate import server as gate_server
from fednet.transport.monitor import open_monitor, stop_monitor
from fednet.compress import Spec
from fednet.compress.downlink import for_peer
from fednet.types import client_name
from fednet.core.wire import ack_message, handoff_message, hop_done_message
from fednet.config import RunConfig

log = logging.getLogger("fednet.client.peers")

ACK_TIMEOUT_S = 30.0  # a busy peer acknowledges between two local updates
RETRIES = 2


def _nothing() -> None:
    return None


class Peers:
    """This client's peer socket and its outgoing hand-offs (slotted: one per idle client)."""

    __slots__ = ("ctx", "me", "ledger", "keys", "peer_key", "gate", "server_setup", "advertise",
                 "sock", "chan", "endpoint", "rejects", "last_peer_bytes", "last_peer_tensor",
                 "run_id", "grant", "pump", "ack_timeout", "retries", "dead_peer",
                 "last_to_hop", "availability", "skipped", "compress", "seed", "seen", "live",
                 "profile")

    def __init__(self, ctx: zmq.Context, me: str, advertise: str, ledger: Ledger,
                 keys: Any = None, peer_key: bytes | None = None, gate: str | None = None,
                 live: Liveness = LIVENESS) -> None:
        self.ctx, self.me, self.ledger = ctx, me, ledger
        self.live = live  # the hand-off sockets' timers: the process's (config/liveness.py)
        self.keys, self.peer_key, self.gate = keys, peer_key, gate
        self.server_setup: Any = None
        if keys is not None:  # peers: CURVE servers with this host's key pair
            from fednet.transport import security
            self.server_setup = lambda s: security.as_server(s, keys.client_public, keys.client_secret)
        elif gate is not None:  # plaintext launch: PLAIN with the run's gate password
            self.server_setup = gate_server
        self.advertise = advertise
        self.sock: zmq.Socket | None = None  # bound by listen(): only where hand-offs arrive
        self.chan: Channel | None = None
        self.endpoint = ""
        self.rejects = Rejects()  # one count for everything this peer refused
        self.last_peer_bytes = self.last_peer_tensor = 0
        self.run_id = ""  # set at WELCOME; hand-offs of other runs are rejected
        self.grant: bytes | None = None  # --secure: this client's grant key (WELCOME)
        self.pump: Callable[[], None] = _nothing  # serves our own sockets while we wait
        self.ack_timeout, self.retries, self.dead_peer = ACK_TIMEOUT_S, RETRIES, "skip"
        self.last_to_hop = 0
        self.availability: Availability | None = None  # --availability: offline peers are passed over
        self.skipped = 0  # offline peers the last hand-off passed over
        self.compress, self.seed = Spec(), 0  # --compress-handoff (set at WELCOME)
        self.profile: Profile | None = None  # this client's rates (its hand-off's encoding)
        self.seen: set[tuple[int, int]] | None = None  # (task, hop) of hand-offs received

    def take_welcome(self, cfg: RunConfig, run_id: str, grant: bytes | None,
                     availability: Availability | None, profile: Profile | None = None) -> None:
        """The run's hand-off settings from a WELCOME (hand-offs seen before are forgotten);
        `profile`: this client's, whose rates its encoding of a hand-off is charged at."""
        n = cfg.net
        self.profile = profile
        self.run_id, self.grant, self.availability, self.seen = run_id, grant, availability, None
        self.ack_timeout, self.retries, self.dead_peer = n.ack_timeout, n.ack_retries, n.dead_peer
        self.compress, self.seed = n.codecs().handoff, cfg.seed

    def fresh(self) -> list[tuple[Message, int]]:
        """The hand-offs the peer socket holds (up to 1000), each acknowledged at once
        (receive); a re-sent duplicate of one received before is left out."""
        out = []
        for _ in range(1000):
            got = self.receive()
            if got is not None:
                key = (got[0].task_id, int(got[0].body.get("hop", 0)))
                if self.seen is None:
                    self.seen = set()
                if key not in self.seen:
                    self.seen.add(key)
                    out.append(got)
            if self.sock is None or not self.sock.poll(0):
                break
        return out

    def next_hop(self, task_msg: Message, reply: Message) -> int | None:
        """Index of the next hop when the reply must travel on along the route, else None."""
        if reply.kind != MsgKind.RESULT:
            return None
        route = task_msg.body.get("route", [])
        hop = int(task_msg.body.get("hop", 0))
        if hop + 1 >= len(route):
            return None
        nxt, self.skipped = next_online_hop(self.availability, route, hop + 1, reply.sim_time)
        if nxt is None:  # --availability: every later peer is offline; back to the server
            reply.body["skipped"] = self.skipped
        return nxt

    def handoff(self, nxt: int, task_msg: Message, reply: Message) -> None:
        """Send the trained model to route[nxt] (skipping dead peers); fall back to the server."""
        b = task_msg.body
        route, endpoints = list(b["route"]), list(b.get("endpoints", []))
        keys = list(b.get("keys", []))
        self.last_peer_bytes = self.last_peer_tensor = 0
        last = nxt if self.dead_peer == "server" else len(route) - 1
        with opcount.counted() as work:  # --compress-handoff: this client's encoding, after
            sent = for_peer(self.compress, self.seed, reply.arrays, reply.task_id, nxt)
        if work and self.profile is not None:  # its training: the hand-off leaves once done
            reply.sim_time += protocol_time(self.profile, work)  # (as core/inproc's)
        for hop in range(nxt, last + 1):
            if hop >= len(endpoints):
                break
            tag = handoff_tag(self.peer_key, reply.run_id, reply.round, reply.task_id, hop, self.me)
            msg = handoff_message(task_msg, reply, hop, tag, sent)
            setup = self._client_setup(keys[hop] if hop < len(keys) else "")
            if self._send_acked(endpoints[hop], client_name(int(route[hop])), msg, setup):
                self.last_to_hop = hop
                return
            log.warning("%s: peer %s did not acknowledge the hand-off; skipping it", self.me,
                        route[hop])
        raise PeerChainBroken(reply)

    def _client_setup(self, peer_public: str) -> Any:
        """CURVE client setup towards a peer whose public key (z85) the server sent (the gate's
        password under plaintext launch)."""
        from fednet.transport import gate, security
        if self.keys is None:
            return gate.client(self.gate) if self.gate is not None else None
        server_key = peer_public.encode()
        return lambda s: security.as_client(s, server_key, self.keys)

    def _send_acked(self, endpoint: str, peer: str, msg: Message, setup: Any = None) -> bool:
        for _attempt in range(self.retries):
            try:
                dealer = connect_dealer(self.ctx, endpoint, setup, live=self.live)
            except Exception as e:  # noqa: BLE001 - a bad endpoint or key: this peer is unreachable
                log.warning("%s: cannot connect to peer %s at %s: %s", self.me, peer, endpoint[:80], e)
                return False
            chan = Channel(dealer, self.ledger, self.me, router=False)
            chan.rejects = self.rejects
            watch = ConnectWatch(dealer)
            try:
                n, _ = chan.send(msg, peer)
                deadline = time.monotonic() + self.ack_timeout
                while time.monotonic() < deadline:
                    if watch.refused():  # nothing listens on its port: its process is gone
                        log.warning("%s: peer %s refused the connection (%s)", self.me, peer,
                                    endpoint[:80])
                        return False
                    if not dealer.poll(50):
                        self.pump()  # acknowledge hand-offs to us meanwhile: no mutual waits
                        continue
                    got = chan.received(peer)
                    if got is None:
                        continue
                    if got.msg.kind == MsgKind.HANDOFF_ACK and got.msg.task_id == msg.task_id:
                        chan.accept(got, peer)
                        self.last_peer_bytes += n + got.nbytes
                        self.last_peer_tensor += tensor_bytes(msg)
                        return True
                    chan.reject(got, "not the acknowledgement awaited", peer)
            except zmq.Again:  # no connection for the link timeout (channels.connect_dealer)
                log.warning("%s: no connection to peer %s at %s", self.me, peer, endpoint[:80])
            finally:
                watch.close()
                dealer.close(linger=0)
        return False

    def receive(self) -> tuple[Message, int] | None:
        """A HANDOFF from a peer (acknowledged at once), as a task to run; else None (also
        before the peer socket is bound)."""
        chan = self.chan
        got = chan.received() if chan is not None else None
        if chan is None or got is None:
            return None
        msg = got.msg
        why = self._reject_reason(msg, got.prop("User-Id") if self.keys is not None else None)
        if why:
            chan.reject(got, why)
            return None
        chan.accept(got, msg.sender)
        try:
            chan.send(ack_message(msg, self.me), msg.sender, route=got.route, block=False)
        except zmq.ZMQError as e:  # the sender is gone: it will retry or skip us; run the hop
            log.warning("%s: could not acknowledge a hand-off from %s: %s", self.me,
                        msg.sender, e)
        return msg, got.nbytes

    def _reject_reason(self, msg: Message, user_key: str | None) -> str:
        """Why a peer message is not a hand-off of this run for this client from its
        predecessor, or from an earlier member allowed to skip to it ('' if it is): run,
        addressing, the tag naming this hop (launch) or the sender's key (--secure)."""
        if msg.kind != MsgKind.HANDOFF:
            return f"unexpected {msg.kind.name} on the peer socket"
        if msg.run_id != self.run_id:
            return "hand-off of another run"
        b = msg.body
        route, hop = b["route"], b["hop"]
        if not 0 < hop < len(route):
            return "hand-off with a hop outside its route"
        prev = self._sender_hop(route, hop, msg.sender, msg.sim_time)
        if client_name(route[hop]) != self.me or prev is None:
            return "hand-off not addressed to this client by its predecessor"
        if not check_handoff(self.peer_key, b["mac"], msg.run_id, msg.round, msg.task_id, hop,
                             msg.sender):
            return "hand-off whose tag does not prove the sender"
        if self.keys is not None:
            keys, grants = b.get("keys", []), b.get("grants", [])
            if hop >= len(grants) or not check_grant(
                    self.grant, grants[hop], msg.run_id, msg.round, msg.task_id, hop, route, keys,
                    b.get("endpoints", []), b["kind"], b["body"], b.get("stage", "")):
                return "hand-off whose route, keys or task the server did not grant"
            if hop >= len(keys) or not user_key or keys[prev] != user_key:
                return "hand-off from a key that does not own the route's predecessor"
        return ""

    def _sender_hop(self, route: list[int], hop: int, sender: str, t: float) -> int | None:
        """The route index of the sender of a hand-off to route[hop]: its predecessor; an earlier
        member when every peer between was skipped for a reason this run accepts (offline per
        --availability; with --dead-peer skip, unreachable, which only the holder can tell, so
        any earlier member); else None. Its tag (and key under --secure) is checked after."""
        if client_name(int(route[hop - 1])) == sender:
            return hop - 1
        if self.dead_peer == "skip":
            return earlier_hop(route, hop, sender)
        return passed_over(self.availability, route, hop, sender, t)

    def hop_done(self, task_msg: Message, reply: Message) -> Message:
        """HOP_DONE for the server: the bytes of the last hand-off and its acknowledgement."""
        done = hop_done_message(task_msg, reply, self.last_peer_bytes, self.last_peer_tensor,
                                self.last_to_hop)
        if self.skipped:  # offline peers passed over (--availability)
            done.body["skipped"] = self.skipped
        return done

    def listen(self) -> zmq.Socket | None:
        """Bind the peer socket (for an algorithm whose routes hand models between clients);
        returns it when it is new. Lazy because a bind to a free port costs the kernel a search
        that grows with the ports in use: binding 625 per process up front was two thirds of the
        registration of 10,000 clients (py-spy), for algorithms that never hand off."""
        if self.sock is not None:
            return None
        self.sock, self.endpoint = bind_router(self.ctx, self.advertise, 0, what="peer port",
                                               setup=self.server_setup, live=self.live)
        self.chan = Channel(self.sock, self.ledger, self.me, router=True)
        self.chan.rejects = self.rejects
        return self.sock

    def close(self) -> None:
        """Close the peer socket."""
        if self.sock is not None:
            self.sock.close(linger=0)


class ConnectWatch:
    """A hand-off connection's monitor: `refused()` is True once a connect attempt failed while
    not connected, before any connect succeeded or after the peer dropped the connection: nothing
    listens on the peer's port any more (a dead process, not a busy peer), so waiting for its
    acknowledgement is useless.

    zmq closes a socket asynchronously: a peer that has just died may still accept a connect
    and even complete the handshake, then drop it; its port refuses the reconnect. Counting
    only failures before any connect made the holder wait a whole ack_timeout for such a peer
    (about 1 run in 8 of test_ring_skip). A connect attempt that fails shows as CLOSED, then
    CONNECT_RETRIED; a dropped connection as DISCONNECTED, then CONNECT_RETRIED (the reconnect
    being scheduled), which alone does not count: a live peer takes the reconnect."""

    def __init__(self, dealer: zmq.Socket) -> None:
        self.dealer = dealer
        self.sock = open_monitor(dealer, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
                                              | zmq.EVENT_CLOSED | zmq.EVENT_CONNECT_RETRIED)
        self.up = self.ever = self.failed = False

    def refused(self) -> bool:
        while self.sock.poll(0):
            ev = recv_monitor_message(self.sock)["event"]
            if ev == zmq.EVENT_CONNECTED:
                self.up = self.ever = True
            elif ev == zmq.EVENT_DISCONNECTED:
                self.up = False
            elif ev == zmq.EVENT_CLOSED and not self.up:
                self.failed = True  # a connect attempt failed
            elif ev == zmq.EVENT_CONNECT_RETRIED and not self.up and (self.failed or not self.ever):
                return True
        return False

    def close(self) -> None:
        stop_monitor(self.dealer, self.sock)


def earlier_hop(route: list[int], hop: int, sender: str) -> int | None:
    """The last index before `hop` at which `sender` (a client name) is on `route`, else None."""
    for i in range(hop - 1, -1, -1):
        if client_name(int(route[i])) == sender:
            return i
    return None


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
