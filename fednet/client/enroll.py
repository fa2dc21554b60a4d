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
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from fednet.client.app import NONE, Client, Events
from fednet.client.link import Credentials, ServerLink
from fednet.client.table import IdTable
from fednet.client.welcome import Welcome, read_welcome
from fednet.core.executor import KeptExecutors, natural_examples, num_examples
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import hellos_proof, process_secret

log = logging.getLogger("fednet.client")


class Roster(Protocol):
    """What an Enrollment needs of the process that holds its clients (client/host.Host): the
    clients that have an object (by id; by envelope those whose messages are still read),
    building one, where their events go, and a peer socket that listens."""

    by_cid: dict[int, Client]
    routes: dict[bytes, Client]

    def make(self, cid: int, take: bool = True) -> Client: ...

    def queue(self, c: Client, events: Events) -> None: ...

    def listen(self, c: Client) -> str: ...


class Enrollment:
    """The registration state of a process's clients: their ids and idle and stopped columns
    (IdTable), the process's WELCOME, whether a batch registration is under way, and the
    ledger totals of retired clients (for the next BYE); the registration's wait, the messages
    of registration, SHUTDOWN and BYE, and what the server's WELCOME, REJECT and SHUTDOWN say.
    Its clients are its Roster's (the Host): `device` and `cred` (the run key proves the
    hellos; WELCOME's keys are admitted) and `kept` (cleared at WELCOME) are the process's."""

    def __init__(self, ids: Sequence[int] | np.ndarray, roster: Roster, device: str, cred: Credentials,
                 kept: KeptExecutors) -> None:
        self.roster, self.device, self.cred, self.kept = roster, device, cred, kept
        self.table = IdTable(ids)
        self.several = len(self.table) > 1
        self.w: Welcome | None = None
        self.batching = False
        self.refusal = ""  # why the server refused the process's last claim
        self.asked: dict[int, bytes] = {}  # first id of a claim -> the nonce of its latest
        self.retired: dict[str, int] = {}  # retired clients' ledger totals (for BYE)
        self.settled = 0  # clients welcomed or refused (SETTLED: the registration's wait)

    def keep_totals(self, c: Client) -> None:
        """A retired client's ledger totals, sent with the next BYE."""
        for k, v in c.ledger.totals().items():
            self.retired[k] = self.retired.get(k, 0) + v

    def claim(self, link: ServerLink, timeout_s: float) -> None:
        """READY(hellos) for every id, then the registration's one wait: for the answer to the
        process's claim (its WELCOME, or a refusal), then, where the server refused the claim
        of a process of several, for every client's own (each id claimed alone, as separate
        processes would; each client welcomed or refused, its `refused` says why). Each answer
        to a client restarts the wait (building a client's data takes time), and so does the
        refusal; the claims not answered are said again when the link comes back. ConfigError
        when the server does not answer within timeout_s."""
        self.batching = True
        self.hellos(self.table.index.sorted_ids())
        every = link.liveness.recheck_s
        deadline, recheck = time.monotonic() + timeout_s, time.monotonic() + every
        alone: int | None = None  # the clients that claimed alone and wait for their answer
        while True:
            if alone is None and not self.batching:  # the process's claim was answered
                if self.w is not None or not self.several:
                    return  # welcomed (or a process of one refused: Host.register raises)
                self._claim_alone()
                alone, self.settled = len(self.roster.by_cid), 0
                deadline = time.monotonic() + timeout_s
            if alone is not None and alone <= 0:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise link.no_answer(timeout_s)
            if link.sock.poll(int(min(left, every) * 1000)):
                link.drain()
            if alone is not None and self.settled:  # welcomed or refused since
                alone -= self.settled
                self.settled, deadline = 0, time.monotonic() + timeout_s
            if time.monotonic() >= recheck:  # a link that dropped meanwhile: claim again
                recheck = time.monotonic() + every
                back = link.take_back()
                if link.mismatch:  # --secure on one side only: waiting cannot mend it
                    raise link.no_answer(timeout_s)
                if back:
                    self._claim_again(alone is not None)

    def _claim_again(self, alone: bool) -> None:
        """The link came back during the registration's wait: the process's claim said again,
        or (alone) each claim of a client the server has not answered yet."""
        if not alone:
            return self.hellos(self.table.index.sorted_ids())
        for c in list(self.roster.by_cid.values()):
            if not c.registered and c.refused is None:
                self.hellos(np.array([c.cid], np.int64))
        return None

    def _claim_alone(self) -> None:
        """Every client claims its own id (READY(hellos) each), those without an object built
        first: the idle ones, or at the first registration every id."""
        roster = self.roster
        ids = self.table.idle_ids() if self.w is not None else self.table.index.ids()
        for cid in ids.tolist():
            if cid not in roster.by_cid:
                roster.make(cid)
        for c in list(roster.routes.values()):  # those not stopped meanwhile
            self.hellos(np.array([c.cid], np.int64))

    def on_message(self, c: Client, msg: Message) -> Events:
        """A WELCOME, SHUTDOWN or REJECT client c received: the process's WELCOME and SHUTDOWN
        name the clients they are for; a REJECT answers the process's claim or c's own."""
        if msg.kind == MsgKind.SHUTDOWN:
            self.on_shutdown(msg)  # the run ended for the process's clients it names
        elif msg.kind == MsgKind.WELCOME:
            self.on_welcome(msg)  # the process's WELCOME, for the clients it names
        else:
            reason = str(msg.body.get("reason", ""))[:200]
            if self.stale(c.cid, msg.body.get("answers")):
                log.info("client %d: a late REJECT of an earlier claim ignored (%s)", c.cid,
                         reason)
            elif self.batching:  # the process's hellos refused
                return self._refused_together(c, reason)
            else:
                return c.refuse(reason)
        return NONE

    def _refused_together(self, c: Client, reason: str) -> Events:
        """The server refused the process's hellos (on client c's envelope) as a whole: a
        process of several clients claims them one by one (at its first registration: in
        claim's wait); a process of one is refused (Host.register), or, registered before,
        says hello again shortly."""
        self.batching, self.refusal = False, reason
        if not self.several:
            # a re-registration: e.g. the old connection still holds it
            return c.retry_hello(reason) if self.w is not None else NONE
        log.warning("%s: the server refused to register them together (%s); registering each "
                    "alone", self.table.name(), reason)
        if self.w is not None:  # a re-registration: every client, each alone
            self._claim_alone()
        return NONE

    def _sender(self, cid: int) -> Client:
        return self.roster.by_cid.get(cid) or self.roster.make(cid)

    def hellos(self, ids: np.ndarray) -> None:
        """READY(hellos) for `ids`, proven under launch; its envelope is the first one's."""
        cids = np.sort(np.asarray(ids, dtype=np.int64))
        sender = self._sender(int(cids[0]))
        body = {"phase": "hellos", "device": self.device, "pid": os.getpid(),
                "host": socket.gethostname()[:256]}
        token = self.token()
        if token is not None:  # a reconnect: the server's own token from our WELCOME
            body["token"] = token
        nonce = os.urandom(16)  # names this claim (a REJECT says which claim it answers)
        body["nonce"] = self.asked[int(cids[0])] = nonce
        run_key = self.cred.run_key
        if run_key is not None:
            body["proof"] = hellos_proof(process_secret(run_key), cids.tobytes(), nonce)
        sender.send(Message(MsgKind.READY, sender.name, body=body, arrays={"cids": cids}))

    def stale(self, cid: int, answers: object) -> bool:
        """Whether a REJECT on client cid's envelope answers an earlier claim than its latest
        (one said again after the link came back, or a claim of its own after a refused
        batch): the claim it refused is void, its latest still waits for an answer. A REJECT
        that names no claim (READY(readys) refused) is never stale."""
        return isinstance(answers, bytes) and self.asked.get(cid) != answers

    def take(self, c: Client) -> int:
        """Client c takes its row of the process's WELCOME; returns its examples."""
        assert self.w is not None
        w, i = self.w, self.w.row(c.cid)
        c.drop_work()  # what an earlier server sent is void now
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
        self.kept.clear()  # built under the last WELCOME's settings
        self.cred.admit(w.body.get("peer_keys", []))
        torch.set_num_threads(w.cfg.train.threads)
        mine = np.flatnonzero(self.table.index.rows(w.cids) >= 0)  # WELCOME rows of our ids
        if w.peers:
            return self._welcome_each(w, mine)
        by_cid, roster = self.roster.by_cid, self.roster
        built = np.isin(w.cids[mine], np.fromiter(by_cid, np.int64, len(by_cid)))
        idle = mine[~built]
        counts = np.zeros(mine.size, np.int64)
        counts[~built] = self._idle_counts(w, idle)
        for j in np.flatnonzero(built).tolist():  # the few clients with an object
            c = by_cid[int(w.cids[mine[j]])]
            counts[j] = self.take(c)
            roster.queue(c, c.welcomed())
        self.table.make_idle(self.table.index.rows(w.cids[idle]))
        if mine.size:
            self._readys(w.cids[mine].astype(np.int64), counts)
        return None

    def _welcome_each(self, w: Welcome, mine: np.ndarray) -> None:
        """A run that hands models between clients: every client is built and its peer socket
        listens; READY(readys) says where."""
        roster = self.roster
        cids = w.cids[mine].astype(np.int64)
        counts, ends = np.zeros(cids.size, np.int64), []
        for j, cid in enumerate(cids.tolist()):
            c = roster.by_cid.get(cid) or roster.make(cid, take=False)
            counts[j] = self.take(c)
            roster.queue(c, c.welcomed())
            ends.append(roster.listen(c))
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
        sender.send(Message(MsgKind.READY, sender.name, sender.run_id, body=body,
                            arrays={"cids": cids[order], "n": counts[order]}))

    def on_shutdown(self, msg: Message) -> None:
        """SHUTDOWN for the process's clients named in it (idle ones too)."""
        cids = msg.arrays.get("cids")
        if not isinstance(cids, np.ndarray) or cids.ndim != 1 or cids.dtype.kind not in "iu":
            return log.warning("%s: a SHUTDOWN this process cannot read", self.table.name())
        by_cid = self.roster.by_cid
        if by_cid:
            named = np.isin(np.fromiter(by_cid, np.int64, len(by_cid)), cids)
            for c, hit in zip(list(by_cid.values()), named.tolist()):
                if hit:
                    self.roster.queue(c, c.stop())  # it says BYE and stops (Host._flags)
        self.table.stop_idle(cids)
        return None

    def together(self, done: list[Client], again: list[Client]) -> list[Client]:
        """BYE for the clients whose run ended (`done`, and the idle ones SHUTDOWN named), READY
        (hellos) for the live ones (`again`) and the idle ones when the link came back: one
        message each. Returns the clients that stop: `done`, and one built only to say BYE."""
        stopped = self.table.take_stopped()
        ids = np.sort(np.concatenate([np.array([c.cid for c in done], np.int64), stopped]))
        stop = list(done)
        if ids.size:
            sender = self._byes(ids, done)
            if sender not in done:  # built only to say it: it stops with the others
                stop.append(sender)
        if again:
            self.batching = True  # a refusal: each alone (Host)
            gone = set(stop)
            live = np.array([c.cid for c in again if c not in gone], np.int64)
            self.hellos(np.concatenate([live, self.table.idle_ids()]))
        return stop

    def _byes(self, ids: np.ndarray, done: list[Client]) -> Client:
        """One BYE for `ids`: the totals of their ledgers (and of retired clients) added up;
        returns the client that said it."""
        sender = self._sender(int(ids[0]))
        for c in done:
            c.drop_work()
        total, self.retired = dict(self.retired), {}
        for c in {id(c): c for c in done + [sender]}.values():
            for k, v in c.ledger.totals().items():
                total[k] = total.get(k, 0) + v
        sender.send(Message(MsgKind.BYE, sender.name, sender.run_id, body=total,
                            arrays={"cids": ids}))
        return sender
