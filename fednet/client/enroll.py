"""A client process's registration, SHUTDOWN and BYE, for one client or many (server/registrar.py
is the server's side).

One READY(hellos) names the process's ids (proven under launch with the processes' secret); one
WELCOME answers, whose arrays carry each client's partition, profile and grant, and whose body
the connection's rejoin token; one READY(readys) gives each client's number of examples (and
peer port). A process whose claim is refused as a whole claims its ids one by one. SHUTDOWN
names the clients the run ended for, idle ones too; one BYE answers for them.

Every message of a whole id range is built from arrays (client/table.py): an idle client is a
row of the WELCOME's arrays and a bit of the process's idle column, never an object.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fednet.client.table import IdIndex, IdTable
from fednet.core.executor import natural_examples, num_examples, welcome_config, welcome_tables
from fednet.core.plugin_check import checked_welcome
from fednet.errors import ConfigError
from fednet.network.latency import COLUMNS, Profile
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import hellos_proof, process_secret

if TYPE_CHECKING:
    from fednet.client.app import Client
    from fednet.client.host import Host

log = logging.getLogger("fednet.client")


@dataclass
class Welcome:
    """The process's WELCOME, kept for the clients that have no object yet: the run's settings
    once, and each client's row of its arrays (rows: cid -> row, client/table.IdIndex)."""

    cfg: Any
    body: dict
    tables: tuple
    cids: np.ndarray
    rows: IdIndex
    offsets: np.ndarray | None
    indices: Any
    profiles: Any  # (n, 4) float64: latency.COLUMNS
    grants: Any
    peers: bool
    shared: dict = field(default_factory=dict)  # profiles by value: equal ones are one object

    def row(self, cid: int) -> int:
        """Client cid's row of the arrays, -1 if the WELCOME does not name it."""
        return self.rows.row(cid)

    def profile(self, i: int) -> Profile:
        row = tuple(self.profiles[i].tolist())
        got = self.shared.get(row)
        if got is None:
            got = self.shared[row] = Profile.from_dict(dict(zip(COLUMNS, row)))
        return got

    def part(self, i: int) -> Any:
        if self.indices is None or self.offsets is None:
            return None  # natural clients build their own rows
        return self.indices[self.offsets[i]:self.offsets[i + 1]]


def read_welcome(msg: Message) -> Welcome:
    """A process's WELCOME as a Welcome; ConfigError when it cannot be used."""
    b = checked_welcome(msg.body)
    cfg = welcome_config(b)
    a, peers = msg.arrays, bool(b.get("peers"))
    try:
        cids, off = a["cids"], a.get("offsets")
        if cids.ndim != 1 or cids.dtype.kind not in "iu":
            raise TypeError("'cids' is not a 1-D integer array")
        return Welcome(cfg, b, welcome_tables(cfg, a, peers), cids, IdIndex(cids),
                       off.astype(np.int64) if off is not None else None, a.get("indices"),
                       a["client_profiles"], a.get("grants"), peers)
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise ConfigError(f"the server sent a WELCOME this process cannot use ({e}); are "
                          "both on the same fednet version?") from None


