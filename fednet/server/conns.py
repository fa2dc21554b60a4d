"""Who is on which connection: client ids bound to proven connections, and liveness.

The server's ROUTER names every connection itself (clients set no identity); the clients of
one process share a connection, and each message's envelope says which of them it is for, so a
route here is the connection's id and the envelope (channels.Channel). A route becomes client
cid only through an accepted READY(hello) that proves the claim:
- under `fednet launch`: an HMAC over a fresh nonce with the client's secret (fednet.protocol.proof);
- under `--secure`: the CURVE public key that ZAP authenticated is one allowed to claim cid;
- plaintext `fednet server`: the same HMAC, with the secrets derived from its join key (the run
  key its remote clients hold: protocol/join_key.py); without any key (a server embedded with
  no join key) nothing can be proven and a claim is taken while no live connection holds that
  id (first come).
A proven client may take its id over from an older connection (a restart); nobody else can.
Connection losses come from the socket monitor (ZMTP heartbeats drop a silent peer within
seconds); a client whose connection stays lost past the grace time is reported gone.
"""
from __future__ import annotations

import ctypes
import hmac
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fednet.protocol.proof import check_hello, hellos_proof, rejoin_token
from fednet.transport.channels import SUB_BYTES, sub_frame

LOST_GRACE_S = 1.0
"""A client without a connection for this long (after the heartbeat timeout) is gone."""
CLOSED_KEPT = 100_000  # closed connections remembered (not clients: one per process)
"""Closed connections remembered, so that their queued messages revive none (a few MB)."""


@dataclass
class Identity:
    """How claims are proven in this run: the launcher's run key, the --secure keys' ids, or
    both (fednet launch --secure: each process proves its ids and holds its own key pair)."""

    run_key_secret: object | None = None  # callable cid -> secret (launch)
    key_ids: dict[str, object] = field(default_factory=dict)  # z85 key -> ids (--secure)
    grants: bytes = field(default_factory=lambda: os.urandom(32))  # derives the route grants
    process_secret: bytes | None = None  # launch: proves a process's id range (READY(hellos))
    needs: str = "the launcher's run key"  # what proves an id here (said to a refused client)

    @property
    def proven(self) -> bool:
        """Whether claims are checked at all."""
        return self.run_key_secret is not None or bool(self.key_ids)


