"""Who is on which connection: client ids bound to proven connections, and liveness.

The server's ROUTER names every connection itself (clients set no identity); the clients of
one process share a connection, and each message's envelope says which of them it is for, so a
route here is the connection's id and the envelope (channels.Channel). A route becomes client
cid only through an accepted READY(hellos) that proves the claim (of one id, or a process's):
- under `fednet launch`: an HMAC over the ids and a fresh nonce with the processes' secret
  (fednet.protocol.proof);
- under `--secure`: the CURVE public key that ZAP authenticated is one allowed to claim cid;
- plaintext `fednet server`: the same HMAC, with the secrets derived from its join key (the run
  key its remote clients hold: protocol/join_key.py); without any key (a server embedded with
  no join key) nothing can be proven and a claim is taken while no live connection holds that
  id (first come).
A proven client may take its id over from an older connection (a restart); nobody else can. A
reconnect that brings its old connection's rejoin token (from its WELCOME) takes the ids that
connection held over at once, before the server sees the old connection close.
Connection losses come from the socket monitor (ZMTP heartbeats drop a silent peer within
seconds); a client whose connection stays lost past the grace time (config/liveness.py) is
reported gone.
"""
from __future__ import annotations

import ctypes
import hmac
import math
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednet.protocol.proof import hellos_proof, rejoin_token
from fednet.transport.channels import SUB_BYTES, sub_frame
from fednet.config import RunConfig

CLOSED_KEPT = 100_000  # closed connections remembered (not clients: one per process)
"""Closed connections remembered, so that their queued messages revive none (a few MB)."""


@dataclass
class Identity:
    """How claims are proven in this run: the launcher's run key, the --secure keys' ids, or
    both (fednet launch --secure: each process proves its ids and holds its own key pair)."""

    key_ids: dict[str, frozenset[int]] = field(default_factory=dict)  # z85 key -> ids (--secure)
    grants: bytes = field(default_factory=lambda: os.urandom(32))  # derives the route grants
    process_secret: bytes | None = None  # launch, join key: proves a process's ids (READY(hellos))
    needs: str = "the launcher's run key"  # what proves an id here (said to a refused client)

    @property
    def proven(self) -> bool:
        """Whether claims are checked at all."""
        return self.process_secret is not None or bool(self.key_ids)


class Link:
    """One connection: a client process's (its clients each on their own envelope) or a lone
    client's. Its liveness is the connection's: a close loses every client bound to it."""

    __slots__ = ("conn", "slot", "key", "info", "token")

    def __init__(self, conn: bytes, slot: int, key: str | None, token: bytes) -> None:
        self.conn, self.slot, self.key = conn, slot, key
        self.info: dict[str, Any] | None = None  # its process's hello (device, pid, host)
        self.token = token  # what its WELCOME gives, to prove a reconnect (proof.rejoin_token)


