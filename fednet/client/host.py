"""A client process: its logical clients (one, or `--clients-per-process N`), their server link,
registration and one poll loop. A process of one client runs the same loop as a process of many.

One zmq context, one poll loop and one worker serve N clients, so N clients cost one process:
one fork, one interpreter, one CUDA context on a GPU (a context holds hundreds of MB of device
memory, so 100 separate processes may not fit on one device), and one server connection
(client/link.py): each message on it carries an envelope naming its client. Each logical client
keeps its own identity (its id proven in the process's hello), peer socket, ledger, data and
state: the
server's ledger and the clients' see the same messages and bytes as N separate processes would
send. Their tasks run one at a time, in the order they arrived, so clients whose algorithm keeps
no model between tasks share one working model (executor.
share_working_models); before a task starts, every earlier zero-copy send of the process has
left (it may still read that model's memory). Hand-offs between two clients of the same process
travel over their peer sockets like any other, and any wait (for an acknowledgement, a real-time
delay) reads every client's sockets, so a hand-off to a neighbour in the same process is
acknowledged while its sender waits.

The process's clients register together, and one BYE answers a SHUTDOWN for them all
(client/enroll.py); their ids and idle flags are columns (client/table.py), so an idle client
costs a few bytes, not an object. A Client knows no Host: what the Host must act on (a task
queued, a flag, an answer to the registration, a send that may still read memory) its methods
return as events, which the Host queues (Host.queue).
"""
from __future__ import annotations

import logging
import os
import resource
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import zmq

from fednet.client.app import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Client, Event, Events
from fednet.client.enroll import Enrollment
from fednet.client.link import Credentials, ServerLink
from fednet.client.peers import Peers
from fednet.client.trainer import Trainer, train_queued
from fednet.algorithms.updates import has_ahead
from fednet.config.liveness import DEFAULT, Liveness
from fednet.core.executor import KeptExecutors, share_working_models
from fednet.errors import ConfigError
from fednet.metrics.accounting import Ledger
from fednet.platform.proc import check_files_per_process
from fednet.training import interrupt
from fednet.transport.channels import sub_frame

log = logging.getLogger("fednet.client")

SOCKETS_PER_CLIENT = 8  # peer socket, hand-off dealers (the server link is the process's)


