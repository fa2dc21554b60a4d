"""One logical client (Client) of a client process: what the server sends it, its tasks and
hand-offs run and answered. The process's poll loop, link and registration are its
Host's (client/host.py), for a process of one client as for one of many. A Client knows no
Host: it sends on the process's link, and what its Host must act on (a task queued, a flag, an
answer to its registration, a send still reading memory) it returns as Events.

What arrives from the server is read as it arrives, each message accepted (and only then
counted) or rejected; TASKs are read at once but decoded only when they run. Decoding a TASK
joins its model into memory. Decoding each one just before it runs, after the previous task's
result has left, joins it into the memory that result freed; decoding them as they arrived held
every queued model at once, each in never-touched pages (10 ResNet-18 tasks to a process of 10
clients: 60-100 ms of page faults per model, docs/benchmarks/history.md section 15). Control messages
(SHUTDOWN, WELCOME, REJECT) are decoded at once, so they are never stuck behind queued work.
"""
from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from fednet.client.link import ServerLink
from fednet.client.peers import PeerChainBroken, Peers, to_server
from fednet.client.trainer import Trainer
from fednet.core.wire import failure_message
from fednet.log import Throttle
from fednet.metrics.accounting import SERVER, Ledger
from fednet.network.latency import Profile
from fednet.protocol import Message, MsgKind, peek_kind
from fednet.transport.channels import Channel, Deferred, Received, sub_frame
from fednet.types import client_name
from fednet.config import RunConfig

log = logging.getLogger("fednet.client")
throttled = Throttle(log)

NO_WORK: tuple = ()  # an idle client's queue (a deque is made at its first task: ~600 B each)
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

FROM_SERVER = frozenset({MsgKind.WELCOME, MsgKind.TASK, MsgKind.SHUTDOWN, MsgKind.REJECT,
                         MsgKind.HEARTBEAT})
FOR_THE_PROCESS = frozenset({MsgKind.WELCOME, MsgKind.SHUTDOWN, MsgKind.REJECT})  # Host acts

TASKS = frozenset({MsgKind.TASK})


class Event(enum.Enum):
    """What happened to a client that its Host acts on (Host.queue)."""

    READY = "ready"  # a task or hand-off queued (one each): run it in turn
    ATTENTION = "attention"  # a flag to act on: SHUTDOWN, a refused re-registration's wait
    SETTLED = "settled"  # welcomed or refused: the registration's wait is over for it
    TRACKED = "tracked"  # its last send may still read its model's memory (settle)


Events = tuple[Event, ...]
NONE: Events = ()
READY: Events = (Event.READY,)
ATTENTION: Events = (Event.ATTENTION,)
SETTLED: Events = (Event.SETTLED,)
TRACKED: Events = (Event.TRACKED,)
_QUEUED: tuple[Events, None] = (READY, None)
_NOTHING: tuple[Events, None] = (NONE, None)


