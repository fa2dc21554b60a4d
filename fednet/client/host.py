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

The process's clients register together, and one BYE answers a SHUTDOWN for them all
(client/enroll.py); their ids and idle flags are columns (client/table.py), so an idle client
costs a few bytes, not an object.
"""
from __future__ import annotations

import logging
import resource
import time
from collections.abc import Sequence

import torch
import zmq

from fednet.client.app import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Client
from fednet.client.enroll import Enrollment
from fednet.client.link import ServerLink, register, server_setup
from fednet.config.liveness import DEFAULT, Liveness
from fednet.core.executor import KeptExecutors, share_working_models
from fednet.errors import ConfigError
from fednet.platform.proc import check_files_per_process
from fednet.training import interrupt

log = logging.getLogger("fednet.client")

SOCKETS_PER_CLIENT = 8  # peer socket, hand-off dealers (the server link is the process's)


class Host:
    """The logical clients of one process, their shared server link and poll loop.

    A client exists as an object only while it has something to do: after the process's batch
    registration an idle client is its bit of the idle column and its row of the WELCOME's
    arrays (client/enroll.py); a task for it builds its Client, and a client whose algorithm keeps nothing between
    tasks is retired after each one (its ledger's totals kept for the process's BYE)."""

    def __init__(self, cids: Sequence[int], connect: str, device: str = "cpu",
                 advertise: str = "127.0.0.1", threads: int = 1, secure: str = "",
                 run_key: bytes | None = None, key_name: str = "",
                 curve: tuple[bytes, bytes] | None = None,
                 liveness: Liveness = DEFAULT) -> None:
        share_working_models()
        torch.set_num_threads(threads)
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, max_sockets(len(cids)))
        self.auth, self.admitted, self.link = None, None, None
        self.enroll = Enrollment(self, cids)  # the ids, their WELCOME, SHUTDOWN and BYE
        self.by_cid: dict[int, Client] = {}  # the clients that exist now
        self.kept = KeptExecutors()  # stateless clients' Executors between their tasks
        self.spec = (connect, device, advertise, threads, secure, run_key, key_name, curve)
        self.poller = zmq.Poller()
        self.by_sock: dict[zmq.Socket, Client] = {}  # peer socket -> its client
        self.rejected: list[Client] = []
        self._current: Client | None = None
        self.files_checked = False
        self.run_key, self.lost_timeout = run_key, 60.0
        self.live: dict[Client, None] = {}
        try:
            self.link = self._open(connect, secure, run_key, key_name, curve, liveness)
            self.link.factory = self.materialize
            self.link.label = f"clients {self.enroll.table.text()}"
            self.poller.register(self.link.sock, zmq.POLLIN)
            self.first = self.make(int(self.enroll.table.first))  # speaks for the process (batch messages)
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
        c.host, c.trainer.drop_idle, c.lost_timeout = self, True, self.lost_timeout
        c.trainer.kept = self.kept
        self.by_cid[cid] = c
        w = self.enroll.w
        if take and w is not None and w.row(cid) >= 0:
            self.enroll.take(c)
            c.registered = True
        self.enroll.table.set_idle(cid, False)
        if self.live or self.first_served:
            self.live[c] = None
        return c

    def materialize(self, sub: bytes) -> Client | None:
        """A message for a client without an object (link.drain): an idle one is built."""
        cid = int.from_bytes(sub, "little") if len(sub) == 4 else -1
        return self.make(cid) if self.enroll.table.is_idle(cid) else None

    def retire(self, c: Client) -> None:
        """c has nothing left to do and keeps nothing between tasks: back to idle."""
        self.enroll.keep_totals(c)
        self.link.remove(c)
        self.by_cid.pop(c.cid, None)
        self.live.pop(c, None)
        self.enroll.table.set_idle(c.cid, True)

    def _retirable(self, c: Client) -> bool:
        w = self.enroll.w
        return (c is not self.first and w is not None and not w.peers
                and c.trainer.executor is None and not c.work and not c.stopping and c in self.live)

    def _open(self, connect: str, secure: str, run_key: bytes | None, key_name: str,
              curve: tuple[bytes, bytes] | None, liveness: Liveness) -> ServerLink:
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
        return ServerLink(self.ctx, connect, server_setup(keys, gate), secure=keys is not None,
                          liveness=liveness)

    def check_files(self) -> None:
        """Before the first peer socket binds (the run hands models over): ConfigError when the
        process's clients would need more open files than its limit."""
        if not self.files_checked:
            self.files_checked = True
            check_files_per_process(len(self.enroll.table))

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
        one WELCOME, READY(readys): server/registrar.py), or each alone if the server refuses the
        batch (link.register). A client the server refuses stops alone; ConfigError when none
        is left."""
        table = self.enroll.table
        if len(table) > 1 and self.enroll.register_together(timeout_s):
            return self._warn_real_time()
        for cid in table.index.ids().tolist():  # each alone, as separate processes would
            if cid not in self.by_cid:
                self.make(cid)
        register(self.link, self.clients, timeout_s)
        for c in self.clients:
            if c.refused is not None:
                log.error("client %d: the server refused it: %s", c.cid, c.refused)
                self.drop(c)
                self.rejected.append(c)
        if len(self.rejected) == len(self.clients):
            raise ConfigError("the server refused every client of this process")
        self._warn_real_time()

    def _warn_real_time(self) -> None:
        if self.first.trainer.real and len(self.enroll.table) > 1:
            log.warning("clients %s: --real-time with several clients per process: each waits "
                        "out the others' simulated delays, so wall-clock times are inflated",
                        self.enroll.table.text())

    def drop(self, c: Client) -> None:
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
        table = self.enroll.table
        while self.live or table.n_idle or table.n_stopped:
            now = time.monotonic()
            if now >= check_at:
                check_at = now + self.link.liveness.check_s  # 0.2 ms for 63 clients
                code = self.first.check_process()  # the launcher, the link: all share them
                if code is not None:
                    return max(worst, code)
                self._flags()
                if not (self.live or table.n_idle):
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
                self.drop(c)
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
        self.enroll.together(done, again)

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
        self.kept.clear()
        for c in self.clients:
            c.close()
        self.link.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
        share_working_models(False)  # the next run in this process starts with its own models


def max_sockets(clients: int) -> int:
    """The shared context's socket limit: SOCKETS_PER_CLIENT a client, but no more than the
    process may open files (each socket holds one, its mailbox's): libzmq allocates 12 bytes
    for every socket it may ever open, 60 MB in each process of 625,000 clients."""
    want = SOCKETS_PER_CLIENT * clients + 64
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if files != resource.RLIM_INFINITY:
        want = min(want, files)
    return max(1023, want)