class Connections:
    """Bindings between client ids and connections, and the connections' liveness."""

    def __init__(self, ident: Identity) -> None:
        self.ident = ident
        self.route_of: dict[int, bytes] = {}
        self.cid_of: dict[bytes, int] = {}
        self.key_of: dict[int, str] = {}
        self.released: dict[bytes, int] = {}  # connection -> its dead client (one per death)
        self.fd_routes: dict[int, set[bytes]] = {}  # a process's clients share a connection
        self.route_fd: dict[bytes, int] = {}
        self.lost: dict[int, float] = {}
        # connections that closed (the newest CLOSED_KEPT), by the connection's own id: one
        # record for all its clients' routes (route = connection id + channels.sub_frame)
        self.closed: OrderedDict[bytes, None] = OrderedDict()
        self.nonces: set[tuple[int, bytes]] = set()
        self._closed_since_trim = 0
        self._last_close = 0.0
        self.binds = 0  # bindings made so far (a client that came again changes the roster)

    def seen(self, route: bytes, fd: int) -> None:
        """A message arrived on connection `route` through socket fd. One that libzmq queued
        before the connection closed (the monitor's event was read first) revives nothing: the
        route is closed for good (a ROUTER never gives a new connection an old id)."""
        if _conn(route) in self.closed:
            return
        if fd >= 0 and self.route_fd.get(route) != fd:
            self.route_fd[route] = fd
            self.fd_routes.setdefault(fd, set()).add(route)
        cid = self.cid_of.get(route)
        if cid is not None:
            self.lost.pop(cid, None)

    def check_claim(self, cid: int, route: bytes, key: str | None, nonce: bytes | None,
                    proof: bytes | None, token: bytes | None = None) -> str:
        """Why connection `route` may not be client cid ('' when it may): its proof (the run
        key's HMAC, its --secure key), then no other live connection may hold cid (a second
        host claiming live ids is refused, named). `token`: the one its WELCOME gave
        (proof.rejoin_token): a reconnect of the welcomed client takes its id over even before
        the old connection is seen to close."""
        why = self._proof(cid, key, nonce, proof)
        if why:
            return why
        held = self.route_of.get(cid)
        if held is not None and held != route and cid not in self.lost and not (
                token is not None and hmac.compare_digest(token, self.token(cid))):
            return f"client {cid} is already connected"
        return ""

    def _proof(self, cid: int, key: str | None, nonce: bytes | None, proof: bytes | None
               ) -> str:
        """Why a hello does not prove client cid ('' when it does, or when nothing is proven)."""
        ident = self.ident
        if ident.run_key_secret is not None:
            if nonce is None or proof is None:
                return f"identity not proven (this run needs {ident.needs})"
            if (cid, nonce) in self.nonces:
                return "identity proof replayed"
            if not check_hello(ident.run_key_secret(cid), cid, nonce, proof):  # type: ignore[operator]
                return "identity proof is wrong"
            self.nonces.add((cid, nonce))
        if ident.key_ids:  # --secure: the key must list the id
            ids = ident.key_ids.get(key or "")
            if ids is None:
                return "this key is not allowed"
            if cid not in ids:  # type: ignore[operator]
                return f"this key may not claim client {cid}"
        return ""

    def check_batch(self, cids: list[int], base: bytes, key: str | None, nonce: bytes | None,
                    proof: bytes | None, cids_bytes: bytes) -> str:
        """Why connection `base` may not be all of clients `cids` ('' when it may): the process's
        proof over the ids (launch), its key's allowed ids (--secure), then ids no other live
        connection holds (each on its own envelope: channels.sub_frame)."""
        ident = self.ident
        if ident.run_key_secret is not None:
            if nonce is None or proof is None or ident.process_secret is None:
                return f"identity not proven (this run needs {ident.needs})"
            if (-1, nonce) in self.nonces:
                return "identity proof replayed"
            if not hmac.compare_digest(hellos_proof(ident.process_secret, cids_bytes, nonce),
                                       proof):
                return "identity proof is wrong"
            self.nonces.add((-1, nonce))
        if ident.key_ids:
            ids = ident.key_ids.get(key or "")
            if ids is None:
                return "this key is not allowed"
            bad = next((c for c in cids if c not in ids), None)  # type: ignore[operator]
            if bad is not None:
                return f"this key may not claim client {bad}"
        for c in cids:
            held = self.route_of.get(c)
            if held is not None and held != base + sub_frame(c) and c not in self.lost:
                return f"client {c} is already connected"
        return ""

    def token(self, cid: int) -> bytes:
        """Client cid's rejoin token (derived, so nothing is stored per client)."""
        return rejoin_token(self.ident.grants, cid)

    def bind(self, cid: int, route: bytes, key: str | None) -> None:
        """Connection `route` is client cid from now on (any older binding of either ends)."""
        old = self.route_of.get(cid)
        if old is not None and old != route:
            self.cid_of.pop(old, None)
        prev = self.cid_of.get(route)
        if prev is not None and prev != cid:
            self.route_of.pop(prev, None)
        self.route_of[cid] = route
        self.cid_of[route] = cid
        self.binds += 1
        self.released.pop(route, None)
        if key:
            self.key_of[cid] = key
        if _conn(route) in self.closed:  # a hello queued before its connection closed: lost
            self.lost.setdefault(cid, time.monotonic())
        else:
            self.lost.pop(cid, None)

    def bind_batch(self, cids: list[int], routes: list[bytes], key: str | None, fd: int
                   ) -> None:
        """seen(route, fd) and bind(cid, route, key) for each of a process's clients, in bulk
        when none of them holds a binding, a loss or a release and the connection is open (a
        first registration: a million bound in ~0.3 s, one by one ~2.5 s); else one by one."""
        fresh = (_conn(routes[0]) not in self.closed and self.route_of.keys().isdisjoint(cids)
                 and self.cid_of.keys().isdisjoint(routes) and self.lost.keys().isdisjoint(cids)
                 and self.released.keys().isdisjoint(routes))
        if not fresh:
            for cid, route in zip(cids, routes):
                self.seen(route, fd)
                self.bind(cid, route, key)
            return
        if fd >= 0:
            self.route_fd.update(dict.fromkeys(routes, fd))
            self.fd_routes.setdefault(fd, set()).update(routes)
        self.route_of.update(zip(cids, routes))
        self.cid_of.update(zip(routes, cids))
        if key:
            self.key_of.update(dict.fromkeys(cids, key))
        self.binds += len(cids)

    def release(self, cid: int) -> None:
        """Client cid is dead: its id is no longer bound to any connection."""
        route = self.route_of.pop(cid, None)
        if route is not None and self.cid_of.get(route) == cid:
            del self.cid_of[route]
            self.released[route] = cid  # a BYE it queued before it exited may still arrive
        self.lost.pop(cid, None)

    def disconnected(self, fd: int) -> None:
        """The socket monitor saw connection fd close (every client on it is lost)."""
        self._closed_since_trim += 1
        self._last_close = now = time.monotonic()
        routes = self.fd_routes.pop(fd, ())
        for conn in dict.fromkeys(_conn(r) for r in routes):  # one, for a process's clients
            self.closed[conn] = None
            if len(self.closed) > CLOSED_KEPT:
                self.closed.popitem(last=False)  # O(1): a dict's first key, once its
                # predecessors were deleted, is found by a scan over their slots (quadratic)
        route_fd, cid_of, route_of, lost = self.route_fd, self.cid_of, self.route_of, self.lost
        for route in routes:  # (the process's end at a million clients: ~1.3 s, once per route)
            route_fd.pop(route, None)
            cid = cid_of.get(route)
            if cid is not None and route_of.get(cid) == route:
                lost.setdefault(cid, now)

    def gone(self, grace_s: float = LOST_GRACE_S) -> list[int]:
        """Clients whose connection has been lost for longer than grace_s."""
        now = time.monotonic()
        out = []
        for c, t in self.lost.items():  # in the order they were lost: every entry is made
            if now - t <= grace_s:     # with the time it is made (setdefault), so the rest
                break                  # are younger (a scan of every lost client per poll
            out.append(c)              # was O(population) at a million-client run's end)
        return out

    def trim_memory(self) -> None:
        """Give freed memory back once a burst of closed connections is over (libzmq frees the
        buffers of half-open connections, but glibc keeps the pages until asked)."""
        if self._closed_since_trim < 50 or time.monotonic() - self._last_close < 0.5:
            return
        self._closed_since_trim = 0
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def _conn(route: bytes) -> bytes:
    """The connection of a client's route (the server's ROUTER is enveloped: channels.py)."""
    return route[:-SUB_BYTES]


