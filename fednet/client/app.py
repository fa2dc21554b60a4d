"""One logical client (Client) of a client process: what the server sends it, its tasks and
hand-offs run and answered. The process's poll loop, link and registration are its
Host's (client/host.py), for a process of one client as for one of many.

What arrives from the server is read as it arrives, each message accepted (and only then
counted) or rejected; TASKs are read at once but decoded only when they run. Decoding a TASK
joins its model into memory. Decoding each one just before it runs, after the previous task's
result has left, joins it into the memory that result freed; decoding them as they arrived held
every queued model at once, each in never-touched pages (10 ResNet-18 tasks to a process of 10
clients: 60-100 ms of page faults per model, docs/benchmarks/history.md section 15). Control messages
(SHUTDOWN, WELCOME, REJECT) are decoded at once, so they are never stuck behind queued work.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from fednet.client.peers import PeerChainBroken, Peers, to_server
from fednet.client.trainer import Trainer
from fednet.core.wire import failure_message
from fednet.log import Throttle
from fednet.metrics.accounting import SERVER, Ledger
from fednet.network.latency import Profile
from fednet.protocol import Message, MsgKind, peek_kind
from fednet.transport.channels import Channel, Deferred, Received, sub_frame
from fednet.types import client_name

if TYPE_CHECKING:
    from fednet.client.host import Host

log = logging.getLogger("fednet.client")
throttled = Throttle(log)

NO_WORK: tuple = ()  # an idle client's queue (a deque is made at its first task: ~600 B each)
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

FROM_SERVER = frozenset({MsgKind.WELCOME, MsgKind.TASK, MsgKind.SHUTDOWN, MsgKind.REJECT,
                         MsgKind.HEARTBEAT})

TASKS = frozenset({MsgKind.TASK})


class Client:
    """One federated client of a client process (its Host, client/host.py): an envelope on the
    process's server link, a ROUTER for peer hand-offs, its ledger, settings and queued work.
    Slotted: a process holds thousands of them (~1 KB each)."""

    __slots__ = ("cid", "name", "host", "ledger", "server", "registered", "refused", "peers",
                 "run_id", "trainer", "_tracker", "work", "stopping", "rehello_at")

    def __init__(self, cid: int, host: Host) -> None:
        self.cid, self.name, self.host = cid, client_name(cid), host
        self.ledger = Ledger()
        self.server = Channel(host.link.sock, self.ledger, self.name, router=False,
                              sub=sub_frame(cid))
        host.link.add(self)
        self.registered = False
        self.refused: str | None = None  # the server's reason (REJECT)
        cred = host.cred
        self.peers = Peers(host.ctx, self.name, host.advertise, self.ledger, cred.keys,
                           cred.peer_key, cred.gate, host.link.liveness)
        self.run_id = ""
        self.trainer = Trainer(cid, host.device)  # its settings from WELCOME, its executor
        self._tracker: Any = None
        # tasks (decoded when they run) and hand-offs, run one at a time
        self.work: deque[tuple[Message | Deferred, int]] | tuple = NO_WORK
        self.stopping = False
        self.rehello_at: float | None = None  # a refused re-registration: hello again then

    def _send_server(self, msg: Message, track: bool = False) -> int:
        """Send msg to the server; returns its bytes, 0 when it was given up: it found no
        connection to queue on until the link said none would come (ServerLink.unsendable)."""
        since = time.monotonic()
        while True:
            try:
                n, tracker = self.server.send(msg, SERVER, track=track)
                break
            except zmq.Again:  # no connection (the link's SNDTIMEO): is one still to come?
                why = self.host.link.unsendable(since)
                if why:
                    throttled.warning("client %d: %s not sent: %s", self.cid, msg.kind.name, why)
                    return 0
        if track:
            self._tracker = tracker
            self.host.tracked.add(self)
        return n

    def take_welcome(self, cfg: Any, b: dict[str, Any], profile: Profile, indices: Any,
                     grant: bytes | None, tables: tuple) -> int:
        """This client's row of its process's WELCOME (client/enroll.py); returns its number of
        training examples."""
        self.run_id = str(b.get("run_id", ""))
        examples = self.trainer.take(cfg, self.run_id, profile, indices, tables)
        self.peers.take_welcome(cfg, self.run_id, grant, self.trainer.availability)
        return examples

    def listen(self) -> str:
        """The run's routes hand models between clients: this client's peer socket listens
        (the process's loop reads it); returns where."""
        self.host.check_files()
        self.peers.pump = self.pump_now  # acknowledge hand-offs to us while we wait
        new = self.peers.listen()
        if new is not None:
            self.host.watch(new, self)
        return self.peers.endpoint

    def _run_task(self, msg: Message, nbytes: int) -> None:
        if self._tracker is not None:  # the last zero-copy send still reads our model's memory
            self._tracker.wait()
            self._tracker = None
        if isinstance(msg, Deferred):  # decoded now, into the memory the last task freed
            got = self._accepted(self.server.finish(msg))
            if got is None or got.msg.kind != MsgKind.TASK:
                return
            msg, nbytes = got.msg, got.nbytes
        try:
            ex = self.trainer.executor_now()
        except Exception as e:  # noqa: BLE001 - e.g. its data cannot be built: the task fails
            log.exception("client %d: cannot build its data and model", self.cid)
            self._send_server(failure_message(self.cid, msg.task_id, msg.round,
                                              f"{type(e).__name__}: {e}", msg.sim_time,
                                              self.run_id))
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
                self._send_server(self.peers.hop_done(msg, reply))
                return
            except PeerChainBroken:
                log.error("client %d: the rest of the route is unreachable; returning the model"
                          " to the server", self.cid)
                reply = to_server(reply)
        sleep(out.sim_delay - wired, out.real_elapsed, self.pump, self.trainer.up_delay(reply))
        self._send_server(reply, track=True)

    def pump(self, timeout_ms: int) -> None:
        """Read the process's sockets (hand-offs acknowledged at once and queued, a re-sent
        duplicate not run again; tasks queued; SHUTDOWN stops the client): Host.pump."""
        self.host.pump(timeout_ms)

    def pump_now(self) -> None:
        """pump(0): what a wait calls to serve the sockets meanwhile."""
        self.host.pump(0)

    def step(self) -> bool:
        """Run one queued task or hand-off (then read what arrived meanwhile); False if idle."""
        if not self.work:
            return False
        self._run_task(*self.work.popleft())
        self.pump(0)
        return True

    def close(self) -> None:
        """Stop reading this client's messages and close its peer socket."""
        self.host.link.remove(self)
        self.peers.close()

    # What arrives from the server: each message accepted (and only then counted) or rejected; TASKs
    # decoded when they run.

    def read_peers(self) -> None:
        """Hand-offs from peers: acknowledged at once and queued; a re-sent duplicate is not
        queued again."""
        for got in self.peers.fresh():
            self.queue_work(got)

    def queue_work(self, item: tuple[Any, int]) -> None:
        """A task or hand-off to run; the process's scheduler learns that this client has work."""
        if not isinstance(self.work, deque):  # an idle client's queue: none yet
            self.work = deque()
        self.work.append(item)
        self.host.ready.append(self)

    def on_server(self, parts: list[Any]) -> None:
        """One message from the server (its envelope removed): a TASK is queued undecoded;
        the rest is decoded, accepted (or rejected) and acted on at once."""
        d = Deferred(b"", parts, "server")
        if peek_kind(parts) in TASKS:
            return self.queue_work((d, 0))
        got = self._accepted(self.server.finish(d))
        if got is None:
            return None
        msg, host = got.msg, self.host
        if msg.kind == MsgKind.SHUTDOWN:
            host.enroll.on_shutdown(msg)  # the run ended for the process's clients it names
        elif msg.kind == MsgKind.WELCOME:
            host.enroll.on_welcome(msg)  # the process's WELCOME, for the clients it names
        elif msg.kind == MsgKind.REJECT:
            reason = str(msg.body.get("reason", ""))[:200]
            if host.enroll.stale(self.cid, msg.body.get("answers")):
                log.info("client %d: a late REJECT of an earlier claim ignored (%s)", self.cid,
                         reason)
                return None
            if host.enroll.batching:  # the process's hellos refused
                return host.enroll.batch_refused(reason)
            if not self.registered:  # its first registration: this client stops
                if self.refused is None:
                    self.refused = reason
                    host.settled += 1
                return None
            self.retry_hello(reason)
        elif msg.kind != MsgKind.HEARTBEAT:
            log.warning("client %d: unexpected %s from the server", self.cid, msg.kind.name)
        return None

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

    def _drop_work(self) -> None:
        """Forget the queued work; tasks not decoded yet are decoded and counted first."""
        for msg, _ in self.work:
            if isinstance(msg, Deferred):
                self._accepted(self.server.finish(msg))
        self.work = ()

    def retry_hello(self, reason: str) -> None:
        """A re-registration refused (e.g. the server has not yet seen our old connection
        close): try again shortly."""
        wait = self.host.link.liveness.rehello_s
        throttled.warning("client %d: the server refused to register it again (%s); "
                          "retrying in %g s", self.cid, reason, wait)
        self.rehello_at = time.monotonic() + wait
        self.host.attention.add(self)

    def check_flags(self) -> None:
        """A refused re-registration whose wait is over, the link up: say hello again."""
        if self.rehello_at is not None and self.host.link.lost_since is None \
                and time.monotonic() >= self.rehello_at:
            self.rehello_at = None
            self.host.enroll.hellos(np.array([self.cid], np.int64))

    def welcomed(self) -> None:
        """Registered: its row of a WELCOME taken."""
        if not self.registered:
            self.registered = True
            self.host.settled += 1

    def stop_due(self) -> bool:
        """The run ended for this client (SHUTDOWN), or its launcher or server is gone."""
        return self.stopping or self.host.stop_due()