class Client:
    """One federated client of a client process (its Host, client/host.py): an envelope on the
    process's server link, a ROUTER for peer hand-offs (`peers` builds it from the client's
    name and ledger), its ledger, settings and queued work. `pump(timeout_ms)` reads every
    socket of the process (Host.pump): what a wait calls meanwhile. Slotted: a process holds
    thousands of them (~1 KB each)."""

    __slots__ = ("cid", "name", "link", "ledger", "server", "registered", "refused", "peers",
                 "run_id", "trainer", "pump", "_tracker", "work", "stopping", "rehello_at")

    def __init__(self, cid: int, link: ServerLink, peers: Callable[[str, Ledger], Peers],
                 trainer: Trainer, pump: Callable[[int], None]) -> None:
        self.cid, self.name, self.link = cid, client_name(cid), link
        self.ledger = Ledger()
        self.server = Channel(link.sock, self.ledger, self.name, router=False,
                              sub=sub_frame(cid))
        self.registered = False
        self.refused: str | None = None  # the server's reason (REJECT)
        self.peers = peers(self.name, self.ledger)
        self.run_id = ""
        self.trainer = trainer  # its settings from WELCOME, its executor
        self.pump = pump
        self._tracker: Any = None
        # tasks (decoded when they run) and hand-offs, run one at a time
        self.work: deque[tuple[Message | Deferred, int]] | tuple = NO_WORK
        self.stopping = False
        self.rehello_at: float | None = None  # a refused re-registration: hello again then

    def send(self, msg: Message, track: bool = False) -> int:
        """Send msg to the server; returns its bytes, 0 when it was given up: it found no
        connection to queue on until the link said none would come (ServerLink.unsendable).
        track: its buffers may be read after it returns (settle waits for them)."""
        since = time.monotonic()
        while True:
            try:
                n, tracker = self.server.send(msg, SERVER, track=track)
                break
            except zmq.Again:  # no connection (the link's SNDTIMEO): is one still to come?
                why = self.link.unsendable(since)
                if why:
                    throttled.warning("client %d: %s not sent: %s", self.cid, msg.kind.name, why)
                    return 0
        if track:
            self._tracker = tracker
        return n

    def settle(self) -> None:
        """Wait until this client's last zero-copy send has left (it may still read the
        model's memory)."""
        if self._tracker is not None:
            self._tracker.wait()
            self._tracker = None

    def take_welcome(self, cfg: RunConfig, b: dict[str, Any], profile: Profile, indices: np.ndarray | None,
                     grant: bytes | None, tables: tuple) -> int:
        """This client's row of its process's WELCOME (client/enroll.py); returns its number of
        training examples."""
        self.run_id = str(b.get("run_id", ""))
        examples = self.trainer.take(cfg, self.run_id, profile, indices, tables)
        self.peers.take_welcome(cfg, self.run_id, grant, self.trainer.availability, profile)
        return examples

    def listen(self) -> tuple[str, zmq.Socket | None]:
        """The run's routes hand models between clients: this client's peer socket listens;
        returns where, and the socket when it is new (the process's loop reads it)."""
        self.peers.pump = self.pump_now  # acknowledge hand-offs to us while we wait
        new = self.peers.listen()
        return self.peers.endpoint, new

    def _run_task(self, msg: Message | Deferred, nbytes: int) -> None:
        self.settle()  # the last zero-copy send still reads our model's memory
        if isinstance(msg, Deferred):  # decoded now, into the memory the last task freed
            got = self._accepted(self.server.finish(msg))
            if got is None or got.msg.kind != MsgKind.TASK:
                return
            msg, nbytes = got.msg, got.nbytes
        try:
            ex = self.trainer.executor_now()
        except Exception as e:  # noqa: BLE001 - e.g. its data cannot be built: the task fails
            log.exception("client %d: cannot build its data and model", self.cid)
            self.send(failure_message(self.cid, msg.task_id, msg.round,
                                      f"{type(e).__name__}: {e}", msg.sim_time, self.run_id))
            return
        # wired: --shaped-links, the network already took the received bytes' transfer time
        out, wired = self.trainer.train(ex, msg, nbytes)
        reply = out.reply
        nxt = self.peers.next_hop(msg, reply)
        sleep = self.trainer.sleep_real
        if nxt is not None:  # a ring route: hand the model straight to the next client
            sleep(out.sim_delay - wired, out.real_elapsed, self.pump)
            try:
                self.peers.handoff(nxt, msg, reply)
                self.send(self.peers.hop_done(msg, reply))
                return
            except PeerChainBroken:
                log.error("client %d: the rest of the route is unreachable; returning the model"
                          " to the server", self.cid)
                reply = to_server(reply)
        sleep(out.sim_delay - wired, out.real_elapsed, self.pump, self.trainer.up_delay(reply))
        self.send(reply, track=True)

    def queued_task(self) -> Message | None:
        """The first queued work when it is a TASK from the server, decoded now if it was not
        (counted as _run_task would count it; one that cannot be decoded is dropped as
        _run_task drops it): what --batch-clients trains ahead (client/trainer.train_queued)."""
        if not isinstance(self.work, deque) or not self.work:
            return None
        msg, _ = self.work[0]
        if isinstance(msg, Deferred):
            got = self._accepted(self.server.finish(msg))
            if got is None or got.msg.kind != MsgKind.TASK:
                self.work.popleft()
                return None
            msg = got.msg
            self.work[0] = (msg, got.nbytes)
        return msg if msg.kind == MsgKind.TASK else None

    def pump_now(self) -> None:
        """pump(0): what a wait calls to serve the sockets meanwhile."""
        self.pump(0)

    def step(self) -> Events:
        """Run one queued task or hand-off; TRACKED when the result's send may still read the
        model's memory (the caller then reads what arrived meanwhile)."""
        if not isinstance(self.work, deque) or not self.work:
            return NONE
        self._run_task(*self.work.popleft())
        return TRACKED if self._tracker is not None else NONE

    def close(self) -> None:
        """Close this client's peer socket."""
        self.peers.close()

    # What arrives from the server: each message accepted (and only then counted) or rejected; TASKs
    # decoded when they run.

    def read_peers(self) -> Events:
        """Hand-offs from peers: acknowledged at once and queued (READY each); a re-sent
        duplicate is not queued again."""
        got = self.peers.fresh()
        for item in got:
            self._queue(item)
        return READY * len(got)

    def _queue(self, item: tuple[Any, int]) -> None:
        """A task or hand-off to run."""
        if not isinstance(self.work, deque):  # an idle client's queue: none yet
            self.work = deque()
        self.work.append(item)

    def on_server(self, parts: list[Any]) -> tuple[Events, Message | None]:
        """One message from the server (its envelope removed): a TASK is queued undecoded
        (READY); the rest is decoded and accepted (or rejected); WELCOME, SHUTDOWN and REJECT
        are returned for the process (Host) to act on."""
        d = Deferred(b"", parts, "server")
        if peek_kind(parts) in TASKS:
            self._queue((d, 0))
            return _QUEUED
        got = self._accepted(self.server.finish(d))
        if got is None:
            return _NOTHING
        if got.msg.kind in FOR_THE_PROCESS:
            return NONE, got.msg
        if got.msg.kind != MsgKind.HEARTBEAT:
            log.warning("client %d: unexpected %s from the server", self.cid, got.msg.kind.name)
        return _NOTHING

    def refuse(self, reason: str) -> Events:
        """The server refused this client's own claim: at its first registration the client
        stops (`refused`, SETTLED), a re-registration is tried again (retry_hello)."""
        if self.registered:
            return self.retry_hello(reason)
        if self.refused is None:
            self.refused = reason
            return SETTLED
        return NONE

    def _accepted(self, got: Received | None) -> Received | None:
        """got counted as accepted; None if undecodable, or a kind the server never sends
        (counted as rejected)."""
        if got is None:
            return None
        if got.msg.kind not in FROM_SERVER:
            self.server.reject(got, f"{got.msg.kind.name} is not sent by the server", "server")
            return None
        self.server.accept(got, SERVER)
        return got

    def drop_work(self) -> None:
        """Forget the queued work; tasks not decoded yet are decoded and counted first."""
        for msg, _ in self.work:
            if isinstance(msg, Deferred):
                self._accepted(self.server.finish(msg))
        self.work = ()

    def retry_hello(self, reason: str) -> Events:
        """A re-registration refused (e.g. the server has not yet seen our old connection
        close): try again shortly (hello_due says when)."""
        wait = self.link.liveness.rehello_s
        throttled.warning("client %d: the server refused to register it again (%s); "
                          "retrying in %g s", self.cid, reason, wait)
        self.rehello_at = time.monotonic() + wait
        return ATTENTION

    def hello_due(self) -> bool:
        """Whether a refused re-registration's wait is over, the link up: then it says hello
        again (once)."""
        if self.rehello_at is not None and self.link.lost_since is None \
                and time.monotonic() >= self.rehello_at:
            self.rehello_at = None
            return True
        return False

    def welcomed(self) -> Events:
        """Registered: its row of a WELCOME taken (SETTLED the first time)."""
        if self.registered:
            return NONE
        self.registered = True
        return SETTLED

    def stop(self) -> Events:
        """The run ended for this client (SHUTDOWN): it says BYE and stops (Host._flags)."""
        self.stopping = True
        return ATTENTION