def identity_for(cfg: Any, local_clients: bool, per_process: int = 1, join_key: str = ""
                 ) -> tuple[Identity, dict[str, Any]]:
    """How clients prove their ids in this run, and what the launcher hands its clients.

    `fednet launch` draws a run key and gives it to the zygote (never to a socket): each client
    proves its id with a secret derived from it. Plaintext `fednet server` keeps its run key in
    the join key file `join_key` (protocol/join_key.py), which its remote clients hold. With
    --secure, launch also issues one CURVE key pair per client process; `fednet server --secure`
    binds ids to the keys in DIR/allowed/."""
    import zmq

    from fednet.errors import ConfigError
    from fednet.protocol import join_key as join
    from fednet.protocol.proof import client_secret, new_run_key, process_secret

    ident = Identity()
    specs: dict[str, Any] = {}
    run_key = new_run_key() if local_clients else \
        join.ensure(join_key) if join_key and not cfg.net.secure else None
    if not local_clients:
        ident.needs = "its join key: fednet clients --join-key FILE"
    if run_key is not None:
        specs["run_key"] = run_key
        ident.run_key_secret = lambda cid: client_secret(run_key, cid)
        ident.process_secret = process_secret(run_key)
    if cfg.net.secure:
        from fednet.transport import security

        keys = security.load_keys(cfg.net.secure, need_server_secret=True)
        ident.key_ids = dict(keys.allowed)
        if local_clients:
            k = max(1, per_process)
            pairs = [zmq.curve_keypair() for _ in range(0, cfg.clients, k)]
            specs["curve_pairs"] = [(p.decode(), s.decode()) for p, s in pairs]
            for i, (pub, _sec) in enumerate(pairs):
                ident.key_ids[pub.decode()] = frozenset(range(i * k, min(cfg.clients, (i + 1) * k)))
        elif not ident.key_ids:
            raise ConfigError(f"--secure {cfg.net.secure}: no client key is allowed yet; issue "
                              f"one per client host with `fednet keys add {cfg.net.secure} NAME "
                              "--ids 0-49`")
    return ident, specs
