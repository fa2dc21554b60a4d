"""The gate of a plaintext `fednet launch`: only holders of the run key complete a handshake.

Every socket of the run (the server's ROUTER, each client's peer ROUTER) is a ZeroMQ PLAIN
server, and every connection presents the run's gate password (proof.gate_password). A ZAP
handler (RFC 27) per context checks it, so a connection without the run key never completes a
handshake and never gets a routing id. That matters beyond authentication: libzmq 4.3.5 aborts
the whole process (an assertion in socket_base.cpp) when a ROUTER generates a routing id that a
peer already chose for itself, and a ROUTER accepts peer-chosen ids; behind the gate only the
run's own processes can choose one. PLAIN costs no throughput (nothing is encrypted); the
password travels in clear on loopback, as the run's models do (docs/cluster.md, threat model).

The handler is a few lines rather than pyzmq's general Authenticator: a registration storm of
10,000 clients is 10,000 ZAP requests, answered here without logging each one.
"""
from __future__ import annotations

import hmac
import itertools
import logging
import threading
from collections.abc import Callable

import zmq

from fednet.log import Throttle

log = logging.getLogger("fednet.security")
throttled = Throttle(log)

USER = b"fednet"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_ids = itertools.count()


class Gate:
    """The ZAP handler of one context: admits PLAIN handshakes with `password`, refuses every
    other (counted in `denied`, logged rate-limited). `stop()` ends its thread."""

    def __init__(self, ctx: zmq.Context, password: str) -> None:
        self.password, self.denied = password.encode(), 0
        self.sock = ctx.socket(zmq.REP)
        self.sock.linger = 0
        self.sock.bind(ZAP_ENDPOINT)  # before any PLAIN socket binds: none is ever unguarded
        self._stop_ep = f"inproc://fednet-gate-{next(_ids)}"
        self._stop_rx = ctx.socket(zmq.PAIR)
        self._stop_rx.bind(self._stop_ep)
        self._stop_tx = ctx.socket(zmq.PAIR)
        self._stop_tx.connect(self._stop_ep)
        self.thread = threading.Thread(target=self._serve, name="fednet-gate", daemon=True)
        self.thread.start()

    def admits(self, frames: list[bytes]) -> bool:
        """Whether a ZAP request is a PLAIN handshake with the run's user and password."""
        if len(frames) != 8 or frames[5] != b"PLAIN" or frames[6] != USER:
            return False
        return hmac.compare_digest(frames[7], self.password)

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._stop_rx, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_rx in ready:
                    return
                frames = self.sock.recv_multipart()
                ok = self.admits(frames)
                if not ok:
                    self.denied += 1
                    throttled.warning("refused a connection from %s without the run key (%d so "
                                      "far)", frames[3][:64] if len(frames) > 3 else b"?",
                                      self.denied)
                rid = frames[1] if len(frames) > 1 else b""
                self.sock.send_multipart([b"1.0", rid, b"200" if ok else b"400",
                                          b"OK" if ok else b"no run key", b"", b""])
        except zmq.ZMQError:  # the context is terminating
            return
        finally:
            self.sock.close(0)
            self._stop_rx.close(0)

    def stop(self) -> None:
        """End the handler's thread (idempotent)."""
        if self.thread.is_alive():
            try:
                self._stop_tx.send(b"")
            except zmq.ZMQError:
                pass
            self.thread.join(5)
        self._stop_tx.close(0)


def server(sock: zmq.Socket) -> None:
    """Make sock a PLAIN server (before bind): its context's Gate checks the password."""
    sock.plain_server = True


def client(password: str) -> Callable[[zmq.Socket], None]:
    """A socket setup that presents the run's gate password (before connect)."""
    def setup(sock: zmq.Socket) -> None:
        sock.plain_username = USER
        sock.plain_password = password.encode()
    return setup
