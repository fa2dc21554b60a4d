"""A client's intake from the server: messages are read as they arrive, each accepted (and
only then counted) or rejected; TASKs are read at once but decoded only when they run; the
link's liveness from its monitor (Client's half).

Decoding a TASK joins its model into memory. Decoding each one just before it runs, after the
previous task's result has left, joins it into the memory that result freed; decoding them as
they arrived held every queued model at once, each in never-touched pages (10 ResNet-18 tasks
to a process of 10 clients: 60-100 ms of page faults per model, BENCHMARKS.md section 15).
Control messages (SHUTDOWN, WELCOME, REJECT) are decoded at once, so they are never stuck
behind queued work.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from fednet.metrics.accounting import SERVER
from fednet.protocol import MsgKind
from fednet.transport.channels import LINK_TIMEOUT_MS, Deferred, Received

if TYPE_CHECKING:
    from fednet.client.app import Client

log = logging.getLogger("fednet.client")

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

FROM_SERVER = frozenset({MsgKind.WELCOME, MsgKind.TASK, MsgKind.SHUTDOWN, MsgKind.REJECT,
                         MsgKind.HEARTBEAT})
TASKS = frozenset({MsgKind.TASK})


class Inbox:
    """Reading the server link and the peer socket (mixed into Client)."""

    def read(self: Client, ready: dict[Any, int]) -> None:
        """Handle what the readable sockets in `ready` (a poll result) hold."""
        if self.peers.sock in ready:
            for _ in range(1000):
                got = self.peers.receive()
                if got is not None:
                    key = (got[0].task_id, int(got[0].body.get("hop", 0)))
                    if key not in self.seen:
                        self.seen.add(key)
                        self.work.append(got)
                if not self.peers.sock.poll(0):
                    break
        if self.server.sock in ready:
            for _ in range(1000):
                got = self.recv_server(defer=True)
                if isinstance(got, Deferred):
                    self.work.append((got, 0))
                elif got is not None:
                    msg, n = got.msg, got.nbytes
                    if msg.kind == MsgKind.TASK:
                        self.work.append((msg, n))
                    elif msg.kind == MsgKind.SHUTDOWN:
                        self.stopping = True
                    elif msg.kind == MsgKind.WELCOME:
                        self._drop_work()  # what the old server sent is void now
                        self._welcome(msg)
                    elif msg.kind == MsgKind.REJECT:  # a re-registration refused: e.g. the
                        # server has not yet seen our old connection close; try again shortly
                        log.warning("client %d: the server refused to register it again (%s); "
                                    "retrying in 2 s", self.cid, msg.body["reason"][:200])
                        self.rehello_at = time.monotonic() + 2.0
                    else:
                        log.warning("client %d: unexpected %s from the server", self.cid,
                                    msg.kind.name)
                if not self.server.sock.poll(0):
                    break

    def recv_server(self: Client, defer: bool = False) -> Received | Deferred | None:
        """One message from the server (accepted and counted), or None; with defer, a TASK
        comes back undecoded (Deferred)."""
        got = self.server.recv("server", TASKS if defer else frozenset())
        return got if isinstance(got, Deferred) else self._accepted(got)

    def _accepted(self: Client, got: Received | None) -> Received | None:
        """got counted as accepted; None if undecodable, or a kind the server never sends
        (counted as rejected)."""
        if got is None:
            return None
        if got.msg.kind not in FROM_SERVER:
            self.server.reject(got, f"{got.msg.kind.name} is not sent by the server", "server")
            return None
        self.server.accept(got, SERVER)
        return got

    def _drop_work(self: Client) -> None:
        """Forget the queued work; tasks not decoded yet are decoded and counted first."""
        for msg, _ in self.work:
            if isinstance(msg, Deferred):
                self._accepted(self.server.finish(msg))
        self.work.clear()

    def check(self: Client) -> int | None:
        """Launcher and server liveness, re-registration; an exit code when this client must stop."""
        if os.getppid() != self.parent:  # our launcher is gone: do not linger as an orphan
            log.error("client %d: parent process exited; stopping", self.cid)
            return EXIT_ERROR
        if self._server_gone():
            log.error("client %d: lost the server at %s (no connection for %.0fs); stopping",
                      self.cid, self.connect, self.lost_timeout)
            return EXIT_ERROR
        if self.rehello_at is not None and self.lost_since is None \
                and time.monotonic() >= self.rehello_at:
            self.rehello_at, self.rehello = None, True
        if self.rehello:
            self.rehello = False
            log.warning("client %d: the server is back; registering again", self.cid)
            self.hello()
        return None

    def must_stop(self: Client) -> bool:
        """Between two batches of a task (training/interrupt.py): read the sockets (a SHUTDOWN
        sets stopping; hand-offs are acknowledged), then stop_due()."""
        self.pump(0)
        return self.stop_due()

    def stop_due(self: Client) -> bool:
        """The run ended for this client (SHUTDOWN), or its launcher or server is gone."""
        return self.stopping or os.getppid() != self.parent or self._server_gone()

    def hello_again(self: Client) -> None:
        """While waiting for WELCOME: a link that dropped and came back lost the hello (or the
        WELCOME) with the old connection; say hello again on the new one."""
        self._server_gone()
        if self.rehello:
            self.rehello = False
            self.hello()

    def _server_gone(self: Client) -> bool:
        """True when the server link (or the process's heartbeating one) has been down for
        longer than lost_timeout."""
        if self.link is not None and self.link.lost_since is not None \
                and time.monotonic() - self.link.lost_since > self.lost_timeout:
            return True
        while self.monitor.poll(0):
            ev = recv_monitor_message(self.monitor)["event"]
            if ev == zmq.EVENT_DISCONNECTED:
                if self.lost_since is None:  # a frozen server stops answering heartbeats
                    log.warning("client %d: lost the server at %s (closed, or no answer to "
                                "heartbeats for %.0fs); waiting up to %.0fs for it", self.cid,
                                self.connect, LINK_TIMEOUT_MS / 1000, self.lost_timeout)
                    self.lost_since = time.monotonic()
            elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if self.lost_since is not None:  # the server is back (restarted, or the link
                    self.rehello = True  # dropped while registering): register again
                self.lost_since = None
        return self.lost_since is not None and time.monotonic() - self.lost_since > self.lost_timeout
