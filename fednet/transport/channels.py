"""ZeroMQ socket setup and message send/receive with decoding, accounting and rejection logging."""
from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from fednet.errors import ConfigError, ProtocolError
from fednet.metrics.accounting import Ledger
from fednet.protocol import DEFAULT_LIMITS, Message, decode, encode, frame_bytes, tensor_bytes

log = logging.getLogger("fednet.transport")


def _common(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.MAXMSGSIZE, DEFAULT_LIMITS.max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, 0)  # queues bounded by memory, not by a count that would drop
    sock.setsockopt(zmq.RCVHWM, 0)


def bind_router(ctx: zmq.Context, host: str, port: int, what: str = "--port",
                setup: Callable[[zmq.Socket], None] | None = None) -> tuple[zmq.Socket, str]:
    """A ROUTER bound on host:port (0 = any free port); returns (socket, actual endpoint).

    `setup(sock)` runs before bind (e.g. to make it a CURVE server)."""
    sock = ctx.socket(zmq.ROUTER)
    _common(sock)
    if setup is not None:
        setup(sock)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    addr = f"tcp://{host}:{port if port else '*'}"
    try:
        sock.bind(addr)
    except zmq.ZMQError as e:
        sock.close(0)
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"{what} {port} is already in use on {host}; choose another port, "
                              "or 0 for any free one") from None
        raise ConfigError(f"cannot listen on {addr}: {e.strerror}; check the host address") from None
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_dealer(ctx: zmq.Context, identity: str, endpoint: str,
                   setup: Callable[[zmq.Socket], None] | None = None) -> zmq.Socket:
    """A DEALER with a fixed identity connected to endpoint (`setup` runs before connect)."""
    sock = ctx.socket(zmq.DEALER)
    _common(sock)
    if setup is not None:
        setup(sock)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close(0)
        raise ConfigError(f"--connect '{endpoint}' is not a valid endpoint ({e.strerror}); "
                          "use tcp://HOST:PORT") from None
    return sock


class Rejects:
    """Counts malformed messages and logs the first per sender (then every 1000th)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def note(self, sender: str, err: Exception) -> None:
        """Record one rejected message from `sender`."""
        n = self.counts.get(sender, 0) + 1
        self.counts[sender] = n
        if n == 1 or n % 1000 == 0:
            log.warning("dropped a malformed message from %s (%d so far): %s", sender, n, err)

    @property
    def total(self) -> int:
        """All rejected messages."""
        return sum(self.counts.values())


class Channel:
    """Send and receive fednet Messages on one socket, recording each in a ledger."""

    def __init__(self, sock: zmq.Socket, ledger: Ledger, me: str, router: bool) -> None:
        self.sock, self.ledger, self.me, self.router = sock, ledger, me, router
        self.rejects = Rejects()

    def send(self, msg: Message, dst: str, track: bool = False) -> tuple[int, Any]:
        """Encode and send msg to dst (the identity on a ROUTER); returns (bytes, tracker)."""
        frames = encode(msg)
        h, p = frame_bytes(frames)
        parts: list[Any] = [dst.encode()] + frames if self.router else frames
        tracker = self.sock.send_multipart(parts, copy=False, track=track)
        self.ledger.record(msg.round, msg.kind.name, self.me, dst, h, p, tensor_bytes(msg))
        return h + p, tracker

    def recv(self) -> tuple[str, Message, int] | None:
        """Receive one message; returns (sender identity, message, bytes) or None if it was dropped."""
        parts = self.sock.recv_multipart(copy=False)
        ident = ""
        if self.router:
            ident = parts[0].bytes.decode("utf-8", "replace")
            parts = parts[1:]
        try:
            msg = decode(parts)
            if self.router and msg.sender != ident and not ident.startswith(msg.sender + "-"):
                raise ProtocolError(f"sender field '{msg.sender[:40]}' does not match the connection")
        except ProtocolError as e:
            self.rejects.note(ident or "server", e)
            return None
        h, p = frame_bytes(parts)
        self.ledger.record(msg.round, msg.kind.name, ident or msg.sender, self.me, h, p, tensor_bytes(msg))
        return ident or msg.sender, msg, h + p


def wait_readable(sock: zmq.Socket, timeout_s: float) -> bool:
    """True when sock has a message within timeout_s."""
    return bool(sock.poll(max(0, int(timeout_s * 1000)), zmq.POLLIN))


def monotonic_deadline(seconds: float) -> float:
    """time.monotonic() + seconds."""
    return time.monotonic() + seconds
