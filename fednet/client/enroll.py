"""A client process's clients registered together (Host's half; server/enroll.py is the
server's): one READY(hellos) for the whole id range, proven under launch with the processes'
secret; one WELCOME, whose arrays carry each client's partition, profile, rejoin token and
grant; one READY(readys) with each client's number of examples. A refused batch falls back to
one hello per client; a reconnect registers each client alone (its rejoin token).
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

from fednet.core.executor import num_examples, welcome_config, welcome_tables
from fednet.errors import ConfigError
from fednet.network.latency import COLUMNS, Profile
from fednet.plugins.check import checked_welcome
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import hellos_proof, process_secret

if TYPE_CHECKING:
    from fednet.client.host import Host

log = logging.getLogger("fednet.client")


@dataclass
class Welcome:
    """The process's WELCOME, kept for the clients that have no object yet: the run's settings
    once, and each client's row of its arrays (index: cid -> row)."""

    cfg: Any
    body: dict
    tables: tuple
    index: dict[int, int]
    offsets: list[int] | None
    indices: Any
    rows: Any  # (n, 4) float64: latency.COLUMNS
    tokens: Any
    grants: Any
    peers: bool
    shared: dict = field(default_factory=dict)  # profiles by value: equal ones are one object

    def profile(self, i: int) -> Profile:
        row = tuple(self.rows[i].tolist())
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
        cids, off = a["cids"].tolist(), a.get("offsets")
        return Welcome(cfg, b, welcome_tables(cfg, a, peers), {c: i for i, c in enumerate(cids)},
                       off.tolist() if off is not None else None, a.get("indices"),
                       a["client_profiles"], a.get("tokens"), a.get("grants"), peers)
    except (KeyError, AttributeError, TypeError) as e:
        raise ConfigError(f"the server sent a WELCOME this process cannot use ({e}); are "
                          "both on the same fednet version?") from None


