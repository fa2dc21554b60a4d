"""ZeroMQ socket setup and message send/receive with decoding, accounting and rejection logging."""
from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import zmq

from fednet.config.liveness import DEFAULT as LIVENESS, Liveness
from fednet.errors import ConfigError, ProtocolError
from fednet.log import Throttle
from fednet.metrics.accounting import Ledger
from fednet.protocol.kinds import CHUNK_BYTES
from fednet.protocol import (DEFAULT_LIMITS, Message, MsgKind, decode, encode, frame_bytes,
                             peek_kind, stage_of, tensor_bytes)

log = logging.getLogger("fednet.transport")


ROUTER_HWM = 1000            # messages queued per connection on a ROUTER before sends are dropped
PONGS_PER_S = 1000           # a server's heartbeat upkeep: about this many pings answered a second


# The liveness timers (heartbeats, timeouts, handshakes) are settings: config/liveness.Liveness
# (`live` below; LIVENESS: the defaults).


def server_heartbeat_ms(clients: int, live: Liveness = LIVENESS) -> int:
    """The server's ping interval for a run of `clients` connections: live.heartbeat_ms (1 s)
    up to 1,000, then growing with the population so that about PONGS_PER_S pongs arrive a
    second.

    libzmq (4.3.5) cancels a connection's heartbeat timer, on every message that arrives, with
    a linear scan of its I/O thread's timers, one or two per connection: at a fixed interval the
    upkeep grows as C^2 (0.88 cores for 10,000 idle connections, as issue 22 measured), and
    on a busy machine late pongs dropped connections, whose clients registered again: a storm.
    At this interval it grows as C (10,000 clients: a ping every 10 s, and a frozen client is
    dropped 12 s after the ping it did not answer, within about 22 s). At most 10 s: the
    clients of a process share one connection, so a large population has few connections."""
    return live.heartbeat_ms * min(10, max(1, -(-int(clients) // PONGS_PER_S)))


def server_handshake_ms(clients: int, live: Liveness = LIVENESS) -> int:
    """How long the server's ROUTER waits for a connection's handshake: live.handshake_ms, and
    1 ms more per client beyond 5,000 (all of a large population connects at once, and
    libzmq's I/O threads handshake them one after another)."""
    return live.handshake_ms + max(0, int(clients) - 5000)


MAX_FRAME_BYTES = DEFAULT_LIMITS.max_header_bytes + CHUNK_BYTES
"""The largest frame fednet sends: a header (at most 1 MiB) or a piece of an array (256 KiB;
codec.py splits bigger ones), with room to spare. libzmq allocates a frame's buffer as its size
is announced and drops a connection announcing more than this (was 2 GiB)."""


def _common(sock: zmq.Socket, heartbeat_ms: int, handshake_ms: int, timeout_ms: int) -> None:
    """Options of every fednet socket; `heartbeat_ms` 0: this socket sends no pings (it still
    answers its peer's); `timeout_ms`: how long after a ping an answer may take."""
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)  # one frame: a peer announcing more is cut
    sock.setsockopt(zmq.SNDHWM, 0)  # queues bounded by memory, not by a count that would drop
    sock.setsockopt(zmq.RCVHWM, 0)
    # liveness: a peer that is frozen or cut off (TCP still up, nobody answering) is dropped
    # within seconds, and so is a half-open connection that never finishes a frame
    if heartbeat_ms:
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
        # no TTL: each side trusts its own pings. A TTL asks the peer to drop the connection
        # after that much silence; a server busy with 19,000 handshakes dropped the links
        # that set one (the one heartbeating link of each client process)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 0)
    sock.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms)


SERVER_IO_THREADS = min(2, os.cpu_count() or 1)
"""ZeroMQ I/O threads of a server's context: a ROUTER spreads its connections over them, so the
kernel's socket copies of a round's models (the server sends and receives them all) run on two
cores (docs/benchmarks/history.md section 15)."""


def server_context() -> zmq.Context:
    """The server's zmq context (SERVER_IO_THREADS I/O threads)."""
    return zmq.Context(io_threads=SERVER_IO_THREADS)


def bind_router(ctx: zmq.Context, host: str, port: int, what: str = "--port",
                setup: Callable[[zmq.Socket], None] | None = None,
                heartbeat_ms: int | None = None, handshake_ms: int | None = None,
                hwm: int = ROUTER_HWM, live: Liveness = LIVENESS) -> tuple[zmq.Socket, str]:
    """A ROUTER bound on host:port (0 = any free port); returns (socket, actual endpoint).

    `setup(sock)` runs before bind (e.g. to make it a CURVE server); `heartbeat_ms` and
    `handshake_ms`: its ping interval and handshake timeout (None: `live`'s; a server's:
    server_heartbeat_ms, server_handshake_ms), a ping's answer due live.heartbeat_timeout_ms
    after it (plus what the interval adds to live.heartbeat_ms); `hwm`: messages queued per
    connection each way (a server's: room for two messages of every client, since a process's
    clients share a connection)."""
    sock = ctx.socket(zmq.ROUTER)
    ivl = live.heartbeat_ms if heartbeat_ms is None else heartbeat_ms
    _common(sock, ivl, live.handshake_ms if handshake_ms is None else handshake_ms,
            live.heartbeat_timeout_ms + ivl - live.heartbeat_ms)
    if setup is not None:
        setup(sock)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # a ROUTER names each connection itself (clients set no identity): a claimed id is bound
    # to a connection only after it is proven, and no one can take a connection over
    sock.setsockopt(zmq.SNDHWM, hwm)  # a peer that never reads costs at most this many
    sock.setsockopt(zmq.RCVHWM, hwm)  # one flooding connection is throttled, not queued (a
    # full queue stops reading the connection, its heartbeats too: a process's clients' replies
    # must fit, or a busy server looks dead to them)
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


def connect_dealer(ctx: zmq.Context, endpoint: str,
                   setup: Callable[[zmq.Socket], None] | None = None,
                   heartbeat: bool = True, live: Liveness = LIVENESS,
                   send_timeout_ms: int | None = None) -> zmq.Socket:
    """A DEALER connected to endpoint (`setup` runs before connect). It sets no identity: the
    ROUTER it talks to names the connection, and the sender proves who it is in the messages.
    heartbeat=False: it sends no pings of its own (the logical clients of one process share one
    link that does: client/host.py). `live`: its timers (ping interval, link timeout,
    handshake); a send that finds no connection for send_timeout_ms (None: the link timeout)
    raises zmq.Again."""
    sock = ctx.socket(zmq.DEALER)
    _common(sock, live.heartbeat_ms if heartbeat else 0, live.connect_handshake_ms,
            live.link_timeout_ms)
    # a send finds no connection to queue on (its queue is unbounded: _common) only while it has
    # none: after a refused handshake, libzmq drops the pipe until a reconnect. Without a bound
    # such a send waited forever; with it, it raises zmq.Again and the caller decides
    sock.setsockopt(zmq.SNDTIMEO, live.link_timeout_ms if send_timeout_ms is None
                    else send_timeout_ms)
    if setup is not None:
        setup(sock)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, live.reconnect_max_ms)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close(0)
        raise ConfigError(f"--connect '{endpoint}' is not a valid endpoint ({e.strerror}); "
                          "use tcp://HOST:PORT") from None
    return sock


