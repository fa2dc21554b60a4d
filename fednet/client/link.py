"""A client process's connection to the server, shared by all of its logical clients.

One DEALER, one socket monitor and one heartbeat per process, however many clients it holds:
a connection per client cost the server one open file, one loopback port and one heartbeat
timer each (libzmq's timer upkeep grew as C^2; 50,000 clients needed more files than the
limit). Every message on the link starts with an envelope frame naming the client
(channels.sub_frame); the link hands each arriving message with its envelope to the process
(`deliver`: client/host.Host, which gives it to the client it names). The server
binds each (connection, client) pair to a client id only through a proven hello, so a process
speaks only for the ids it proved (server/conns.py).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from fednet.config.liveness import DEFAULT, Liveness
from fednet.errors import ConfigError
from fednet.log import Throttle
from fednet.protocol.proof import gate_password, peer_key
from fednet.transport.gate import Gate
from fednet.transport.channels import connect_dealer
from fednet.transport.monitor import open_monitor, stop_monitor

log = logging.getLogger("fednet.client")
throttled = Throttle(log)

DRAIN = 1000  # messages read from the link per call (the caller's other work goes on between)
# a message from the server for one of the process's clients: (its envelope, its frames after
# the envelope) -> whether a client of this process took it
Deliver = Callable[[bytes, list[Any]], bool]
MISMATCH_CLOSES = 3  # connections closed mid-handshake in a row that count as a mismatch


class ServerLink:
    """The server link of one client process: the socket, what arrives on it handed on with
    its envelope (`deliver`; without one every message is a stray) and what the connection's
    events say (lost, back, refused). Which client an envelope names, and scheduling the
    clients' work, are the Host's (client/host.py). `label` is what log lines call the link's
    clients; `lost_timeout` how long the process waits for a lost server."""

    def __init__(self, ctx: zmq.Context, connect: str,
                 setup: Callable[[zmq.Socket], None] | None = None, secure: bool = False,
                 liveness: Liveness = DEFAULT, label: str = "", lost_timeout: float = 60.0,
                 deliver: Deliver | None = None) -> None:
        self.connect, self.label, self.deliver = connect, label, deliver
        self.secure = secure  # CURVE (--secure) on this side
        self.liveness = liveness  # its timers (config/liveness.py)
        opened: list[zmq.Socket] = []

        def setup_and_watch(sock: zmq.Socket) -> None:
            """The caller's setup, then the monitor, before the connect: the first handshake's
            events are the only ones when libzmq does not reconnect after it (a mechanism
            mismatch it finds itself), and a monitor opened after the connect can miss them."""
            if setup is not None:
                setup(sock)
            opened.append(open_monitor(sock, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
                                       | zmq.EVENT_HANDSHAKE_SUCCEEDED
                                       | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                       | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL))
        # a send with no connection to queue on looks at the link this often (unsendable)
        try:  # a dead server is noticed (DISCONNECTED, no new handshake) while idle
            self.sock = connect_dealer(ctx, connect, setup_and_watch, live=liveness,
                                       send_timeout_ms=max(1, round(liveness.recheck_s * 1000)))
        except BaseException:
            for mon in opened:
                mon.close(0)
            raise
        self.monitor = opened[0]
        self.lost_since: float | None = None
        self.lost_timeout = lost_timeout
        self.denied = False  # the server refused our credentials at a handshake (ZAP)
        self.mismatch = False  # the server speaks another mechanism: --secure on one side only
        self.guessed = False  # mismatch inferred from closed handshakes, not reported
        self.in_handshake = False  # a connection is up and its handshake has no outcome yet
        self.closed_in_handshake = 0  # connections the server closed mid-handshake, in a row
        self.up_once = False  # a handshake with the server has succeeded
        self.back = False  # a new handshake after a loss: the clients must register again
        self.strays = 0  # messages for no client of this process (dropped)

    def drain(self) -> int:
        """Hand what the link holds (up to DRAIN messages) on (`deliver`), each with the envelope
        that names its client; returns how many were read."""
        n = 0
        for n in range(1, DRAIN + 1):
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return n - 1
            self.up_once = True  # (also where the monitor attached after the handshake)
            if len(parts) > 1 and self.deliver is not None \
                    and self.deliver(parts[0].bytes, parts[1:]):
                continue
            self.strays += 1
            throttled.warning("a message from the server for no client of this process "
                              "(%d so far): dropped", self.strays)
        return n

    def watch(self) -> None:
        """Read the link's connection events: a loss (after a handshake succeeded: a refused
        one loses nothing) is logged once; a new handshake after a loss (the server restarted,
        or the link dropped) sets `back` (take_back): the clients must register again."""
        while self.monitor.poll(0):
            msg = recv_monitor_message(self.monitor)
            ev = msg["event"]
            self._handshake_event(ev, msg["value"])
            if ev == zmq.EVENT_DISCONNECTED and self.lost_since is None and self.up_once:
                log.warning("%s: lost the server at %s (closed, or no answer to heartbeats for "
                            "%gs); waiting up to %.0fs for it", self.label, self.connect,
                            self.liveness.link_timeout_ms / 1000, self.lost_timeout)
                self.lost_since = time.monotonic()
            elif ev == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.denied = True
            elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.denied, self.up_once = False, True
                if self.lost_since is not None:
                    log.warning("%s: the server is back; registering again", self.label)
                    self.back = True
                self.lost_since = None

    def _handshake_event(self, ev: int, value: int) -> None:
        """Whether the server speaks another mechanism (`mismatch`). Either side may find the
        mismatch in the greetings; the side that finds it closes the connection, and what the
        other side had been sent may be lost in the reset (on loopback with pyzmq 27.3 / libzmq
        4.3.5, a client either way round was told in 0 to 1 of 30 handshakes). So a server that closed
        MISMATCH_CLOSES connections in a row mid-handshake, before any handshake succeeded and
        without refusing this host's credentials (that is HANDSHAKE_FAILED_AUTH), counts as
        one: a fednet server closes a handshake for no other reason."""
        if (ev == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH):
            self.mismatch = True
        if ev == zmq.EVENT_CONNECTED:
            self.in_handshake = True
        elif ev == zmq.EVENT_DISCONNECTED and self.in_handshake:
            self.closed_in_handshake += 1
            if self.closed_in_handshake >= MISMATCH_CLOSES and not self.up_once:
                self.mismatch = self.guessed = True
        if ev != zmq.EVENT_CONNECTED:
            self.in_handshake = False
        if ev in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
            self.closed_in_handshake = 0

    def take_back(self) -> bool:
        """Whether the server came back after a loss since the last call (then the clients
        register again)."""
        self.watch()
        back, self.back = self.back, False
        return back

    def no_answer(self, timeout_s: float) -> ConfigError:
        """The error of a registration the server did not answer within timeout_s."""
        self.watch()
        if self.mismatch:
            return ConfigError(self._mismatch())
        if self.denied:
            return ConfigError(f"the server at {self.connect} refused this host at the handshake: "
                               "--join-key is not that run's key (or, with --secure, this key is "
                               "not allowed there)")
        return ConfigError(f"the server at {self.connect} did not answer within {timeout_s:.0f}s;"
                           " check --connect (address and port) and that the server runs")

    def unsendable(self, since: float) -> str:
        """Why a message that has found no connection to queue on since `since` is given up
        ('' while one may still come: the send is tried again): the server refused this
        host's handshake, or there has been no connection for lost_timeout."""
        self.watch()
        if self.denied or self.mismatch:
            return "the server refused this host at the handshake"
        if time.monotonic() - since > self.lost_timeout or self.gone():
            return f"no connection to the server for {self.lost_timeout:.0f}s"
        return ""

    def _mismatch(self) -> str:
        if self.secure and self.guessed:  # a CURVE server with another key closes it too
            return (f"the server at {self.connect} closed each handshake from this host "
                    f"({self.closed_in_handshake} in a row): either it does not run with --secure "
                    "(it is plaintext, its clients join with --join-key: drop --secure here, or "
                    "restart the server with --secure DIR), or this host's key folder is not "
                    "that run's (its server key differs: copy the run's folder here again)")
        if self.secure:
            return (f"the server at {self.connect} does not run with --secure (it is plaintext, "
                    "its clients join with --join-key): drop --secure here, or restart the "
                    "server with --secure DIR")
        return (f"the server at {self.connect} runs with --secure: give this host --secure DIR "
                "(its copy of the run's key folder; --key NAME if it holds several keys), not a join key")

    def abandoned(self, parent: int) -> bool:
        """Whether the process's clients must stop (logged): its launcher `parent` is gone (do
        not linger as an orphan), or the link has been down for longer than lost_timeout."""
        if os.getppid() != parent:
            log.error("%s: parent process exited; stopping", self.label)
            return True
        if self.gone():
            log.error("%s: lost the server at %s (no connection for %.0fs); stopping",
                      self.label, self.connect, self.lost_timeout)
            return True
        return False

    def gone(self) -> bool:
        """Whether the link has been down for longer than lost_timeout."""
        self.watch()
        return (self.lost_since is not None
                and time.monotonic() - self.lost_since > self.lost_timeout)

    def close(self, linger_ms: int = 2000) -> None:
        """Stop the monitor and close the socket (waiting briefly for queued messages)."""
        stop_monitor(self.sock, self.monitor)
        self.sock.close(linger=linger_ms)


