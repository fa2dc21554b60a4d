"""Registration, the server's side: a client process's READY(hellos) -> WELCOME ->
READY(readys), REJECT to a claim that cannot stand, and BYE. The registrar owns what
registration keeps (whose hello was accepted, and when), over the server's connections
(conns.py), registered clients (book.py) and fates (fates.py).

One path for a process of one client or of many: its ids in one message each way, so
registration work follows the processes, not the clients (50,000 per-client hellos and WELCOMEs
kept the server busy for about 14 s). The claim is proven (conns.Connections.check_claim): under
`fednet launch` an HMAC over the ids and a fresh nonce with the processes' secret derived from
the run key (plaintext `fednet server`: its join key's); under `--secure` the connection's key
must be allowed every id; a server with neither takes ids no live connection holds (unless the
claim brings the rejoin token of the connection that holds them). Each id is bound to the connection with its own
envelope (the message's envelope must be its first id's), so from then on each client's
messages are checked on their own. A process whose claim is refused as a whole claims its ids
one by one (client/host.py).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import zmq

from fednet.core.plugin_check import welcome_plugins
from fednet.data.partition import part_size, part_sizes
from fednet.metrics.accounting import SERVER
from fednet.network import latency
from fednet.network.availability import Trace
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import grant_key
from fednet.server.fates import NO_TOTALS
from fednet.transport.channels import SUB_BYTES, Received, sub_frame
from fednet.types import ClientInfo, client_name

if TYPE_CHECKING:
    from fednet.core.session import Session
    from fednet.server.book import ClientBook
    from fednet.server.conns import Connections
    from fednet.server.fates import Fates
    from fednet.transport.channels import Channel

MAX_IDS = 1 << 21  # ids in one READY(hellos)
REJECTS_PER_S = 50  # REJECT replies per second at most (the rest are only counted)


class Serving(Protocol):
    """What the Registrar uses of the server that owns it (server/app.ZmqServer): its session,
    channel, connections, books and fates; its monitor's events read; a message sent to a
    client; a client's held tasks failed."""

    s: Session
    chan: Channel
    conns: Connections
    clients: ClientBook
    fates: Fates

    def read_monitor(self) -> None: ...

    def send(self, cid: int, msg: Message) -> bool: ...

    def fail_held(self, ids: np.ndarray, why: str) -> None: ...


