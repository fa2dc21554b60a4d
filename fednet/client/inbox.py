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
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from fednet.log import Throttle
from fednet.metrics.accounting import SERVER
from fednet.errors import ConfigError
from fednet.protocol import Message, MsgKind, peek_kind
from fednet.protocol.proof import client_secret, hello_proof
from fednet.transport.channels import Deferred, Received

if TYPE_CHECKING:
    from fednet.client.app import Client

log = logging.getLogger("fednet.client")
throttled = Throttle(log)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

FROM_SERVER = frozenset({MsgKind.WELCOME, MsgKind.TASK, MsgKind.SHUTDOWN, MsgKind.REJECT,
                         MsgKind.HEARTBEAT})
TASKS = frozenset({MsgKind.TASK})


class Inbox:
    """The server link's conversation (registration, what arrives) and the peer socket's
    intake (mixed into Client)."""

    __slots__ = ()

    def hello(self: Client) -> None:
        """READY(hello): this client's claim of its id (proven under launch), alone."""
        hello = {"phase": "hello", "cid": self.cid, "endpoint": self.peers.endpoint,
                 "device": self.device, "pid": os.getpid(), "host": socket.gethostname()[:256]}
        if self.token is not None:  # a reconnect: the server's own token from our WELCOME
            hello["token"] = self.token
        if self.run_key is not None:  # prove the id: a fresh nonce, signed with our secret
            nonce = os.urandom(16)
            secret = client_secret(self.run_key, self.cid)
            hello.update(nonce=nonce, proof=hello_proof(secret, self.cid, nonce))
        self._send_server(Message(MsgKind.READY, self.name, body=hello))

    def register(self: Client, timeout_s: float) -> None:
        """READY (hello) -> WELCOME -> build data and model -> READY (ready)."""
        from fednet.client.link import register
        register(self.link, [self], timeout_s)
        if self.refused is not None:
            raise ConfigError(f"the server refused client {self.cid}: {self.refused}")

    def read(self: Client, ready: dict[Any, int]) -> None:
        """Handle what the readable sockets in `ready` (a poll result) hold."""
        if self.peers.sock in ready:
            self.read_peers()
        if self.own_link and self.link.sock in ready:
            self.link.drain()

    def read_peers(self: Client) -> None:
        """Hand-offs from peers: acknowledged at once and queued; a re-sent duplicate is not
        queued again."""
        for _ in range(1000):
            got = self.peers.receive()
            if got is not None:
                key = (got[0].task_id, int(got[0].body.get("hop", 0)))
                if self.seen is None:
                    self.seen = set()
                if key not in self.seen:
                    self.seen.add(key)
                    self.queue_work(got)
            if not self.peers.sock.poll(0):
                break

    def queue_work(self: Client, item: tuple[Any, int]) -> None:
        """A task or hand-off to run; the process's scheduler learns that this client has work."""
        if not isinstance(self.work, deque):  # an idle client's queue: none yet
            self.work = deque()
        self.work.append(item)
        self.link.ready.append(self)

    def on_server(self: Client, parts: list[Any]) -> None:
        """One message from the server (its envelope removed): a TASK is queued undecoded;
        the rest is decoded, accepted (or rejected) and acted on at once."""
        d = Deferred(b"", parts, "server")
        if peek_kind(parts) in TASKS:
            return self.queue_work((d, 0))
        got = self._accepted(self.server.finish(d))
        if got is None:
            return None
        msg = got.msg
        if msg.kind == MsgKind.SHUTDOWN and "cids" in msg.arrays and self.host is not None:
            self.host.on_shutdown(msg)  # the run ended for all the process's clients
        elif msg.kind == MsgKind.SHUTDOWN:
            self.stopping = True
            self.link.attention.add(self)
        elif msg.kind == MsgKind.WELCOME and "cids" in msg.arrays and self.host is not None:
            self.host.on_welcome(msg)  # the process's WELCOME, for all its clients
        elif msg.kind == MsgKind.WELCOME:
            self._drop_work()  # what the old server sent is void now
            self._welcome(msg)
            if not self.registered:
                self.registered = True
                self.link.settled.append(self)
        elif msg.kind == MsgKind.REJECT:
            reason = str(msg.body.get("reason", ""))[:200]
            if self.host is not None and self.host.batching:  # the process's hellos refused
                return self.host.batch_refused(reason)
            if not self.registered:  # its first registration: this client stops
                if self.refused is None:
                    self.refused = reason
                    self.link.settled.append(self)
                return None
            # a re-registration refused: e.g. the server has not yet seen our old connection
            # close; try again shortly
            throttled.warning("client %d: the server refused to register it again (%s); "
                              "retrying in 2 s", self.cid, reason)
            self.rehello_at = time.monotonic() + 2.0
            self.link.attention.add(self)
        elif msg.kind != MsgKind.HEARTBEAT:
            log.warning("client %d: unexpected %s from the server", self.cid, msg.kind.name)
        return None

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
        self.work = ()

    def check(self: Client) -> int | None:
        """Launcher and server liveness, re-registration; an exit code when this client must stop."""
        code = self.check_process()
        if code is None:
            self.check_flags()
        return code

    def check_process(self: Client) -> int | None:
        """What every client of this process shares: its launcher and its server link; an exit
        code when they must all stop."""
        if os.getppid() != self.parent:  # our launcher is gone: do not linger as an orphan
            log.error("%s: parent process exited; stopping", self.link.names())
            return EXIT_ERROR
        if self.link.gone(self.lost_timeout):
            log.error("%s: lost the server at %s (no connection for %.0fs); stopping",
                      self.link.names(), self.connect, self.lost_timeout)
            return EXIT_ERROR
        return None

    def check_flags(self: Client) -> None:
        """Register again when the link came back, or when a refused re-registration's wait
        is over."""
        if self.rehello_at is not None and self.link.lost_since is None \
                and time.monotonic() >= self.rehello_at:
            self.rehello_at, self.rehello = None, True
        if self.rehello:
            self.rehello = False
            self.hello()

    def must_stop(self: Client) -> bool:
        """Between two batches of a task (training/interrupt.py): read the sockets (a SHUTDOWN
        sets stopping; hand-offs are acknowledged), then stop_due()."""
        self.pump(0)
        return self.stop_due()

    def stop_due(self: Client) -> bool:
        """The run ended for this client (SHUTDOWN), or its launcher or server is gone."""
        return self.stopping or os.getppid() != self.parent or self.link.gone(self.lost_timeout)

    def hello_again(self: Client) -> None:
        """While waiting for WELCOME: a link that dropped and came back lost the hello (or the
        WELCOME) with the old connection; say hello again on the new one."""
        if self.rehello:
            self.rehello = False
            self.hello()
