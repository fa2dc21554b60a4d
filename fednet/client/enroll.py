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
from typing import TYPE_CHECKING

import numpy as np
import torch

from fednet.client.executor import welcome_config, welcome_tables
from fednet.errors import ConfigError
from fednet.latency import COLUMNS, Profile
from fednet.plugin_check import checked_welcome
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import hellos_proof, process_secret

if TYPE_CHECKING:
    from fednet.client.host import Host

log = logging.getLogger("fednet.client")


class Enroll:
    """Registration of all of a Host's clients at once (mixed into Host)."""

    def _hellos(self: Host, clients: list | None = None) -> None:
        """READY(hellos) for `clients` (default: every client of the process), proven under
        launch; its envelope is the first one's."""
        clients = self.clients if clients is None else clients
        first = clients[0]
        cids = np.array([c.cid for c in clients], dtype=np.int64)
        body = {"phase": "hellos", "device": first.device, "pid": os.getpid(),
                "host": socket.gethostname()[:256]}
        if self.run_key is not None:
            nonce = os.urandom(16)
            body.update(nonce=nonce, proof=hellos_proof(process_secret(self.run_key),
                                                        cids.tobytes(), nonce))
        first._send_server(Message(MsgKind.READY, first.name, body=body, arrays={"cids": cids}))

    def batch_refused(self: Host, reason: str) -> None:
        """The server refused the process's hellos: each client registers alone."""
        log.warning("%s: the server refused to register them together (%s); registering each "
                    "alone", self.link.names(), reason)
        self.batching = False
        for c in self.clients:
            if c.server.sub in self.link.clients:  # not stopped meanwhile
                c.hello()

    def on_welcome(self: Host, msg: Message) -> None:
        """The process's WELCOME: each client takes its part (client.take_welcome); one
        READY(readys) answers for all, or each its own READY(ready) where the run hands models
        between clients (each says where its peer socket listens)."""
        self.batching = False
        b = checked_welcome(msg.body)
        cfg = welcome_config(b)
        a, peers = msg.arrays, bool(b.get("peers"))
        tables = welcome_tables(cfg, a, peers)
        torch.set_num_threads(cfg.train.threads)
        try:
            cids, off, idx = a["cids"].tolist(), a.get("offsets"), a.get("indices")
            off = off.tolist() if off is not None else None  # None: natural clients
            rows, tokens, grants = a["client_profiles"].tolist(), a.get("tokens"), a.get("grants")
            parts = [(i, self.by_cid[c]) for i, c in enumerate(cids) if c in self.by_cid]
        except (KeyError, AttributeError, TypeError) as e:
            raise ConfigError(f"the server sent a WELCOME this process cannot use ({e}); are "
                              "both on the same fednet version?") from None
        shared: dict[tuple, Profile] = {}  # clients with equal profiles share one object
        done: list[tuple[int, int]] = []
        for i, c in parts:
            row = tuple(rows[i])
            prof = shared.setdefault(row, Profile.from_dict(dict(zip(COLUMNS, row))))
            c._drop_work()
            part = idx[off[i]:off[i + 1]] if idx is not None and off is not None else None
            n = c.take_welcome(cfg, b, prof, part,
                               tokens[i].tobytes() if tokens is not None else None,
                               grants[i].tobytes() if grants is not None else None, tables)
            if peers:
                c.send_ready(n, True)
            done.append((c.cid, n))
            if not c.registered:
                c.registered = True
                self.link.settled.append(c)
        if done and not peers:
            first = self.by_cid[done[0][0]]  # its envelope: the batch's first id
            arr = np.array(done, dtype=np.int64)
            first._send_server(Message(MsgKind.READY, first.name, first.run_id,
                                       body={"phase": "readys"},
                                       arrays={"cids": arr[:, 0].copy(), "n": arr[:, 1].copy()}))

    def on_shutdown(self: Host, msg: Message) -> None:
        """SHUTDOWN for the process's clients named in it."""
        try:
            ids = msg.arrays["cids"].tolist()
        except (AttributeError, TypeError):
            return log.warning("%s: a SHUTDOWN this process cannot read", self.link.names())
        for cid in ids:
            c = self.by_cid.get(cid)
            if c is not None:
                c.stopping = True
                self.link.attention.add(c)
        return None

    def byes(self: Host, clients: list) -> None:
        """One BYE for `clients` (their ledgers' totals added up; the envelope of the first)."""
        for c in clients:
            c._drop_work()
        total: dict[str, int] = {}
        for c in clients:
            for k, v in c.ledger.totals().items():
                total[k] = total.get(k, 0) + v
        first = clients[0]
        cids = np.array([c.cid for c in clients], dtype=np.int64)
        first._send_server(Message(MsgKind.BYE, first.name, first.run_id, body=total,
                                   arrays={"cids": cids}))

    def together(self: Host, done: list, again: list) -> None:
        """BYE for the clients whose run ended (`done`), READY(hellos) for those whose link came
        back (`again`): one message for each group of several."""
        if len(done) > 1:
            self.byes(sorted(done, key=lambda c: c.cid))
        elif done:
            done[0].bye()
        for c in done:
            self._drop(c)
        if len(again) > 1:  # a refusal: each alone (batch_refused)
            self.batching = True
            self._hellos(sorted(again, key=lambda c: c.cid))
        elif again:
            again[0].hello()