class Enrollment:
    """The registration state of a Host's clients: their ids and idle and stopped columns
    (IdTable), the process's WELCOME, whether a batch registration is under way, and the
    ledger totals of retired clients (for the next BYE)."""

    def __init__(self, host: Host, ids: Any) -> None:
        self.host = host
        self.table = IdTable(ids)
        self.w: Welcome | None = None
        self.batching = False
        self.refusal = ""  # why the server refused the process's last claim
        self.asked: dict[int, bytes] = {}  # first id of a claim -> the nonce of its latest
        self.retired: dict[str, int] = {}  # retired clients' ledger totals (for BYE)

    def keep_totals(self, c: Client) -> None:
        """A retired client's ledger totals, sent with the next BYE."""
        for k, v in c.ledger.totals().items():
            self.retired[k] = self.retired.get(k, 0) + v

    def register_together(self, timeout_s: float) -> bool:
        """READY(hellos) for every id, then wait for the process's WELCOME; False when the server
        refused the batch (then each registers alone). ConfigError on no answer."""
        link = self.host.link
        self.batching = True
        self.hellos(self.table.index.sorted_ids())
        every = link.liveness.recheck_s
        deadline, recheck = time.monotonic() + timeout_s, time.monotonic() + every
        while self.w is None and self.batching:
            left = deadline - time.monotonic()
            if left <= 0:
                raise link.no_answer(timeout_s)
            if link.sock.poll(int(min(left, every) * 1000)):
                link.drain()
            if time.monotonic() >= recheck:  # the link dropped and came back: say it again
                recheck = time.monotonic() + every
                if link.take_back():
                    self.hellos(self.table.index.sorted_ids())
                if link.mismatch:  # --secure on one side only: waiting cannot mend it
                    raise link.no_answer(timeout_s)
        return self.w is not None

    def _sender(self, cid: int) -> Client:
        return self.host.by_cid.get(cid) or self.host.make(cid)

    def hellos(self, ids: np.ndarray) -> None:
        """READY(hellos) for `ids`, proven under launch; its envelope is the first one's."""
        cids = np.sort(np.asarray(ids, dtype=np.int64))
        sender = self._sender(int(cids[0]))
        body = {"phase": "hellos", "device": self.host.device, "pid": os.getpid(),
                "host": socket.gethostname()[:256]}
        token = self.token()
        if token is not None:  # a reconnect: the server's own token from our WELCOME
            body["token"] = token
        nonce = os.urandom(16)  # names this claim (a REJECT says which claim it answers)
        body["nonce"] = self.asked[int(cids[0])] = nonce
        run_key = self.host.cred.run_key
        if run_key is not None:
            body["proof"] = hellos_proof(process_secret(run_key), cids.tobytes(), nonce)
        sender._send_server(Message(MsgKind.READY, sender.name, body=body,
                                    arrays={"cids": cids}))

    def stale(self, cid: int, answers: object) -> bool:
        """Whether a REJECT on client cid's envelope answers an earlier claim than its latest
        (one said again after the link came back, or a claim of its own after a refused
        batch): the claim it refused is void, its latest still waits for an answer. A REJECT
        that names no claim (READY(readys) refused) is never stale."""
        return isinstance(answers, bytes) and self.asked.get(cid) != answers

    def batch_refused(self, reason: str) -> None:
        """The server refused the process's hellos as a whole: a process of several clients
        claims them one by one (a process of one is refused: Host.register)."""
        host = self.host
        self.batching, self.refusal = False, reason
        if not host.several:
            if self.w is not None:  # a re-registration: e.g. the old connection still holds it
                host.first.retry_hello(reason)
            return
        log.warning("%s: the server refused to register them together (%s); registering each "
                    "alone", host.link.label, reason)
        if self.w is not None:  # a re-registration: every client, each alone
            for cid in self.table.idle_ids().tolist():
                host.make(cid)
            for c in host.clients:
                if c.server.sub in host.link.clients:  # not stopped meanwhile
                    self.hellos(np.array([c.cid], np.int64))

    def take(self, c: Client) -> int:
        """Client c takes its row of the process's WELCOME; returns its examples."""
        assert self.w is not None
        w, i = self.w, self.w.row(c.cid)
        c._drop_work()  # what an earlier server sent is void now
        grant = w.grants[i].tobytes() if w.grants is not None else None
        return c.take_welcome(w.cfg, w.body, w.profile(i), w.part(i), grant, w.tables)

    def token(self) -> bytes | None:
        """The rejoin token of the connection's last WELCOME (the server's own: it lets a
        reconnect take over the ids that connection held); None before one."""
        tok = self.w.body.get("token") if self.w is not None else None
        return tok if isinstance(tok, bytes) else None

    def on_welcome(self, msg: Message) -> None:
        """The process's WELCOME: kept for the idle clients; the clients with an object take
        their part. One READY(readys) answers for all (where the run hands models between
        clients, every client is built and it says where each one's peer socket listens)."""
        w = read_welcome(msg)
        self.w, self.batching = w, False
        self.host.kept.clear()  # built under the last WELCOME's settings
        self.host.cred.admit(w.body.get("peer_keys", []))
        torch.set_num_threads(w.cfg.train.threads)
        mine = np.flatnonzero(self.table.index.rows(w.cids) >= 0)  # WELCOME rows of our ids
        if w.peers:
            return self._welcome_each(w, mine)
        by_cid = self.host.by_cid
        built = np.isin(w.cids[mine], np.fromiter(by_cid, np.int64, len(by_cid)))
        idle = mine[~built]
        counts = np.zeros(mine.size, np.int64)
        counts[~built] = self._idle_counts(w, idle)
        for j in np.flatnonzero(built).tolist():  # the few clients with an object
            c = by_cid[int(w.cids[mine[j]])]
            counts[j] = self.take(c)
            c.welcomed()
        self.table.make_idle(self.table.index.rows(w.cids[idle]))
        if mine.size:
            self._readys(w.cids[mine].astype(np.int64), counts)
        return None

    def _welcome_each(self, w: Welcome, mine: np.ndarray) -> None:
        """A run that hands models between clients: every client is built and its peer socket
        listens; READY(readys) says where."""
        cids = w.cids[mine].astype(np.int64)
        counts, ends = np.zeros(cids.size, np.int64), []
        for j, cid in enumerate(cids.tolist()):
            c = self.host.by_cid.get(cid) or self.host.make(cid, take=False)
            counts[j] = self.take(c)
            c.welcomed()
            ends.append(c.listen())
        if cids.size:
            self._readys(cids, counts, ends)

    def _idle_counts(self, w: Welcome, rows: np.ndarray) -> np.ndarray:
        """The examples of the clients of WELCOME `rows` without an object: a natural client's
        from the dataset's formula (one call for all), else its part's length (the parts
        checked once, as num_examples checks each)."""
        if not rows.size:
            return np.zeros(0, np.int64)
        if w.indices is None or w.offsets is None:
            if w.indices is None:
                return natural_examples(w.cfg, w.cids[rows].astype(np.int64))
            return np.fromiter((num_examples(w.cfg, cid, None) for cid in w.cids[rows].tolist()),
                               np.int64, rows.size)
        num_examples(w.cfg, int(w.cids[rows[0]]), w.indices)  # the indices checked
        return (w.offsets[rows + 1] - w.offsets[rows]).astype(np.int64)

    def _readys(self, cids: np.ndarray, counts: np.ndarray,
                endpoints: list[str] | None = None) -> None:
        """One READY(readys): the ids ascending, each with its number of examples (and its
        peer port, in a run that hands models between clients)."""
        order = np.argsort(cids, kind="stable")
        sender = self._sender(int(cids[order[0]]))
        body: dict[str, Any] = {"phase": "readys"}
        if endpoints is not None:
            body["endpoints"] = [endpoints[i] for i in order.tolist()]
        sender._send_server(Message(MsgKind.READY, sender.name, sender.run_id, body=body,
                                    arrays={"cids": cids[order], "n": counts[order]}))

    def on_shutdown(self, msg: Message) -> None:
        """SHUTDOWN for the process's clients named in it (idle ones too)."""
        cids = msg.arrays.get("cids")
        if not isinstance(cids, np.ndarray) or cids.ndim != 1 or cids.dtype.kind not in "iu":
            return log.warning("%s: a SHUTDOWN this process cannot read", self.host.link.label)
        host = self.host
        if host.by_cid:
            named = np.isin(np.fromiter(host.by_cid, np.int64, len(host.by_cid)), cids)
            for c, hit in zip(list(host.by_cid.values()), named.tolist()):
                if hit:
                    c.stopping = True
                    host.attention.add(c)
        self.table.stop_idle(cids)
        return None

    def together(self, done: list[Client], again: list[Client]) -> None:
        """BYE for the clients whose run ended (`done`, and the idle ones SHUTDOWN named), READY
        (hellos) for all when the link came back (`again`): one message each."""
        host = self.host
        stopped = self.table.take_stopped()
        ids = np.sort(np.concatenate([np.array([c.cid for c in done], np.int64), stopped]))
        if ids.size:
            self._byes(ids, done)
        for c in done:
            host.drop(c)
        if again:
            self.batching = True  # a refusal: each alone (batch_refused)
            live = np.array([c.cid for c in host.live], np.int64)
            self.hellos(np.concatenate([live, self.table.idle_ids()]))

    def _byes(self, ids: np.ndarray, done: list[Client]) -> None:
        """One BYE for `ids`: the totals of their ledgers (and of retired clients) added up."""
        host = self.host
        sender = self._sender(int(ids[0]))
        for c in done:
            c._drop_work()
        total, self.retired = dict(self.retired), {}
        for c in {id(c): c for c in done + [sender]}.values():
            for k, v in c.ledger.totals().items():
                total[k] = total.get(k, 0) + v
        sender._send_server(Message(MsgKind.BYE, sender.name, sender.run_id, body=total,
                                    arrays={"cids": ids}))
        if sender not in done:  # built only to say it: it stops with the others
            host.live.pop(sender, None)
            host.drop(sender)