class Host:
    """The logical clients of one process, their shared server link and poll loop.

    A client exists as an object only while it has something to do: after the process's batch
    registration an idle client is its bit of the idle column and its row of the WELCOME's
    arrays (client/enroll.py); a task for it builds its Client, and a client whose algorithm keeps nothing between
    tasks is retired after each one (its ledger's totals kept for the process's BYE)."""

    def __init__(self, cids: Sequence[int], connect: str, device: str = "cpu",
                 advertise: str = "127.0.0.1", threads: int = 1, secure: str = "",
                 run_key: bytes | None = None, key_name: str = "",
                 curve: tuple[bytes, bytes] | None = None, lost_timeout: float = 60.0,
                 liveness: Liveness = DEFAULT) -> None:
        self.several = len(cids) > 1  # else one client keeps its objects (trainer.py)
        if self.several:
            share_working_models()
        torch.set_num_threads(threads)
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, max_sockets(len(cids)))
        self.device, self.advertise = device, advertise
        cred: Credentials | None = None
        link: ServerLink | None = None
        self.by_cid: dict[int, Client] = {}  # the clients that exist now
        self.routes: dict[bytes, Client] = {}  # envelope -> client: whose messages are read
        self.kept = KeptExecutors()  # stateless clients' Executors between their tasks
        self.poller = zmq.Poller()
        self.by_sock: dict[zmq.Socket, Client] = {}  # peer socket -> its client
        self.rejected: list[Client] = []
        self.ready: deque[Client] = deque()  # a client per task or hand-off queued, in order
        self.attention: set[Client] = set()  # clients with a flag to act on (_flags)
        self.tracked: set[Client] = set()  # clients whose last send may still read memory
        self._current: Client | None = None
        self.files_checked = False
        self.parent = os.getppid()
        self.live: dict[Client, None] = {}
        try:
            self.cred = cred = Credentials(self.ctx, secure, run_key, key_name, curve)
            # the ids, their WELCOME, SHUTDOWN and BYE
            self.enroll = Enrollment(cids, self, device, cred, self.kept)
            self.link = link = cred.link(self.ctx, connect, liveness,
                                         label=self.enroll.table.name(),
                                         lost_timeout=lost_timeout, deliver=self.deliver)
            self.poller.register(link.sock, zmq.POLLIN)
            self.first = self.make(int(self.enroll.table.first))  # speaks for the process (batch messages)
        except BaseException:  # a client half built (a failed bind) has sockets close() misses
            if link is not None:
                link.close(0)
            if cred is not None:
                cred.stop()
            self.ctx.destroy(linger=0)
            raise

    @property
    def clients(self) -> list[Client]:
        """The clients that exist now (see the class)."""
        return list(self.by_cid.values())

    def make(self, cid: int, take: bool = True) -> Client:
        """Client cid's object: built, on the shared link, its part of the WELCOME taken."""
        # with several clients, an Executor is dropped after each task, kept within a budget
        trainer = Trainer(cid, self.device, self.kept if self.several else None)
        c = Client(cid, self.link, self._peers, trainer, self.pump)
        self.by_cid[cid] = c
        self.routes[sub_frame(cid)] = c
        w = self.enroll.w
        if take and w is not None and w.row(cid) >= 0:
            self.enroll.take(c)
            self.queue(c, c.welcomed())
        self.enroll.table.set_idle(cid, False)
        if self.live or self.first_served:
            self.live[c] = None
        return c

    def _peers(self, name: str, ledger: Ledger) -> Peers:
        """A client's peer hand-offs (its ROUTER is bound when the run's routes need one): on
        the process's context, with its credentials and timers."""
        cred = self.cred
        return Peers(self.ctx, name, self.advertise, ledger, cred.keys, cred.peer_key, cred.gate,
                     self.link.liveness)

    def materialize(self, sub: bytes) -> Client | None:
        """A message for a client without an object (deliver): an idle one is built."""
        cid = int.from_bytes(sub, "little") if len(sub) == 4 else -1
        return self.make(cid) if self.enroll.table.is_idle(cid) else None

    def queue(self, c: Client, events: Events) -> None:
        """What happened to client c (its methods' Events): a task or hand-off to run in turn,
        a flag to act on (_flags), an answer to the registration (Enrollment.claim's wait), a
        send that may still read memory (_settle)."""
        for e in events:
            if e is Event.READY:
                self.ready.append(c)
            elif e is Event.ATTENTION:
                self.attention.add(c)
            elif e is Event.SETTLED:
                self.enroll.settled += 1
            else:
                self.tracked.add(c)

    def deliver(self, sub: bytes, parts: list[Any]) -> bool:
        """A message from the server for the client whose envelope is `sub` (ServerLink.drain):
        that client reads it (an idle one is built first) and what it says is acted on (a
        WELCOME, SHUTDOWN or REJECT: Enrollment.on_message); False when it names no client of
        this process."""
        c = self.routes.get(sub) or self.materialize(sub)
        if c is None:
            return False
        events, msg = c.on_server(parts)
        if msg is not None:
            events = self.enroll.on_message(c, msg)
        if events:
            self.queue(c, events)
        return True

    def retire(self, c: Client) -> None:
        """c has nothing left to do and keeps nothing between tasks: back to idle."""
        self.enroll.keep_totals(c)
        self.routes.pop(sub_frame(c.cid), None)
        self.by_cid.pop(c.cid, None)
        self.live.pop(c, None)
        self.enroll.table.set_idle(c.cid, True)

    def _retirable(self, c: Client) -> bool:
        """Whether c can go back to idle: it is rebuilt from the kept WELCOME's row (a process
        whose clients registered one by one keeps only the last one's WELCOME), it holds
        nothing, and it is not waiting to register again."""
        w = self.enroll.w
        return (c is not self.first and w is not None and not w.peers and w.row(c.cid) >= 0
                and c.trainer.executor is None and not c.work and not c.stopping
                and c.rehello_at is None and c in self.live)

    def listen(self, c: Client) -> str:
        """The run's routes hand models between clients: client c's peer socket listens, read
        by the poll loop from now on; returns where. Before the first one binds: ConfigError
        when the process's clients would need more open files than its limit."""
        if not self.files_checked:
            self.files_checked = True
            check_files_per_process(len(self.enroll.table))
        endpoint, new = c.listen()
        if new is not None:
            self.by_sock[new] = c
            self.poller.register(new, zmq.POLLIN)
        return endpoint

    def pump(self, timeout_ms: int) -> None:
        """Read the server link and every peer socket (waiting up to timeout_ms for the first
        message)."""
        ready = dict(self.poller.poll(timeout_ms))
        for sock in ready:
            if sock is self.link.sock:
                self.link.drain()
            elif (c := self.by_sock.get(sock)) is not None:
                self.queue(c, c.read_peers())

    def register(self, timeout_s: float) -> None:
        """The process's clients register over the shared link: all at once (READY(hellos),
        one WELCOME, READY(readys): server/registrar.py); a process of several whose claim the
        server refused registers them one by one, and a client the server refuses stops alone
        (Enrollment.claim). ConfigError when none is left (a process of one: with the server's
        reason)."""
        enroll = self.enroll
        enroll.claim(self.link, timeout_s)
        if enroll.w is None and not self.several:
            raise ConfigError(f"the server refused client {self.first.cid}: {enroll.refusal}")
        for c in self.clients:
            if c.refused is not None:
                log.error("client %d: the server refused it: %s", c.cid, c.refused)
                self.drop(c)
                self.rejected.append(c)
        if len(self.rejected) == len(self.clients):
            raise ConfigError("the server refused every client of this process")
        self._warn_real_time()

    def _warn_real_time(self) -> None:
        if self.first.trainer.real and len(self.enroll.table) > 1:
            log.warning("clients %s: --real-time with several clients per process: each waits "
                        "out the others' simulated delays, so wall-clock times are inflated",
                        self.enroll.table.text())

    def drop(self, c: Client) -> None:
        """Stop reading a client's messages (it stopped; the others go on)."""
        self.routes.pop(sub_frame(c.cid), None)
        if c.peers.sock is not None and self.by_sock.pop(c.peers.sock, None) is not None:
            self.poller.unregister(c.peers.sock)

    first_served = False

    def stop_due(self) -> bool:
        """The launcher or the server is gone: every client's task stops."""
        return os.getppid() != self.parent or self.link.gone()

    def serve(self) -> int:
        """Run the clients' work in the order it arrived until the run ended for every one of
        them; the exit code is 0 only if all stopped cleanly. A client whose work raises stops
        alone (logged)."""
        self.first_served = True
        self.live = {c: None for c in self.clients if c not in self.rejected}
        worst = EXIT_USAGE if self.rejected else EXIT_OK
        interrupt.install(self._must_stop)
        check_at = 0.0
        table = self.enroll.table
        while self.live or table.n_idle or table.n_stopped:
            now = time.monotonic()
            if now >= check_at:
                check_at = now + self.link.liveness.check_s  # 0.2 ms for 63 clients
                if self.link.abandoned(self.parent):  # the launcher, or the server, is gone
                    return max(worst, EXIT_ERROR)
                self._flags()
                if not (self.live or table.n_idle):
                    break
            c = self._next_with_work()
            if c is None:
                self.pump(1000)
                continue
            self._settle()
            self._current = c
            try:
                self._ahead(c)
                self.queue(c, c.step())
                self.pump(0)  # what arrived meanwhile
                if self._retirable(c):
                    self.retire(c)
            except interrupt.Interrupted:  # the run ended, or the server or launcher is gone
                log.warning("%s: stopped in the middle of a task", self.link.label)
            except Exception:  # noqa: BLE001 - one client's failure is not its neighbours'
                log.exception("client %d: stopped by an error%s", c.cid,
                              "; the other clients of this process go on" if self.several else "")
                worst = max(worst, EXIT_ERROR)
                self.live.pop(c, None)
                self.drop(c)
            finally:
                self._current = None
        return worst

    def _ahead(self, c: Client) -> None:
        """--batch-clients: before c's task runs, unless it was trained in a block already, the
        tasks queued for this process's clients (c's first, then in the order they arrived) are
        trained in blocks (client/trainer.train_queued)."""
        first = c.queued_task() if c.trainer.batching() else None
        if first is None or has_ahead(c.cid, first.task_id):
            return
        queued, seen = [(c.trainer, first)], {c}
        for o in self.ready:
            if o not in seen and o in self.live:
                seen.add(o)
                msg = o.queued_task()
                if msg is not None:
                    queued.append((o.trainer, msg))
        train_queued(queued, self.device)

    def _must_stop(self) -> bool:
        """Between two batches of a task (training/interrupt.py): read the sockets (a SHUTDOWN
        sets stopping; hand-offs are acknowledged), then whether the running task must stop."""
        self.pump(0)
        c = self._current
        return c is not None and (c.stopping or self.stop_due())

    def _flags(self) -> None:
        """Act on the clients that something happened to: a SHUTDOWN (BYE, then it stops), a
        link back (register again), a refused re-registration whose wait is over."""
        back, done = self.link.take_back(), []
        for c in list(self.attention):
            self.attention.discard(c)
            if c not in self.live:
                continue
            if c.stopping:
                done.append(c)
                self.live.pop(c)
                continue
            if back:  # every client says hello again (below)
                c.rehello_at = None
                continue
            if c.hello_due():  # a refused re-registration's wait is over: hello again
                self.enroll.hellos(np.array([c.cid], np.int64))
            if c.rehello_at is not None:  # still waiting: look again next time
                self.attention.add(c)
        self.together(done, list(self.live) if back else [])

    def together(self, done: list[Client], again: list[Client]) -> None:
        """BYE for the clients whose run ended, READY(hellos) for `again` (the live clients,
        when the link came back) and the idle ones: Enrollment.together; then the clients that
        stopped are no longer read."""
        for c in self.enroll.together(done, again):
            self.live.pop(c, None)
            self.drop(c)

    def _settle(self) -> None:
        """Wait until every client's last zero-copy send has left: the next task may load a
        received model into the working model those messages still read."""
        for c in self.tracked:
            c.settle()
        self.tracked.clear()

    def _next_with_work(self) -> Client | None:
        """The next client with a queued task or hand-off, in the order they arrived; None if
        none has."""
        ready = self.ready
        while ready:
            c = ready.popleft()
            if c.work and c in self.live:
                return c
        return None

    def close(self) -> None:
        """Close every client's sockets, the shared link, then the shared context."""
        self.kept.clear()
        for c in self.clients:
            c.close()
        self.link.close()
        self.cred.stop()
        self.ctx.term()
        share_working_models(False)  # the next run in this process starts with its own models


def max_sockets(clients: int) -> int:
    """The shared context's socket limit: SOCKETS_PER_CLIENT a client, but no more than the
    process may open files (each socket holds one, its mailbox's): libzmq allocates 12 bytes
    for every socket it may ever open, 60 MB in each process of 625,000 clients."""
    want = SOCKETS_PER_CLIENT * clients + 64
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if files != resource.RLIM_INFINITY:
        want = min(want, files)
    return max(1023, want)
