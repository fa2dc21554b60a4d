"""Registration, the server's side: a client's or a whole client process's READY(hello|hellos)
-> WELCOME -> READY(ready|readys), REJECT to a claim that cannot stand, and BYE. The registrar
owns what registration keeps (who said hello, how, and when), over the server's connections
(conns.py), registered clients (book.py) and fates (fates.py).

A client process registers its whole id range in one message each way: READY(hellos) -> one
WELCOME -> READY(readys), so registration work follows the processes, not the clients (50,000
per-client hellos and WELCOMEs kept the server busy for about 14 s). The claim is proven as a
lone hello's is (conns.Connections.check_batch): under `fednet launch` an HMAC over the ids and
a fresh nonce with the processes' secret derived from the run key; under `--secure` the
connection's key must be allowed every id; plaintext `fednet server` takes ids no live
connection holds. Each id is bound to the connection with its own envelope (the message's
envelope must be its first id's), so from then on each client's messages are checked exactly as
if it had registered alone. A reconnect, and a process whose batch is refused, register client
by client (client/host.py).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

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
    from fednet.server.app import ZmqServer

MAX_IDS = 1 << 21  # ids in one READY(hellos)
REJECTS_PER_S = 50  # REJECT replies per second at most (the rest are only counted)
ALONE, TOGETHER = 1, 2  # how a client's hello came (Registrar.said)


class Registrar:
    """READY, WELCOME, REJECT and BYE for the server `srv` (its channel, sessions and books)."""

    def __init__(self, srv: ZmqServer) -> None:
        self.srv = srv
        self.said = np.zeros(max(srv.s.cfg.clients, 0), np.int8)  # 0, ALONE or TOGETHER
        self.alone: dict[int, dict[str, Any]] = {}  # the hello of each client that came alone
        self.hello_at: dict[bytes, float] = {}  # route -> its last accepted hello
        self._profiles_array: Any = None  # a latency trace as WELCOME carries it
        self._config: tuple[Any, dict] | None = None
        self._reject_window, self._rejects_sent = 0.0, 0

    def welcomed(self, cid: int) -> bool:
        """Whether client cid's hello was accepted (it may be registered, or not yet)."""
        return bool(self.said[cid])

    # ---- READY(hello): a client alone -----------------------------------------------------
    def on_hello(self, got: Received) -> None:
        """READY(hello): bind the client to its connection once its claim is proven."""
        srv, b = self.srv, got.msg.body
        cid = b["cid"]
        if got.msg.sender != client_name(cid) or got.route[-SUB_BYTES:] != sub_frame(cid):
            return srv.chan.reject(got, "hello whose sender or envelope is not its cid")
        if cid >= srv.s.cfg.clients:
            srv.chan.reject(got, "client id out of range")
            return self.send_reject(got, f"client id out of range: this run has "
                                         f"{srv.s.cfg.clients} clients")
        if not self._may_hello(got):
            return srv.chan.reject(got, "repeated hello")
        key = got.prop("User-Id")
        if srv.conns.route_of(cid) not in (None, got.route):
            srv._read_monitor()  # its old connection may have closed just before: know it first
        why = srv.conns.check_claim(cid, got.route, key, b.get("nonce"), b.get("proof"),
                                    b.get("token"))
        if why:
            srv.chan.reject(got, why)
            return self.send_reject(got, why)
        self._accepted(got)
        srv.chan.accept(got, client_name(cid))
        srv.conns.bind(cid, got.route, key)
        self.said[cid], self.alone[cid] = ALONE, dict(b)
        self._came_back(np.array([cid], np.int64))
        srv._send(cid, self._welcome_alone(cid))

    def _may_hello(self, got: Received) -> bool:
        every = self.srv.s.cfg.liveness.hello_every_s  # one READY(hello|hellos) per connection
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

    def _welcome_alone(self, cid: int) -> Message:
        s, ident = self.srv.s, self.srv.conns.ident
        body = {"config": self.config_dict(), "profile": s.profiles[cid].to_dict(),
                "run_id": s.run_id, "cid": cid, "peers": s.handoffs,
                "token": self.srv.conns.token(cid)}
        if ident.key_ids:  # --secure: the key that checks this client's grants,
            body["grant"] = grant_key(ident.grants, cid)  # and the keys its peer
            body["peer_keys"] = list(ident.key_ids)  # port may admit (one per host)
        needed = welcome_plugins(s.cfg)  # [name, version] of the plugins the run uses
        if needed:
            body["plugins"] = needed
        # the client's partition travels with the configuration: no client process
        # recomputes the whole partition (30 ms for Dirichlet on digits, per process)
        arrays = {"indices": s.parts[cid].astype("int64")}
        arrays.update(self.traces(cid))
        return Message(MsgKind.WELCOME, SERVER, s.run_id, body=body, arrays=arrays)

    # ---- READY(hellos): a client process's clients together -------------------------------
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
        srv._read_monitor()  # an old connection of these ids may have closed just before
        why = srv.conns.check_batch(cids, base, key, b.get("nonce"), b.get("proof"))
        if why:
            srv.chan.reject(got, why)
            return self.send_reject(got, why)
        self._accepted(got)
        srv.chan.accept(got, client_name(int(cids[0])))
        link = srv.conns.bind_batch(cids, base, key, got.fd)  # its close loses them all
        link.info = {"device": b.get("device", "?"), "pid": b.get("pid", 0),
                     "host": b.get("host", "")}  # one record for the process's clients
        self.said[cids] = TOGETHER
        if self.alone:
            for cid in self.alone.keys() & set(cids.tolist()):
                del self.alone[cid]
        self._came_back(cids)
        srv._send(int(cids[0]), self._welcome_together(cids))
        return None

    def _welcome_together(self, cids: np.ndarray) -> Message:
        """One WELCOME for a process's clients: the run's configuration once, and per client
        (in arrays, in the order of `cids`) its partition, profile, rejoin token and, under
        --secure, its grant key."""
        s, conns = self.srv.s, self.srv.conns
        ids = cids.tolist()
        body = {"config": self.config_dict(), "run_id": s.run_id, "peers": s.handoffs}
        arrays = {"cids": cids, "client_profiles": latency.to_array(s.profiles.subset(cids))}
        if not conns.ident.proven:  # plaintext `fednet server`: a reconnect proves itself so
            arrays["tokens"] = _rows([conns.token(c) for c in ids], 16)
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
    def traces(self, cid: int | list[int]) -> dict:
        """What WELCOME carries of the latency and availability traces (the client host needs
        no copy of the files): all of both when the algorithm hands models between clients
        (a receiver charges its sender's link and checks who was offline), else only the
        client's own intervals (its profile is in the body)."""
        out: dict = {}
        s = self.srv.s
        whole, av = s.handoffs, s.availability
        if isinstance(av, Trace):  # a trace file: its intervals travel
            out.update(av.to_arrays() if whole else av.to_arrays(
                cid if isinstance(cid, list) else [cid]))
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

    # ---- READY(ready|readys) --------------------------------------------------------------
    def on_ready(self, cid: int, got: Received) -> None:
        """READY(ready) of a welcomed client, or READY(readys) of a welcomed process: each says
        how many examples it holds, which must be the server's own count."""
        srv = self.srv
        if not self.said[cid]:
            return srv.chan.reject(got, "READY(ready) before hello")
        if got.msg.body["phase"] == "readys":
            return self._on_readys(got)
        why = self.examples_problem(cid, got.msg.body["n"])
        if why:
            srv.chan.reject(got, why)
            return self.send_reject(got, why)
        srv.chan.accept(got, client_name(cid))
        h = self._hello_of(cid)
        peer = got.msg.body.get("endpoint") or h.get("endpoint", "")  # bound after WELCOME
        srv.clients[cid] = ClientInfo(cid, part_size(srv.s.parts, cid),  # the server's count
                                      str(h.get("device", "?")), str(peer),
                                      int(h.get("pid", 0)), str(h.get("host", "")))
        return None

    def _hello_of(self, cid: int) -> dict[str, Any]:
        if self.said[cid] == ALONE:
            return self.alone.get(cid, {})
        link = self.srv.conns.link_of(cid)
        return (link.info or {}) if link is not None else {}

    def _on_readys(self, got: Received) -> None:
        srv = self.srv
        cids, why = batch_ids(got, srv.s.cfg.clients, extra="n")
        if cids is None:
            return srv.chan.reject(got, why)
        link = srv.conns.link_of(int(cids[0]))
        if (link is None or link.conn != got.route[:-SUB_BYTES]
                or not (srv.conns.slot[cids] == link.slot).all() or not self.said[cids].all()):
            return srv.chan.reject(got, "READY(readys) for a client not registered on this "
                                        "connection")
        n = got.msg.arrays["n"]
        if int(n.min()) < 0:
            return srv.chan.reject(got, "a negative number of examples")
        sizes = part_sizes(srv.s.parts, cids)  # the server's own counts, every client's at once
        wrong = np.flatnonzero(n != sizes)
        if wrong.size:
            bad = int(wrong[0])
            why = self.examples_problem(int(cids[bad]), int(n[bad]))
            srv.chan.reject(got, why)
            return self.send_reject(got, why)
        srv.chan.accept(got, client_name(int(cids[0])))
        if (self.said[cids] == TOGETHER).all() and link.info is not None:
            h = link.info  # one record for them all (server/book.py)
            srv.clients.add_process(cids, str(h.get("device", "?")), int(h.get("pid", 0)),
                                    str(h.get("host", "")))
            return None
        for cid, size in zip(cids.tolist(), sizes.tolist()):
            h = self._hello_of(cid)
            srv.clients[cid] = ClientInfo(cid, size, str(h.get("device", "?")), "",
                                          int(h.get("pid", 0)), str(h.get("host", "")))
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
        second; never blocks, never raises (the sender may be gone), carries no run secret."""
        chan, now = self.srv.chan, time.monotonic()
        if now - self._reject_window > 1.0:
            self._reject_window, self._rejects_sent = now, 0
        if self._rejects_sent >= REJECTS_PER_S:
            chan.dropped_sends += 1
            return
        self._rejects_sent += 1
        try:
            chan.send(Message(MsgKind.REJECT, SERVER, body={"reason": reason[:4096]}),
                      "unknown", route=got.route, block=False)
        except zmq.ZMQError:  # gone already, or not reading: nothing is queued for it
            chan.dropped_sends += 1

    # ---- BYE ------------------------------------------------------------------------------
    def on_bye(self, cid: int, got: Received) -> None:
        """BYE of client cid, or of a process's clients (its `cids`, each bound on this
        connection): the body is their ledgers' totals added up, kept with the first id (so the
        clients' view still adds up)."""
        srv = self.srv
        if "cids" not in got.msg.arrays:
            srv.chan.accept(got, client_name(cid))
            return srv.fates.bye([cid], got.msg.body)
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
        first): client `late`'s own, and, for a process's BYE, every id it names that was
        released from this same connection."""
        srv = self.srv
        srv.chan.accept(got, client_name(late))
        ids = np.array([late], np.int64)
        cids, _ = batch_ids(got, srv.s.cfg.clients) if "cids" in got.msg.arrays else (None, "")
        if cids is not None:
            s = srv.conns.slot[cids]
            ids = cids[s == srv.conns.slot[late]]  # released from the same link
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
    if got.route[-SUB_BYTES:] != sub_frame(int(a[0])):
        return None, "a batch whose envelope is not its first id"
    return a, ""


def _distinct(a: np.ndarray) -> bool:
    """Whether no id repeats: one pass when they ascend (as a client process sends them), a
    sort otherwise (np.unique over 625,000 ids, three messages a process, was most of a
    ten-million-client launch's registration time on the server)."""
    return bool((a[1:] > a[:-1]).all()) or np.unique(a).size == a.size


def _rows(values: list[bytes], width: int) -> np.ndarray:
    return np.frombuffer(b"".join(values), np.uint8).reshape(len(values), width)