class Rejects:
    """Counts rejected messages per sender (the bytes go to the ledger) and logs them, at most
    20 lines a second in all (log.Throttle): a known sender's first, then every 1000th; the
    messages of connections that hold no client id (`known` False: a flood of fresh names or
    random envelopes) share one line, their first, then one every UNKNOWN_EVERY_S seconds with
    the count since."""

    __slots__ = ("counts", "unknown", "_unknown_logged", "_unknown_at")
    _log = Throttle(log)  # one for the process: its clients' rejections share the 20 lines/s
    UNKNOWN_EVERY_S = 10.0

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.unknown = 0  # messages from connections that hold no client id
        self._unknown_logged, self._unknown_at = 0, -1e9

    def note(self, sender: str, err: Exception | str, known: bool = True) -> None:
        """Record one rejected message from `sender`."""
        if not known:
            return self._note_unknown(sender, err)
        if len(self.counts) < 10_000 or sender in self.counts:
            n = self.counts[sender] = self.counts.get(sender, 0) + 1
        else:  # a flood of fresh connection names: one bucket, bounded memory
            n = self.counts["(others)"] = self.counts.get("(others)", 0) + 1
        if n == 1 or n % 1000 == 0:
            self._log.warning("dropped a message from %s (%d so far): %s", sender[:40], n, err)
        return None

    def _note_unknown(self, sender: str, err: Exception | str) -> None:
        import time

        self.unknown += 1
        now = time.monotonic()
        if self.unknown == 1 or now - self._unknown_at >= self.UNKNOWN_EVERY_S:
            since = self.unknown - self._unknown_logged
            self._log.warning("dropped %d message(s) from connections that hold no client id "
                              "(%d in all; the last from %s: %s)", since, self.unknown,
                              sender[:40], err)
            self._unknown_logged, self._unknown_at = self.unknown, now

    @property
    def total(self) -> int:
        """All rejected messages."""
        return sum(self.counts.values()) + self.unknown