class Connections:
    """Bindings between client ids and connections, and the connections' liveness.

    One record per connection (Link) and one int32 per client id of the run (`slot`: the link
    it is bound to, -1 none, -2 - s: released from link s), so ten million clients of 16
    processes cost 40 MB here, not the ~300 B a client that per-route maps took. A client's
    route is its link's connection id and its envelope (channels.sub_frame): derived, not
    stored."""

    def __init__(self, ident: Identity, clients: int) -> None:
        self.ident = ident
        self.slot = np.full(max(clients, 0), -1, np.int32)
        self.links: list[Link] = []
        self.slot_of: dict[bytes, int] = {}  # connection -> its link
        self.fd_of: dict[bytes, int] = {}  # connection -> the socket fd it was seen on
        self.on_fd: dict[int, set[bytes]] = {}  # fd -> connections seen on it
        self.lost: dict[int, float] = {}  # link slot -> when it was lost (in that order)
        # connections that closed (the newest CLOSED_KEPT), by the connection's own id: one
        # record for all its clients' routes (route = connection id + channels.sub_frame)
        self.closed: OrderedDict[bytes, None] = OrderedDict()
        self.nonces: set[bytes] = set()
        self._closed_since_trim = 0
        self._last_close = 0.0
        self.binds = 0  # bindings made so far (a client that came again changes the roster)
        self._asked_at: float | None = None  # the last call of gone()
        self._settle_until = 0.0  # after a stall of this server: no client is gone before

    # ---- reads ----------------------------------------------------------------------------
    def link_of(self, cid: int) -> Link | None:
        """The link client cid is bound to, if any."""
        s = int(self.slot[cid]) if 0 <= cid < self.slot.size else -1
        return self.links[s] if s >= 0 else None

    def route_of(self, cid: int) -> bytes | None:
        """Client cid's route (its connection and envelope), None when it is not bound."""
        link = self.link_of(cid)
        return None if link is None else link.conn + sub_frame(cid)

    def cid_of(self, route: bytes) -> int | None:
        """The client bound to `route`, if any (its envelope names it, its link must match)."""
        cid = _cid(route, self.slot.size)
        if cid is None:
            return None
        s = int(self.slot[cid])
        return cid if s >= 0 and self.links[s].conn == route[:-SUB_BYTES] else None

    def knows(self, route: bytes) -> bool:
        """Whether a client is bound to `route`."""
        return self.cid_of(route) is not None

    def released_cid(self, route: bytes) -> int | None:
        """The client released from `route` (it died; a BYE it queued may still arrive)."""
        cid = _cid(route, self.slot.size)
        if cid is None:
            return None
        s = -2 - int(self.slot[cid])
        return cid if s >= 0 and self.links[s].conn == route[:-SUB_BYTES] else None

    def key_of(self, cid: int) -> str:
        """The --secure key client cid's connection was authenticated with ('' if none)."""
        link = self.link_of(cid)
        return (link.key or "") if link is not None else ""

    def is_lost(self, cid: int) -> bool:
        """Whether client cid is bound to a connection that was lost."""
        link = self.link_of(cid)
        return link is not None and link.slot in self.lost

    def ids_on(self, slot: int) -> np.ndarray:
        """The ids bound to link `slot` now (int64, ascending)."""
        return np.flatnonzero(self.slot == slot)

    def lost_ids(self) -> np.ndarray:
        """Every id bound to a lost connection."""
        if not self.lost:
            return np.zeros(0, np.int64)
        return np.flatnonzero(np.isin(self.slot, np.fromiter(self.lost, np.int32)))

    def groups(self, cids: np.ndarray) -> list[np.ndarray]:
        """`cids` (ascending) grouped by the link they are bound to (one message per process);
        an unbound id is a group of its own."""
        s = self.slot[cids]
        out = [cids[s == u] for u in np.unique(s[s >= 0]).tolist()]
        return out + [cids[i:i + 1] for i in np.flatnonzero(s < 0).tolist()]

    # ---- proofs -------------------------------------------------------------------------------
    def _held(self, cids: np.ndarray, conn: bytes, token: bytes | None) -> str:
        """'client N is already connected' when another live connection holds one of `cids`
        and `token` is not its rejoin token (a reconnect of the process it welcomed)."""
        s = self.slot[cids]
        held = [u for u in np.unique(s[s >= 0]).tolist()
                if self.links[u].conn != conn and u not in self.lost
                and not (token is not None and hmac.compare_digest(token, self.links[u].token))]
        if held:
            return f"client {int(cids[np.isin(s, held)][0])} is already connected"
        return ""

    def check_claim(self, cids: np.ndarray, base: bytes, key: str | None, nonce: bytes | None,
                    proof: bytes | None, token: bytes | None = None) -> str:
        """Why connection `base` may not be all of clients `cids` ('' when it may): the process's
        proof over the ids (launch), its key's allowed ids (--secure), then ids no other live
        connection holds (each on its own envelope: channels.sub_frame) unless `token` is
        that connection's."""
        ident = self.ident
        if ident.process_secret is not None:
            if nonce is None or proof is None:
                return f"identity not proven (this run needs {ident.needs})"
            if nonce in self.nonces:
                return "identity proof replayed"
            if not hmac.compare_digest(hellos_proof(ident.process_secret, cids.tobytes(), nonce),
                                       proof):
                return "identity proof is wrong"
            self.nonces.add(nonce)
        if ident.key_ids:
            ids = ident.key_ids.get(key or "")
            if ids is None:
                return "this key is not allowed"
            bad = next((c for c in cids.tolist() if c not in ids), None)
            if bad is not None:
                return f"this key may not claim client {bad}"
        return self._held(cids, base, token)

    def token(self, cid: int) -> bytes:
        """The rejoin token of the connection client cid is bound to (derived from the
        connection's id when its Link was made)."""
        link = self.link_of(cid)
        assert link is not None, "a token for a client bound to no connection"
        return link.token

    # ---- writes ---------------------------------------------------------------------------
    def seen(self, route: bytes, fd: int) -> None:
        """A message arrived on connection `route` through socket fd: the connection is alive.
        One that libzmq queued before the connection closed (the monitor's event was read first)
        revives nothing: the route is closed for good (a ROUTER never gives a new connection an
        old id)."""
        conn = route[:-SUB_BYTES]
        if conn in self.closed:
            return
        if fd >= 0 and self.fd_of.get(conn) != fd:
            self.fd_of[conn] = fd
            self.on_fd.setdefault(fd, set()).add(conn)
        s = self.slot_of.get(conn)
        if s is not None:
            self.lost.pop(s, None)

    def _link(self, conn: bytes, key: str | None) -> Link:
        s = self.slot_of.get(conn)
        if s is None:
            s = self.slot_of[conn] = len(self.links)
            self.links.append(Link(conn, s, key, rejoin_token(self.ident.grants, conn)))
        link = self.links[s]
        if key:
            link.key = key
        if conn in self.closed:  # a hello queued before its connection closed: lost
            self.lost.setdefault(s, time.monotonic())
        return link

    def bind(self, cids: np.ndarray, base: bytes, key: str | None, fd: int) -> Link:
        """seen and bind for each of a process's clients on connection `base`, at once."""
        self.seen(base + sub_frame(int(cids[0])), fd)
        link = self._link(base, key)
        self.slot[cids] = link.slot
        self.binds += len(cids)
        return link

    def release(self, cids: np.ndarray | list[int]) -> None:
        """Clients `cids` are dead: their ids are no longer bound to any connection (a BYE one
        queued before it exited may still arrive: released_cid)."""
        ids = np.asarray(cids, np.int64)
        s = self.slot[ids]
        bound = s >= 0
        self.slot[ids[bound]] = -2 - s[bound]

    def lose(self, cid: int) -> None:
        """A send to client cid found its connection gone (before the monitor says so)."""
        link = self.link_of(cid)
        if link is not None:
            self.lost.setdefault(link.slot, time.monotonic())

    def disconnected(self, fd: int) -> None:
        """The socket monitor saw connection fd close (every client on it is lost)."""
        self._closed_since_trim += 1
        self._last_close = now = time.monotonic()
        for conn in self.on_fd.pop(fd, ()):  # one, for a process's clients
            self.closed[conn] = None
            if len(self.closed) > CLOSED_KEPT:
                self.closed.popitem(last=False)
            self.fd_of.pop(conn, None)
            s = self.slot_of.get(conn)
            if s is not None:
                self.lost.setdefault(s, now)

    def gone(self, grace_s: float, stall_s: float = math.inf, settle_s: float = 0.0
             ) -> np.ndarray:
        """The clients of connections lost for longer than grace_s; those connections leave
        `lost` (the caller releases their clients). A server that did not ask for stall_s or
        more (it stalled itself: a pause, SIGSTOP; its peers' links timed out because of it)
        counts none gone for settle_s: its clients reconnect by then (their back-off's bound),
        and a client that came back is on its new connection."""
        now = time.monotonic()
        if self._asked_at is not None and now - self._asked_at > stall_s:
            self._settle_until = now + settle_s
        self._asked_at = now
        if now < self._settle_until:
            return np.zeros(0, np.int64)
        return self._lost_past(now, grace_s)

    def settled_at(self) -> float:
        """When a stall's wait (gone) is over: lost connections count from then on."""
        return self._settle_until

    def _lost_past(self, now: float, grace_s: float) -> np.ndarray:
        out = []
        for s, t in list(self.lost.items()):  # in the order they were lost: the rest are younger
            if now - t <= grace_s:
                break
            del self.lost[s]
            out.append(self.ids_on(s))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

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


def _cid(route: bytes, clients: int) -> int | None:
    """The client id a route's envelope names (None: none of this run's)."""
    if len(route) <= SUB_BYTES:
        return None
    cid = int.from_bytes(route[-SUB_BYTES:], "little")
    return cid if cid < clients else None


def identity_for(cfg: RunConfig, local_clients: bool, per_process: int = 1, join_key: str = ""
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
    from fednet.protocol.proof import new_run_key, process_secret

    ident = Identity()
    specs: dict[str, Any] = {}
    run_key = new_run_key() if local_clients else \
        join.ensure(join_key) if join_key and not cfg.net.secure else None
    if not local_clients:
        ident.needs = "its join key: fednet clients --join-key FILE"
    if run_key is not None:
        specs["run_key"] = run_key
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
