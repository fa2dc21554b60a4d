"""Several logical clients in one process (`--clients-per-process N`).

One zmq context, one poll loop and one worker serve N clients, so N clients cost one process:
one fork, one interpreter, one CUDA context on a GPU (a context holds hundreds of MB of device
memory, so 100 separate processes may not fit on one device), and one server connection
(client/link.py): each message on it carries an envelope naming its client. Each logical client
keeps its own identity (proven in its own hello), peer socket, ledger, data and state: the
server's ledger and the clients' see the same messages and bytes as N separate processes would
send. Their tasks run one at a time, in the order they arrived, so clients whose algorithm keeps
no model between tasks share one working model (executor.
share_working_models); before a task starts, every earlier zero-copy send of the process has
left (it may still read that model's memory). Hand-offs between two clients of the same process
travel over their peer sockets like any other, and any wait (for an acknowledgement, a real-time
delay) reads every client's sockets, so a hand-off to a neighbour in the same process is
acknowledged while its sender waits.

The process's clients register together (server/enroll.py is the server's side): one
READY(hellos) for the whole id range, proven under launch with the processes' secret; one
WELCOME, whose arrays carry each client's partition, profile, rejoin token and grant; one
READY(readys) with each client's number of examples. A refused batch falls back to one hello per
client; a reconnect registers each client alone (its rejoin token).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import zmq

from fednet.client.app import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Client
from fednet.client.link import ServerLink, ids_text, register, server_setup
from fednet.core.executor import (natural_examples, num_examples, share_working_models, welcome_config,
                                  welcome_tables)
from fednet.errors import ConfigError
from fednet.network.latency import COLUMNS, Profile
from fednet.platform.proc import check_files_per_process
from fednet.core.plugin_check import checked_welcome
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import hellos_proof, process_secret
from fednet.training import interrupt

log = logging.getLogger("fednet.client")

SOCKETS_PER_CLIENT = 8  # peer socket, hand-off dealers (the server link is the process's)
CHECK_EVERY_S = 0.05  # the clients' liveness checks (launcher, server link) at most this often:
#                       0.2 ms for 63 clients, once per task otherwise


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


class Host:
    """The logical clients of one process, their shared server link and poll loop.

    A client exists as an object only while it has something to do (Welcome, below): after
    the process's batch registration an idle client is its id and its row of the WELCOME's
    arrays; a task for it builds its Client, and a client whose algorithm keeps nothing between
    tasks is retired after each one (its ledger's totals kept for the process's BYE)."""

    def __init__(self, cids: list[int], connect: str, device: str = "cpu",
                 advertise: str = "127.0.0.1", threads: int = 1, secure: str = "",
                 run_key: bytes | None = None, key_name: str = "",
                 curve: tuple[bytes, bytes] | None = None) -> None:
        share_working_models()
        torch.set_num_threads(threads)
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, max(1023, SOCKETS_PER_CLIENT * len(cids) + 64))
        self.auth, self.admitted, self.link = None, None, None
        self.ids = [int(c) for c in cids]
        self.idset = frozenset(self.ids)
        self.by_cid: dict[int, Client] = {}  # the clients that exist now
        self.spec = (connect, device, advertise, threads, secure, run_key, key_name, curve)
        self.poller = zmq.Poller()
        self.by_sock: dict[zmq.Socket, Client] = {}  # peer socket -> its client
        self.rejected: list[Client] = []
        self._current: Client | None = None
        self.files_checked = self.batching = False
        self.run_key, self.lost_timeout = run_key, 60.0
        self.idle: set[int] = set()  # welcomed ids without a Client now
        self.stopped_idle: list[int] = []  # idle ids the run ended for (BYE pending)
        self.retired: dict[str, int] = {}  # retired clients' ledger totals (for BYE)
        self.live: dict[Client, None] = {}
        self.w = None  # the process's WELCOME (enroll.Welcome)
        try:
            self.link = self._open(connect, secure, run_key, key_name, curve)
            self.link.factory = self.materialize
            self.link.label = f"clients {ids_text(self.ids)}"
            self.poller.register(self.link.sock, zmq.POLLIN)
            self.first = self.make(self.ids[0])  # speaks for the process (batch messages)
        except BaseException:  # a client half built (a failed bind) has sockets close() misses
            if self.link is not None:
                self.link.close(0)
            if self.auth is not None:
                self.auth.stop()
            self.ctx.destroy(linger=0)
            raise

    @property
    def clients(self) -> list[Client]:
        """The clients that exist now (see the class)."""
        return list(self.by_cid.values())

    def make(self, cid: int, take: bool = True) -> Client:
        """Client cid's object: built, on the shared link, its part of the WELCOME taken."""
        connect, device, advertise, threads, secure, run_key, key_name, curve = self.spec
        c = Client(cid, connect, device, advertise, threads, secure, ctx=self.ctx,
                   run_key=run_key, key_name=key_name, curve=curve, link=self.link,
                   admitted=self.admitted)
        c.host, c.drop_idle, c.lost_timeout = self, True, self.lost_timeout
        self.by_cid[cid] = c
        if take and self.w is not None and cid in self.w.index:
            self.take(c)
            c.registered = True
        self.idle.discard(cid)
        if self.live or self.first_served:
            self.live[c] = None
        return c

    def materialize(self, sub: bytes) -> Client | None:
        """A message for a client without an object (link.drain): an idle one is built."""
        cid = int.from_bytes(sub, "little") if len(sub) == 4 else -1
        return self.make(cid) if cid in self.idle else None

    def retire(self, c: Client) -> None:
        """c has nothing left to do and keeps nothing between tasks: back to idle."""
        for k, v in c.ledger.totals().items():
            self.retired[k] = self.retired.get(k, 0) + v
        self.link.remove(c)
        self.by_cid.pop(c.cid, None)
        self.live.pop(c, None)
        self.idle.add(c.cid)

    def _retirable(self, c: Client) -> bool:
        return (c is not self.first and self.w is not None and not self.w.peers
                and c.executor is None and not c.work and not c.stopping and c in self.live)

    def _open(self, connect: str, secure: str, run_key: bytes | None, key_name: str,
              curve: tuple[bytes, bytes] | None) -> ServerLink:
        """The shared context's ZAP handler (for the peer sockets) and the server link."""
        keys, gate = None, None
        if secure:  # one ZAP handler for the shared context, admitting the allowed keys
            from fednet.transport import security

            keys = security.load_keys(secure, need_server_secret=False, name=key_name, pair=curve)
            self.admitted = set()  # the run's client keys, from WELCOME
            self.auth = security.start_authenticator(self.ctx, self.admitted)
        elif run_key:  # plaintext launch: only run-key holders complete a handshake
            from fednet.protocol.proof import gate_password
            from fednet.transport.gate import Gate

            gate = gate_password(run_key)
            self.auth = Gate(self.ctx, gate)
        return ServerLink(self.ctx, connect, server_setup(keys, gate), secure=keys is not None)

    def check_files(self) -> None:
        """Before the first peer socket binds (the run hands models over): ConfigError when the
        process's clients would need more open files than its limit."""
        if not self.files_checked:
            self.files_checked = True
            check_files_per_process(len(self.ids))

    def watch(self, sock: zmq.Socket, c: Client) -> None:
        """Poll client c's peer socket (bound when WELCOME says the run hands models over)."""
        self.by_sock[sock] = c
        self.poller.register(sock, zmq.POLLIN)

    def pump(self, timeout_ms: int) -> None:
        """Read the server link and every peer socket (waiting up to timeout_ms for the first
        message)."""
        ready = dict(self.poller.poll(timeout_ms))
        for sock in ready:
            if sock is self.link.sock:
                self.link.drain()
            elif (c := self.by_sock.get(sock)) is not None:
                c.read_peers()

    def register(self, timeout_s: float) -> None:
        """The process's clients register over the shared link: all at once (READY(hellos),
        one WELCOME, READY(readys): server/enroll.py), or each alone if the server refuses the
        batch (link.register). A client the server refuses stops alone; ConfigError when none
        is left."""
        if len(self.ids) > 1 and self.register_together(timeout_s):
            return self._warn_real_time()
        for cid in self.ids:  # each alone, as separate processes would
            if cid not in self.by_cid:
                self.make(cid)
        register(self.link, self.clients, timeout_s)
        for c in self.clients:
            if c.refused is not None:
                log.error("client %d: the server refused it: %s", c.cid, c.refused)
                self._drop(c)
                self.rejected.append(c)
        if len(self.rejected) == len(self.clients):
            raise ConfigError("the server refused every client of this process")
        self._warn_real_time()

    def _warn_real_time(self) -> None:
        if self.first.real and len(self.ids) > 1:
            log.warning("clients %s: --real-time with several clients per process: each waits "
                        "out the others' simulated delays, so wall-clock times are inflated",
                        ids_text(self.ids))

    def _drop(self, c: Client) -> None:
        """Stop reading a client's messages (it stopped; the others go on)."""
        self.link.remove(c)
        if c.peers.sock is not None and self.by_sock.pop(c.peers.sock, None) is not None:
            self.poller.unregister(c.peers.sock)

    first_served = False

    def serve(self) -> int:
        """Run the clients' work in the order it arrived until the run ended for every one of
        them; the exit code is 0 only if all stopped cleanly. A client whose work raises stops
        alone (logged)."""
        self.first_served = True
        self.live = {c: None for c in self.clients if c not in self.rejected}
        worst = EXIT_USAGE if self.rejected else EXIT_OK
        interrupt.install(lambda: self.pump(0) or (self._current is not None
                                                   and self._current.stop_due()))
        check_at = 0.0
        while self.live or self.idle or self.stopped_idle:
            now = time.monotonic()
            if now >= check_at:
                check_at = now + CHECK_EVERY_S
                code = self.first.check_process()  # the launcher, the link: all share them
                if code is not None:
                    return max(worst, code)
                self._flags()
                if not (self.live or self.idle):
                    break
            c = self._next_with_work()
            if c is None:
                self.pump(1000)
                continue
            self._settle()
            self._current = c
            try:
                c.step()
                if self._retirable(c):
                    self.retire(c)
            except interrupt.Interrupted:  # the run ended, or the server or launcher is gone
                log.warning("%s: stopped in the middle of a task", self.link.names())
            except Exception:  # noqa: BLE001 - one client's failure is not its neighbours'
                log.exception("client %d: stopped by an error; the other clients of this process "
                              "go on", c.cid)
                worst = max(worst, EXIT_ERROR)
                self.live.pop(c, None)
                self._drop(c)
            finally:
                self._current = None
        return worst

    def _flags(self) -> None:
        """Act on the clients that something happened to: a SHUTDOWN (BYE, then it stops), a
        link back (register again), a refused re-registration whose wait is over."""
        again, done = [], []
        for c in list(self.link.attention):
            self.link.attention.discard(c)
            if c not in self.live:
                continue
            if c.stopping:
                done.append(c)
                self.live.pop(c)
                continue
            if c.rehello and self.link.lost_since is None:  # the link is back
                c.rehello = False
                again.append(c)
                continue
            c.check_flags()
            if c.rehello_at is not None:  # still waiting: look again next time
                self.link.attention.add(c)
        self.together(done, again)

    def _settle(self) -> None:
        """Wait until every client's last zero-copy send has left: the next task may load a
        received model into the working model those messages still read."""
        for c in self.link.tracked:
            if c._tracker is not None:
                c._tracker.wait()
                c._tracker = None
        self.link.tracked.clear()

    def _next_with_work(self) -> Client | None:
        """The next client with a queued task or hand-off, in the order they arrived; None if
        none has."""
        ready = self.link.ready
        while ready:
            c = ready.popleft()
            if c.work and c in self.live:
                return c
        return None

    def close(self) -> None:
        """Close every client's sockets, the shared link, then the shared context."""
        for c in self.clients:
            c.close()
        self.link.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
        share_working_models(False)  # the next run in this process starts with its own models

    # Registration of the process's clients together, SHUTDOWN and BYE.

    def register_together(self, timeout_s: float) -> bool:
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

    def _hellos(self, ids: list[int]) -> None:
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

    def batch_refused(self, reason: str) -> None:
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

    def take(self, c: Any) -> int:
        """Client c takes its row of the process's WELCOME; returns its examples."""
        w, i = self.w, self.w.index[c.cid]
        c._drop_work()
        tok = w.tokens[i].tobytes() if w.tokens is not None else None
        grant = w.grants[i].tobytes() if w.grants is not None else None
        return c.take_welcome(w.cfg, w.body, w.profile(i), w.part(i), tok, grant, w.tables)

    def on_welcome(self, msg: Message) -> None:
        """The process's WELCOME: kept for the idle clients; the clients with an object take
        their part. One READY(readys) answers for all, or each its own READY(ready) where the
        run hands models between clients (then every client is built: each has a peer socket
        and says where it listens)."""
        w = read_welcome(msg)
        self.w, self.batching = w, False
        torch.set_num_threads(w.cfg.train.threads)
        ids, counts = [], []
        natural = self._natural_counts(w)
        for cid, i in w.index.items():
            if cid not in self.idset:
                continue
            c = self.by_cid.get(cid)
            if c is None and not w.peers:
                self.idle.add(cid)
                n = natural[cid] if natural else num_examples(w.cfg, cid, w.part(i))
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

    def _natural_counts(self, w: Welcome) -> dict[int, int]:
        """The examples of every natural client of this process the WELCOME names (its indices
        are absent: each client's size is the dataset's formula), counted in one call."""
        if w.indices is not None or w.peers:
            return {}
        ids = np.fromiter((c for c in w.index if c in self.idset), np.int64)
        return dict(zip(ids.tolist(), natural_examples(w.cfg, ids).tolist()))

    def on_shutdown(self, msg: Message) -> None:
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

    def together(self, done: list, again: list) -> None:
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

    def _byes(self, ids: list[int], done: list) -> None:
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