class Enroll:
    """Registration of all of a Host's clients at once (mixed into Host)."""

    def register_together(self: Host, timeout_s: float) -> bool:
        """READY(hellos) for every id, then wait for the process's WELCOME; False when the server
        refused the batch (then each registers alone). ConfigError on no answer."""
        self.batching = True
        self._hellos(self.ids)
        deadline, recheck = time.monotonic() + timeout_s, time.monotonic() + 1.0
        while self.w is None and self.batching:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.link.no_answer(timeout_s)
            if self.link.sock.poll(int(min(left, 1.0) * 1000)):
                self.link.drain()
            if time.monotonic() >= recheck:  # the link dropped and came back: say it again
                recheck = time.monotonic() + 1.0
                self.link.watch()
                if self.first.rehello:
                    self.first.rehello = False
                    self._hellos(self.ids)
        return self.w is not None

    def _hellos(self: Host, ids: list[int]) -> None:
        """READY(hellos) for `ids`, proven under launch; its envelope is the first one's."""
        ids = sorted(ids)
        sender = self.by_cid.get(ids[0]) or self.make(ids[0])
        cids = np.array(ids, dtype=np.int64)
        body = {"phase": "hellos", "device": sender.device, "pid": os.getpid(),
                "host": socket.gethostname()[:256]}
        if self.run_key is not None:
            nonce = os.urandom(16)
            body.update(nonce=nonce, proof=hellos_proof(process_secret(self.run_key),
                                                        cids.tobytes(), nonce))
        sender._send_server(Message(MsgKind.READY, sender.name, body=body,
                                    arrays={"cids": cids}))

    def batch_refused(self: Host, reason: str) -> None:
        """The server refused the process's hellos: each client registers alone."""
        log.warning("%s: the server refused to register them together (%s); registering each "
                    "alone", self.link.names(), reason)
        self.batching = False
        if self.w is not None:  # a re-registration: every client, each alone
            for cid in list(self.idle):
                self.make(cid)
            for c in self.clients:
                if c.server.sub in self.link.clients:  # not stopped meanwhile
                    c.hello()

    def take(self: Host, c: Any) -> int:
        """Client c takes its row of the process's WELCOME; returns its examples."""
        w, i = self.w, self.w.index[c.cid]
        c._drop_work()
        tok = w.tokens[i].tobytes() if w.tokens is not None else None
        grant = w.grants[i].tobytes() if w.grants is not None else None
        return c.take_welcome(w.cfg, w.body, w.profile(i), w.part(i), tok, grant, w.tables)

    def on_welcome(self: Host, msg: Message) -> None:
        """The process's WELCOME: kept for the idle clients; the clients with an object take
        their part. One READY(readys) answers for all, or each its own READY(ready) where the
        run hands models between clients (then every client is built: each has a peer socket
        and says where it listens)."""
        w = read_welcome(msg)
        self.w, self.batching = w, False
        torch.set_num_threads(w.cfg.train.threads)
        ids, counts = [], []
        for cid, i in w.index.items():
            if cid not in self.idset:
                continue
            c = self.by_cid.get(cid)
            if c is None and not w.peers:
                self.idle.add(cid)
                n = num_examples(w.cfg, cid, w.part(i))
            else:
                c = c if c is not None else self.make(cid, take=False)
                n = self.take(c)
                c.registered = True
                if w.peers:
                    c.send_ready(n, True)
            ids.append(cid)
            counts.append(n)
        if ids and not w.peers:
            sender = self.by_cid.get(min(ids)) or self.make(min(ids))
            order = np.argsort(np.array(ids))
            arrays = {"cids": np.array(ids, np.int64)[order],
                      "n": np.array(counts, np.int64)[order]}
            sender._send_server(Message(MsgKind.READY, sender.name, sender.run_id,
                                        body={"phase": "readys"}, arrays=arrays))

    def on_shutdown(self: Host, msg: Message) -> None:
        """SHUTDOWN for the process's clients named in it (idle ones too)."""
        try:
            ids = msg.arrays["cids"].tolist()
        except (AttributeError, TypeError):
            return log.warning("%s: a SHUTDOWN this process cannot read", self.link.names())
        for cid in ids:
            c = self.by_cid.get(cid)
            if c is not None:
                c.stopping = True
                self.link.attention.add(c)
            elif cid in self.idle:
                self.idle.discard(cid)
                self.stopped_idle.append(cid)
        return None

    def together(self: Host, done: list, again: list) -> None:
        """BYE for the clients whose run ended (`done`, and the idle ones SHUTDOWN named), READY
        (hellos) for all when the link came back (`again`): one message each."""
        ids = sorted([c.cid for c in done] + self.stopped_idle)
        if len(ids) > 1 or (ids and not done):
            self._byes(ids, done)
        elif done:
            done[0].bye()
        for c in done:
            self._drop(c)
        self.stopped_idle = []
        if again and len(self.ids) > 1 and self.w is not None:
            self.batching = True  # a refusal: each alone (batch_refused)
            self._hellos([c.cid for c in self.live] + list(self.idle))
        elif again:
            for c in again:
                c.hello()

    def _byes(self: Host, ids: list[int], done: list) -> None:
        """One BYE for `ids`: the totals of their ledgers (and of retired clients) added up."""
        sender = self.by_cid.get(ids[0]) or self.make(ids[0])
        for c in done:
            c._drop_work()
        total, self.retired = dict(self.retired), {}
        for c in {id(c): c for c in done + [sender]}.values():
            for k, v in c.ledger.totals().items():
                total[k] = total.get(k, 0) + v
        sender._send_server(Message(MsgKind.BYE, sender.name, sender.run_id, body=total,
                                    arrays={"cids": np.array(ids, dtype=np.int64)}))
        if sender not in done:  # built only to say it: it stops with the others
            self.live.pop(sender, None)
            self._drop(sender)