class Registrar:
    """READY, WELCOME, REJECT and BYE for the server `srv` (its channel, sessions and books)."""

    def __init__(self, srv: Serving) -> None:
        self.srv = srv
        self.said = np.zeros(max(srv.s.cfg.clients, 0), bool)  # its hello was accepted
        self.hello_at: dict[bytes, float] = {}  # route -> its last accepted hello
        self._profiles_array: np.ndarray | None = None  # a latency trace as WELCOME carries it
        self._config: tuple[Any, dict] | None = None
        self._reject_window, self._rejects_sent = 0.0, 0

    def welcomed(self, cid: int) -> bool:
        """Whether client cid's hello was accepted (it may be registered, or not yet)."""
        return bool(self.said[cid])

    def _may_hello(self, got: Received) -> bool:
        every = self.srv.s.cfg.liveness.hello_every_s  # one READY(hellos) per route
        return time.monotonic() - self.hello_at.get(got.route, -1e9) >= every

    def _accepted(self, got: Received) -> None:
        if len(self.hello_at) > 100_000:
            self.hello_at.clear()
        self.hello_at[got.route] = time.monotonic()

    def _came_back(self, ids: np.ndarray) -> None:
        """Clients `ids` registered (again): alive, and the tasks they held are lost (a client
        drops its queued work at WELCOME)."""
        self.srv.fates.revive(ids)
        self.srv.fail_held(ids, "registered again; the task was lost with its old connection")

    # ---- READY(hellos): a client process's clients (one, or many) ------------------------
    def on_hellos(self, got: Received) -> None:
        """READY(hellos): bind every id the process proves to (its connection, the id's
        envelope); one WELCOME answers for all of them."""
        srv = self.srv
        cids, why = batch_ids(got, srv.s.cfg.clients)
        if cids is None:
            srv.chan.reject(got, why)
            return self.send_reject(got, why)
        if not self._may_hello(got):
            return srv.chan.reject(got, "repeated hello")
        b, key, base = got.msg.body, got.prop("User-Id"), got.route[:-SUB_BYTES]
        srv.read_monitor()  # an old connection of these ids may have closed just before
        why = srv.conns.check_claim(cids, base, key, b.get("nonce"), b.get("proof"),
                                    b.get("token"))
        if why:
            srv.chan.reject(got, why)
            return self.send_reject(got, why)
        self._accepted(got)
        srv.chan.accept(got, client_name(int(cids[0])))
        link = srv.conns.bind(cids, base, key, got.fd)  # its close loses them all
        link.info = {"device": b.get("device", "?"), "pid": b.get("pid", 0),
                     "host": b.get("host", "")}  # one record for the process's clients
        self.said[cids] = True
        self._came_back(cids)
        srv.send(int(cids[0]), self._welcome(cids))
        return None

    # ---- WELCOME: one encoding for one client or a process's ----------------------------
    def _welcome(self, cids: np.ndarray) -> Message:
        """The WELCOME of clients `cids` (a process's, one or many): the run's
        configuration and the connection's rejoin token once, and per client (in arrays, in
        the order of `cids`) its partition, profile and, under --secure, its grant key."""
        s, conns = self.srv.s, self.srv.conns
        ids = cids.tolist()
        body = {"config": self.config_dict(), "run_id": s.run_id, "peers": s.handoffs,
                "token": conns.token(ids[0])}  # (16 bytes: the connection's, for a reconnect)
        arrays = {"cids": cids, "client_profiles": latency.to_array(s.profiles.subset(cids))}
        if not callable(getattr(s.parts, "size", None)):  # natural clients build their own rows
            parts = [np.asarray(s.parts[c], dtype=np.int64) for c in ids]
            sizes = np.fromiter((len(p) for p in parts), np.int64, len(parts))
            arrays["indices"] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            arrays["offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if conns.ident.key_ids:  # --secure: the grant keys, and the keys the peer ports admit
            arrays["grants"] = _rows([grant_key(conns.ident.grants, c) for c in ids], 32)
            body["peer_keys"] = list(conns.ident.key_ids)
        needed = welcome_plugins(s.cfg)
        if needed:
            body["plugins"] = needed
        arrays.update(self.traces(ids))
        return Message(MsgKind.WELCOME, SERVER, s.run_id, body=body, arrays=arrays)

    # ---- what WELCOME carries -------------------------------------------------------------
    def traces(self, cids: list[int]) -> dict:
        """What WELCOME carries of the latency and availability traces (the client host needs
        no copy of the files): all of both when the algorithm hands models between clients
        (a receiver charges its sender's link and checks who was offline), else only the
        clients' own intervals (their profiles are rows of `client_profiles`)."""
        out: dict = {}
        s = self.srv.s
        whole, av = s.handoffs, s.availability
        if isinstance(av, Trace):  # a trace file: its intervals travel
            out.update(av.to_arrays() if whole else av.to_arrays(cids))
        if s.cfg.latency.file and whole:
            if self._profiles_array is None:  # built once: every WELCOME carries the same
                self._profiles_array = latency.to_array(s.profiles)
            out["profiles"] = self._profiles_array
        return out

    def config_dict(self) -> dict:
        """The run's configuration as WELCOME carries it, built once per configuration (every
        client's WELCOME carries the same; building it is a walk over every field)."""
        cfg = self.srv.s.cfg
        if self._config is None or self._config[0] is not cfg:
            self._config = (cfg, cfg.to_dict())
        return self._config[1]

    # ---- READY(readys) ----------------------------------------------------------------------
    def on_ready(self, got: Received) -> None:
        """READY(readys) of welcomed clients of this connection: each one's number of examples,
        which must be the server's own count, and, where the run hands models between
        clients, each one's peer port (`endpoints`)."""
        srv = self.srv
        cids, why = batch_ids(got, srv.s.cfg.clients, extra="n")
        if cids is None:
            return srv.chan.reject(got, why)
        link = srv.conns.link_of(int(cids[0]))
        if (link is None or link.conn != got.route[:-SUB_BYTES]
                or not (srv.conns.slot[cids] == link.slot).all() or not self.said[cids].all()):
            return srv.chan.reject(got, "READY(readys) for a client not registered on this "
                                        "connection")
        n, ends = got.msg.arrays["n"], got.msg.body.get("endpoints")
        if int(n.min()) < 0:
            return srv.chan.reject(got, "a negative number of examples")
        if ends is not None and len(ends) != cids.size:
            return srv.chan.reject(got, "'endpoints' must name one port per id")
        sizes = part_sizes(srv.s.parts, cids)  # the server's own counts, every client's at once
        wrong = np.flatnonzero(n != sizes)
        if wrong.size:
            bad = int(wrong[0])
            why = self.examples_problem(int(cids[bad]), int(n[bad]))
            srv.chan.reject(got, why)
            return self.send_reject(got, why)
        srv.chan.accept(got, client_name(int(cids[0])))
        h = link.info or {}
        device, pid, host = str(h.get("device", "?")), int(h.get("pid", 0)), str(h.get("host", ""))
        if ends is None:  # one record for them all (server/book.py)
            return srv.clients.add_process(cids, device, pid, host)
        for cid, size, peer in zip(cids.tolist(), sizes.tolist(), ends):
            srv.clients[cid] = ClientInfo(cid, size, device, str(peer), pid, host)
        return None

    def examples_problem(self, cid: int, n: int) -> str:
        """Why client cid's READY cannot stand ('' when it can): it says it holds other than
        the examples the server's partition gave it (another dataset on its host)."""
        want = part_size(self.srv.s.parts, cid)
        return "" if n == want else (
            f"client {cid} holds {n} examples on its host, the server's partition gave it "
            f"{want}: is the dataset under --data-root the same on both hosts?")

    def send_reject(self, got: Received, reason: str) -> None:
        """A REJECT to a connection that made a claim it cannot have, at most REJECTS_PER_S a
        second; never blocks, never raises (the sender may be gone), carries no run secret. A
        refused READY(hellos)'s nonce comes back in `answers`."""
        chan, now = self.srv.chan, time.monotonic()
        if now - self._reject_window > 1.0:
            self._reject_window, self._rejects_sent = now, 0
        if self._rejects_sent >= REJECTS_PER_S:
            chan.dropped_sends += 1
            return
        self._rejects_sent += 1
        body: dict[str, Any] = {"reason": reason[:4096]}
        nonce = got.msg.body.get("nonce") if got.msg.body.get("phase") == "hellos" else None
        if isinstance(nonce, bytes):  # the claim it answers (client/enroll.py: answers)
            body["answers"] = nonce
        try:
            chan.send(Message(MsgKind.REJECT, SERVER, body=body), "unknown", route=got.route,
                      block=False)
        except zmq.ZMQError:  # gone already, or not reading: nothing is queued for it
            chan.dropped_sends += 1

    # ---- BYE ------------------------------------------------------------------------------
    def on_bye(self, cid: int, got: Received) -> None:
        """BYE of a process's clients (its `cids`, each bound on this connection): the body is
        their ledgers' totals added up, kept with the first id (so the clients' view still adds
        up)."""
        srv = self.srv
        cids, why = batch_ids(got, srv.s.cfg.clients)
        if cids is None:
            return srv.chan.reject(got, why)
        link = srv.conns.link_of(cid)
        if link is None or not (srv.conns.slot[cids] == link.slot).all():
            return srv.chan.reject(got, "BYE for a client not registered on this connection")
        srv.chan.accept(got, client_name(int(cids[0])))
        srv.fates.bye(cids, got.msg.body)
        return None

    def late_bye(self, got: Received, late: int) -> None:
        """A BYE read after its client's connection was released (its process's exit reported
        first): every id it names that was released from this same connection (client
        `late`, whose envelope it came on, is the first)."""
        srv = self.srv
        cids, why = batch_ids(got, srv.s.cfg.clients)
        if cids is None:
            return srv.chan.reject(got, why)
        srv.chan.accept(got, client_name(late))
        ids = cids[srv.conns.slot[cids] == srv.conns.slot[late]]  # released from the same link
        new = ids[~srv.fates.said_bye[ids]]
        if new.size:
            srv.fates.bye(new, got.msg.body if new[0] == ids[0] else NO_TOTALS)


def batch_ids(got: Received, clients: int, extra: str = "") -> tuple[np.ndarray | None, str]:
    """The ids a READY(hellos|readys) or BYE names (its `cids` array: int64, 1-D, distinct, in
    the run's range), or None and why not. `extra`: another array that must match it in
    length."""
    a = got.msg.arrays.get("cids")
    if a is None or a.ndim != 1 or a.dtype != np.int64 or not 0 < a.size <= MAX_IDS:
        return None, f"a batch needs a 1-D int64 'cids' array of 1 to {MAX_IDS} ids"
    if extra and (got.msg.arrays.get(extra) is None or got.msg.arrays[extra].shape != a.shape
                  or got.msg.arrays[extra].dtype != np.int64):
        return None, f"'{extra}' must be an int64 array as long as 'cids'"
    if int(a.min()) < 0 or int(a.max()) >= clients:
        return None, f"client id out of range: this run has {clients} clients"
    if not _distinct(a):
        return None, "a batch names an id twice"
    if got.route[-SUB_BYTES:] != sub_frame(int(a[0])) or got.msg.sender != client_name(int(a[0])):
        return None, "a batch whose envelope or sender is not its first id"
    return a, ""


def _distinct(a: np.ndarray) -> bool:
    """Whether no id repeats: one pass when they ascend (as a client process sends them), a
    sort otherwise (np.unique over 625,000 ids, three messages a process, was most of a
    ten-million-client launch's registration time on the server)."""
    return bool((a[1:] > a[:-1]).all()) or np.unique(a).size == a.size


def _rows(values: list[bytes], width: int) -> np.ndarray:
    return np.frombuffer(b"".join(values), np.uint8).reshape(len(values), width)