class Received:
    """One decoded message as it arrived, not yet accounted: accept() or reject() it."""

    __slots__ = ("route", "msg", "nbytes", "header", "payload", "frame")

    def __init__(self, route: bytes, msg: Message, header: int, payload: int, frame: Any) -> None:
        self.route, self.msg = route, msg
        self.header, self.payload, self.nbytes = header, payload, header + payload
        self.frame = frame  # the header frame: connection properties (fd, User-Id)

    def prop(self, name: str) -> str | None:
        """A connection property of the message ('User-Id' under CURVE), None if absent."""
        try:
            return self.frame.get(name)
        except (zmq.ZMQError, AttributeError, UnicodeDecodeError):
            return None

    @property
    def fd(self) -> int:
        """The file descriptor of the connection it came on (-1 if unknown)."""
        try:
            return int(self.frame.get(zmq.SRCFD))
        except (zmq.ZMQError, AttributeError, ValueError):
            return -1


class Deferred(NamedTuple):
    """A message as it arrived, not decoded yet (Channel.recv with `defer`)."""

    route: bytes
    parts: list[Any]
    who: str


SUB_BYTES = 4  # the envelope of the server link: which client of the connection (uint32)


_SUB = struct.Struct("<I")


def sub_frame(cid: int) -> bytes:
    """The envelope frame of client cid's messages on its process's server link."""
    return _SUB.pack(cid)


def sub_frames(cids: np.ndarray) -> list[bytes]:
    """sub_frame of each of `cids` (int64, each below 2**32), packed in one call."""
    b = cids.astype("<u4").tobytes()
    return [b[i:i + SUB_BYTES] for i in range(0, len(b), SUB_BYTES)]