def server_setup(keys: Any, gate: str | None) -> Callable[[zmq.Socket], None] | None:
    """How the link's socket is set up: a CURVE client of the server (--secure `keys`), a PLAIN
    client with the run's gate password (plaintext launch), or nothing (plaintext server)."""
    if keys is not None:
        from fednet.transport import security
        return lambda s: security.as_client(s, keys.server_public, keys)
    from fednet.transport.gate import client as gate_client
    return gate_client(gate) if gate is not None else None


class Credentials:
    """What a client process proves itself with, to the server and to its peers: the launch's
    run key (its ids' proofs, the hand-off key, the handshake gate of a plaintext launch) or
    the --secure key pair, and the context's handshake guard for the peer sockets (ZAP: under
    --secure it admits the run's client keys, which WELCOME names)."""

    def __init__(self, ctx: zmq.Context, secure: str, run_key: bytes | None, key_name: str,
                 curve: tuple[bytes, bytes] | None) -> None:
        self.run_key = run_key
        self.peer_key = peer_key(run_key) if run_key else None  # the run's hand-off key
        self.keys: Any = None  # --secure: this host's key pair (the server link, the peers)
        self.gate: str | None = None  # plaintext launch: the run's handshake password
        self.admitted: set[bytes] | None = None  # --secure: who the peer ports admit
        self.auth: Any = None
        if secure:
            from fednet.transport import security

            self.keys = security.load_keys(secure, need_server_secret=False, name=key_name,
                                           pair=curve)
            self.admitted = set()
            self.auth = security.start_authenticator(ctx, self.admitted)
        elif run_key:  # plaintext launch: only run-key holders complete a handshake
            self.gate = gate_password(run_key)
            self.auth = Gate(ctx, self.gate)

    def link(self, ctx: zmq.Context, connect: str, liveness: Liveness = DEFAULT,
             label: str = "", lost_timeout: float = 60.0,
             deliver: Deliver | None = None) -> ServerLink:
        """The process's server link, set up with these credentials (the rest: ServerLink)."""
        return ServerLink(ctx, connect, server_setup(self.keys, self.gate),
                          secure=self.keys is not None, liveness=liveness, label=label,
                          lost_timeout=lost_timeout, deliver=deliver)

    def admit(self, keys: list[str]) -> None:
        """--secure: the run's client keys (from WELCOME) may reach the peer ports."""
        if self.admitted is not None:
            self.admitted.update(k.encode() for k in keys)

    def stop(self) -> None:
        """Stop the handshake guard."""
        if self.auth is not None:
            self.auth.stop()