class Channel:
    """Send and receive fednet Messages on one socket. A sent message is recorded in the
    ledger; a received one only when the caller accepts it, and rejected ones apart.

    The server link is shared by the clients of a process: every message on it starts with an
    envelope frame naming the client (sub_frame). `sub`: the envelope this DEALER's messages
    carry; `enveloped`: this ROUTER's messages carry one, and their route is the connection's
    id followed by the envelope (one route per client of a connection). The envelope, like the
    ROUTER's connection id, is routing: the ledger does not count it."""

    __slots__ = ("sock", "ledger", "me", "router", "sub", "enveloped", "rejects", "dropped_sends",
                 "refused", "known")

    def __init__(self, sock: zmq.Socket, ledger: Ledger, me: str, router: bool,
                 sub: bytes | None = None, enveloped: bool = False) -> None:
        self.sock, self.ledger, self.me, self.router = sock, ledger, me, router
        self.sub, self.enveloped = sub, enveloped
        self.rejects = Rejects()
        self.dropped_sends = 0
        # the last message recv() refused: (route, the kind its header names or None, why)
        self.refused: tuple[bytes, MsgKind | None, str] | None = None
        # whether a route holds a client id (the server's bindings): the log names such senders
        # one by one, and lumps the others together (Rejects)
        self.known: Callable[[bytes], bool] = lambda route: True

    def name(self, route: bytes) -> str:
        """A sender as the rejection log names it: its connection (not the envelope it chose:
        random envelopes on one connection are one sender)."""
        conn = route[:-SUB_BYTES] if self.enveloped and len(route) > SUB_BYTES else route
        return _route_name(conn)

    def send(self, msg: Message, dst: str, route: bytes | None = None, track: bool = False,
             block: bool = True) -> tuple[int, Any]:
        """Encode and send msg to dst (on a ROUTER: to the connection `route`); returns
        (bytes, tracker). block=False raises zmq.Again when the connection's queue is full."""
        frames = encode(msg)
        h, p = frame_bytes(frames)
        if self.router:
            to = route if route is not None else dst.encode()
            head = [to[:-SUB_BYTES], to[-SUB_BYTES:]] if self.enveloped else [to]
            parts: list[Any] = head + frames
        else:
            parts = frames if self.sub is None else [self.sub] + frames
        tracker = self.sock.send_multipart(parts, copy=False, track=track,
                                           flags=0 if block else zmq.NOBLOCK)
        self.ledger.record(msg.round, msg.kind.name, self.me, dst, h, p, tensor_bytes(msg),
                           stage_of(msg))
        return h + p, tracker

    def recv(self, who: str = "", defer: frozenset[MsgKind] = frozenset(),
             admit: Callable[[bytes, list[Any]], str] | None = None
             ) -> Received | Deferred | None:
        """Receive one message; None when it could not be decoded or was not admitted (counted
        as rejected; `refused` says which and why). `admit(route, frames)`: why a message may
        not be read at all ('' when it may), asked before any of its arrays is joined (a
        sender the server cannot place costs no copy). A message whose header names a kind
        in `defer` comes back undecoded (Deferred): finish() decodes it when it is needed, so
        its arrays are joined into memory only then."""
        parts = self.sock.recv_multipart(copy=False)
        self.refused = None
        route = b""
        if self.router:
            route = parts[0].bytes
            parts = parts[1:]
        if self.enveloped or self.sub is not None:
            if len(parts) < 2 or len(parts[0]) != SUB_BYTES:  # no envelope: nobody's message
                self._refuse(route, parts, who, None, "no client envelope")
                return None
            route = route + parts[0].bytes if self.enveloped else route
            parts = parts[1:]
        why = admit(route, parts) if admit is not None else ""
        if why:
            self._refuse(route, parts, who, peek_kind(parts), why)
            return None
        d = Deferred(route, parts, who)
        if defer and peek_kind(parts) in defer:
            return d
        return self.finish(d)

    def received(self, who: str = "",
                 admit: Callable[[bytes, list[Any]], str] | None = None) -> Received | None:
        """recv with nothing deferred: the decoded message, or None (not decoded or admitted)."""
        got = self.recv(who, admit=admit)
        assert not isinstance(got, Deferred)  # (no kind deferred)
        return got

    def _refuse(self, route: bytes, parts: list[Any], who: str, kind: MsgKind | None,
                why: str) -> None:
        self.rejects.note(who or self.name(route) or "server", why, self.known(route))
        self.ledger.reject(sum(len(f) for f in parts))
        self.refused = (route, kind, why)

    def finish(self, d: Deferred) -> Received | None:
        """Decode a received message; None when it cannot be (counted as rejected)."""
        h, p = frame_bytes(d.parts)
        try:  # release: each array frame is freed as soon as it is joined (one copy, not two)
            msg = decode(d.parts, release=True)
        except ProtocolError as e:
            self.rejects.note(d.who or self.name(d.route) or "server", e, self.known(d.route))
            self.ledger.reject(h + p)
            self.refused = (d.route, peek_kind(d.parts), str(e))
            return None
        return Received(d.route, msg, h, p, d.parts[0] if d.parts else None)

    def accept(self, got: Received, src: str) -> None:
        """Count an accepted message in the ledger, as sent by `src`."""
        m = got.msg
        self.ledger.record(m.round, m.kind.name, src, self.me, got.header, got.payload,
                           tensor_bytes(m), stage_of(m))

    def reject(self, got: Received, why: str, who: str = "") -> None:
        """Count a decoded message that is refused (wrong sender, stale, not expected)."""
        self.rejects.note(who or self.name(got.route) or got.msg.sender, why,
                          self.known(got.route))
        self.ledger.reject(got.nbytes)


def _route_name(route: bytes) -> str:
    return route.hex() if route else ""
