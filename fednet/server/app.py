"""The ZeroMQ server (ZmqServer, a Dispatcher): registration, task dispatch, result collection,
shutdown; and what arrives: every message from a connection is accepted (and only then counted)
or rejected, by who sent it, for which run, and whether it was expected. One class, one module:
its state and the handlers that change it (a client process's batch registration is enroll.py's,
the connections' bookkeeping conns.py's)."""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from fednet.core.replies import receive
from fednet.core.rounds import FollowUp
from fednet.core.session import Session
from fednet.core.wire import task_message
from fednet.log import Throttle
from fednet.metrics.accounting import SERVER
from fednet.network import latency
from fednet.network.availability import Trace
from fednet.core.plugin_check import welcome_plugins
from fednet.protocol import Message, MsgKind, peek_kind
from fednet.protocol.proof import grant_key, route_grants
from fednet.server.conns import LOST_GRACE_S, Connections, Identity
from fednet.server.book import ClientBook
from fednet.server.hops import Hops
from fednet.server.enroll import (HELLO_EVERY_S, by_connection, late_byes, on_byes, on_hellos,
                                  on_readys)
from fednet.server.inflight import next_task, process_cap
from fednet.transport.channels import (SUB_BYTES, Channel, Deferred, Received, bind_router,
                                       server_context, sub_frame)
from fednet.transport.monitor import open_monitor, stop_monitor
from fednet.data.partition import part_size
from fednet.types import ClientInfo, Failure, Result, Roster, Task, client_name

log = logging.getLogger("fednet.server")
UNPROVEN_BYTES = 64 << 10
"""Array bytes a connection that holds no client id may have read beside its ids' (a READY)."""
throttled = Throttle(log)

DeathWatch = Callable[[], dict[int, str]]
UNREACHABLE = "client unreachable"
REJECTS_PER_S = 50  # REJECT replies per second at most (the rest are only counted)

FROM_CLIENTS = frozenset({MsgKind.READY, MsgKind.RESULT, MsgKind.FAILURE, MsgKind.HOP_DONE,
                          MsgKind.BYE, MsgKind.HEARTBEAT})


class ZmqServer:
    """One ROUTER socket; clients register with READY and receive TASKs."""

    def __init__(self, session: Session, host: str = "127.0.0.1", port: int = 0,
                 bound: tuple[zmq.Context, zmq.Socket, str] | None = None,
                 identity: Identity | None = None) -> None:
        self.s = session
        if bound is None:
            ctx = server_context()
            bound = (ctx, *bind_router(ctx, host, port))
        self.ctx, self.sock, self.endpoint = bound
        self.chan = Channel(self.sock, session.ledger, SERVER, router=True, enveloped=True)
        self.conns = Connections(identity or Identity())
        self.chan.known = self.conns.cid_of.__contains__  # the others are lumped in the log
        self.monitor = open_monitor(self.sock, zmq.EVENT_DISCONNECTED)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self._hello_at: dict[bytes, float] = {}
        self._profiles_array: Any = None  # a latency trace as WELCOME carries it (intake)
        self._reject_window, self._rejects_sent = 0.0, 0
        self.clients = ClientBook(session.cfg.clients, lambda c: part_size(session.parts, c))
        self._live: tuple[tuple[int, int, int], Roster] | None = None  # (_roster)
        self.hello: dict[int, dict[str, Any]] = {}
        self.dead: dict[int, str] = {}
        self.byes: dict[int, dict[str, Any]] = {}
        self.clean_exits: set[int] = set()  # exited with code 0 after SHUTDOWN, BYE not read
        self.watch: DeathWatch | None = None
        self.round = 0  # the round in progress, or the next one between rounds
        self.death_round: dict[int, int] = {}
        self._pending: dict[int, Task] = {}
        self._replies: list[Result | Failure] = []
        self._on_reply: FollowUp | None = None
        self._queue: deque[Task] = deque()  # tasks waiting for room under net.max_inflight
        self._filling = False
        # at most this many tasks out to one client process (0: no cap; server/inflight.py)
        self.tasks_per_process = process_cap(session.cfg, session.evaluator.model_bytes)
        self._accepting = True
        self._progress = time.monotonic()
        self.shutting_down = False
        self._holder: dict[int, int] = {}  # task id -> route index of the client holding it
        self.hops = Hops(session.run_id, session.handoff_codec)  # routed tasks' hand-offs

    # ---- helpers -------------------------------------------------------------------------
    def _send(self, cid: int, msg: Message) -> bool:
        route = self.conns.route_of.get(cid)
        if route is None:
            throttled.warning("cannot reach client %d: it has no connection", cid)
            return False
        try:
            self.chan.send(msg, client_name(cid), route=route, block=False)
            return True
        except zmq.Again:  # its queue is full: it has not read for a long time
            throttled.warning("cannot reach client %d: it does not read its messages", cid)
            return False
        except zmq.ZMQError as e:  # ROUTER_MANDATORY: the client is not connected (any more)
            self.conns.lost.setdefault(cid, time.monotonic())  # before the monitor says so
            throttled.warning("cannot reach client %d: %s", cid, e.strerror)
            return False

    def _check_deaths(self) -> None:
        # under `fednet launch` the zygote reports a dead process with its exit code within
        # moments; a lost connection decides only after a longer grace (a frozen process)
        grace = LOST_GRACE_S if self.watch is None else 3 * LOST_GRACE_S
        lost = {cid: "connection lost (no answer to heartbeats, or closed)"
                for cid in self.conns.gone(grace) if cid in self.clients or cid in self.hello}
        found = dict(self.watch()) if self.watch is not None else {}
        for cid, why in {**lost, **found}.items():
            self.conns.release(cid)  # its id is free: a restarted client may claim it again
            if cid not in self.dead:
                self.dead[cid] = why
                self.death_round[cid] = self.round
                normal = cid in self.byes or (self.shutting_down and why.endswith("code 0"))
                if normal:  # an exit after SHUTDOWN is the normal end (its BYE may be queued)
                    self.clean_exits.add(cid)
                else:
                    throttled.warning("client %d is gone: %s", cid, why)
        for tid, task in list(self._pending.items()):
            if tid not in self._pending:  # failed meanwhile (a follow-up could not be sent)
                continue
            holder = task.route[self._holder.get(tid, task.hop)]  # later dead peers are skipped
            if holder in self.dead:
                self._fail(tid, f"client {holder} died holding the model: {self.dead[holder]}")

    def _fail(self, tid: int, reason: str) -> None:
        task = self._pending.pop(tid)
        self._holder.pop(tid, None)
        self._reply(Failure(tid, task.round, task.route[-1], reason, task.sim_time))

    def _reply(self, done: Result | Failure) -> None:
        """Record a reply; the round's callback sees it at once (a streaming algorithm folds it
        in, an asynchronous one releases follow-up tasks, dispatched here)."""
        self._replies.append(done)
        if self._on_reply is not None:
            if self._accepting:
                self._queue.extend(self._on_reply(done))
                self._fill()
            else:
                self._on_reply(done)

    def _fill(self) -> None:
        """Send queued tasks while there is room (server/inflight.py: --max-inflight, and a
        process's share for big models).

        Not re-entrant: a send that fails records a Failure, whose follow-ups join the queue
        that the running loop is already emptying (no recursion however many sends fail)."""
        if self._filling:
            return
        self._filling = True
        try:
            while (task := next_task(self._queue, self._pending, self.s.cfg.net.max_inflight,
                                     self.tasks_per_process, self._process_of)) is not None:
                self._dispatch(task)
        finally:
            self._filling = False

    def _process_of(self, cid: int) -> Hashable:
        """The client process that holds client cid (the host and pid of its hello)."""
        return self.clients.process_of(cid) or cid

    def _poll_once(self, timeout_s: float) -> None:
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        if self.monitor in ready:
            self._read_monitor()
        self.conns.trim_memory()
        if self.sock not in ready:
            return
        for _ in range(1000):  # drain what is queued without starving the death watch
            got = self.chan.recv(admit=self._admit)  # (nothing deferred: a Received or None)
            assert not isinstance(got, Deferred)
            if got is None and self.chan.refused is not None:
                self._refused_reply(*self.chan.refused)
            if got is not None:
                try:
                    self._handle(got)
                except Exception as e:  # noqa: BLE001 - one message never stops the server
                    log.exception("message %s from %s could not be handled", got.msg.kind.name,
                                  got.msg.sender[:40])
                    self.chan.reject(got, f"could not be handled: {type(e).__name__}")
            if not self.sock.poll(0, zmq.POLLIN):
                return

    # ---- Dispatcher ----------------------------------------------------------------------
    def wait_for_clients(self, n: int, timeout_s: float) -> None:
        """Block until n clients registered, or raise TimeoutError naming how many came."""
        deadline = time.monotonic() + timeout_s
        while len(self.clients) < n:
            self._check_deaths()
            if self.dead and len(self.clients) + len(self.dead) >= n and not self._missing(n):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.clients)} of {n} clients registered within "
                                   f"{timeout_s:.0f}s")
            self._poll_once(0.05)

    def _missing(self, n: int) -> list[int]:
        return [c for c in range(n) if c not in self.clients and c not in self.dead]

    def alive_clients(self) -> Roster:
        """Registered clients that have not died. A client whose connection was just lost is
        waited for (it comes back, or its grace runs out and it is dead): a round never starts
        with clients it cannot reach."""
        deadline = time.monotonic() + 3 * LOST_GRACE_S + 1.0
        while time.monotonic() < deadline:
            self._check_deaths()
            if not any(c in self.clients and c not in self.dead for c in self.conns.lost):
                break
            self._poll_once(0.05)
        return self._roster()

    def _roster(self) -> Roster:
        """The live registered clients as a roster (fednet.types), rebuilt only when a client
        came or died since the last one (sorting a million ids took seconds every step)."""
        key = (len(self.clients), len(self.dead), self.conns.binds)
        if self._live is None or self._live[0] != key:
            ids = self.clients.ids()
            if self.dead:
                ids = ids[~np.isin(ids, np.fromiter(self.dead, np.int64, len(self.dead)))]
            self._live = (key, self.clients.roster(ids))
        return self._live[1]

    def _dispatch(self, task: Task) -> None:
        self._pending[task.task_id] = task
        msg = task_message(task, self.s.run_id)
        if len(task.route) > 1:  # peers find each other through the route itself
            msg.body["endpoints"] = [self.clients[c].endpoint if c in self.clients else ""
                                     for c in task.route]
            if self.conns.ident.key_ids:  # --secure: each peer's key, to check the hand-off's
                b = msg.body  # sender, and every hop's grant of all a hand-off tells (proof.py)
                b["keys"] = [self.conns.key_of.get(c, "") for c in task.route]
                b["grants"] = route_grants(self.conns.ident.grants, self.s.run_id, task.round,
                                           task.task_id, task.route, b["keys"], b["endpoints"],
                                           task.kind, b["body"])
        if len(task.route) > 1:
            self.hops.send(task, msg.body, self.s.algo.result_layout(task))
        if not self._send(task.cid, msg):
            if task.cid in self.conns.lost and task.cid not in self.dead:
                return  # its connection just closed: it fails as dead after the grace
            self._fail(task.task_id, UNREACHABLE)

    def run_round(self, rnd: int, tasks: list[Task], follow: FollowUp | None = None
                  ) -> tuple[list[Result], list[Failure]]:
        """Send every task, then collect results until all arrived, died or timed out.

        `follow` sees each reply the moment it arrives; tasks it returns are sent at once
        (asynchronous slots).
        """
        self._replies = []
        self.round = rnd
        self.hops.new_round(rnd)
        self._on_reply, self._accepting = follow, True
        self._queue.extend(tasks)
        timeout = self.s.cfg.net.round_timeout
        self._progress = time.monotonic()  # results and HOP_DONEs move it: chains may be long
        try:
            self._fill()
            while self._pending or self._queue:
                self._fill()
                self._check_deaths()
                if time.monotonic() - self._progress > timeout:
                    self._accepting = False  # what is pending fails; nothing new is started
                    why = f"no progress within --round-timeout {timeout:g}s"
                    for task in self._queue:
                        self._pending[task.task_id] = task
                        self._fail(task.task_id, why + " (never sent: no room under "
                                   "--max-inflight or its process's share)")
                    self._queue.clear()
                    for tid in list(self._pending):
                        self._fail(tid, why)
                    break
                self._poll_once(0.05)
        finally:  # also when a callback raised: no stale task survives into the next round
            self._on_reply, self._accepting = None, True
            self._queue.clear()
        results = [r for r in self._replies if isinstance(r, Result)]
        failures = [r for r in self._replies if isinstance(r, Failure)]
        self._check_deaths()  # a send can fail before the exit of its client is reported
        for f in failures:
            if f.reason == UNREACHABLE and f.cid in self.dead:
                f.reason = f"{UNREACHABLE}: {self.dead[f.cid]}"
        self.round = rnd + 1
        return results, failures

    def untasked_deaths(self, failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Failure rows for clients that died while holding no task (between rounds, at start)."""
        seen = {f.get("client") for f in failures}
        return [{"round": self.death_round.get(cid, self.round), "client": cid, "task": None,
                 "reason": f"client died: {why}"}
                for cid, why in sorted(self.dead.items())
                if cid not in self.byes and cid not in self.clean_exits and cid not in seen]

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """SHUTDOWN to every live client; wait briefly for their BYE."""
        self.shutting_down = True
        targets = self._roster().ids.tolist()
        for ids in by_connection(self.conns.route_of, targets):  # one per process (enroll.py)
            arrays = {"cids": np.array(ids, np.int64)} if len(ids) > 1 else {}
            self._send(ids[0], Message(MsgKind.SHUTDOWN, SERVER, self.s.run_id, arrays=arrays))
        deadline, i = time.monotonic() + timeout_s, 0
        while i < len(targets):  # a cursor: each client is checked until it is done, once
            if targets[i] in self.byes or targets[i] in self.dead:
                i += 1
                continue
            if time.monotonic() > deadline:
                break
            self._check_deaths()
            self._poll_once(0.05)

    def close(self) -> None:
        """Close the socket and the context."""
        stop_monitor(self.sock, self.monitor)  # never hangs while connections close
        self.sock.close(linger=100)  # after SHUTDOWN and BYE nothing is left worth waiting for
        self.ctx.term()

    # What arrives: each message accepted (and only then counted) or rejected.

    def _read_monitor(self) -> None:
        for _ in range(10_000):
            if not self.monitor.poll(0):
                break
            ev = parse_monitor_message(self.monitor.recv_multipart())
            if ev["event"] == zmq.EVENT_DISCONNECTED:
                self.conns.disconnected(int(ev["value"]))

    def _admit(self, route: bytes, frames: list[Any]) -> str:
        """Why a message is not read at all ('' when it is): a connection that holds no client
        id may send only a registration (READY) or, its client just released, its BYE, with no
        more array bytes than the run's ids take; nothing else it sends is joined into memory
        (what it costs is libzmq's buffer of it, freed at once)."""
        if route in self.conns.cid_of:
            return ""
        kind = peek_kind(frames)
        arrays = sum(len(f) for f in frames[1:])
        if kind == MsgKind.READY or (kind == MsgKind.BYE and route in self.conns.released):
            most = 8 * self.s.cfg.clients + UNPROVEN_BYTES
            return "" if arrays <= most else (
                f"{kind.name} with {arrays} bytes of arrays (at most {most}) from a connection "
                "that is no client")
        return (f"{kind.name if kind is not None else 'a message'} from a connection that is no "
                f"client ({arrays} bytes of arrays not read)")

    def _refused_reply(self, route: bytes, kind: MsgKind | None, why: str) -> None:
        """A bound client's reply that could not be decoded ends its task at once (its
        client's failure), rather than holding the round until --round-timeout."""
        cid = self.conns.cid_of.get(route)
        if cid is None or kind not in (MsgKind.RESULT, MsgKind.FAILURE):
            return
        for tid, task in list(self._pending.items()):
            if tid in self._pending and task.route[self._holder.get(tid, task.hop)] == cid:
                self._fail(tid, f"client {cid}'s reply could not be read: {why}"[:500])

    def _handle(self, got: Received) -> None:
        """Accept (and account) a message only from the connection bound to its client, for
        this run, when it is expected; everything else is counted as rejected."""
        msg = got.msg
        if got.fd >= 0 and self.conns.route_fd.get(got.route) != got.fd:
            self._read_monitor()  # a new connection, maybe on a reused fd: its older events first
        self.conns.seen(got.route, got.fd)
        if msg.kind not in FROM_CLIENTS:
            return self.chan.reject(got, f"{msg.kind.name} is not sent to the server")
        if msg.kind == MsgKind.READY and msg.body["phase"] in ("hello", "hellos"):
            return self._on_hello(got) if msg.body["phase"] == "hello" else on_hellos(self, got)
        cid = self.conns.cid_of.get(got.route)
        if cid is None:
            late = self.conns.released.get(got.route)  # its client exited with the BYE queued
            if (msg.kind == MsgKind.BYE and late is not None and msg.sender == client_name(late)
                    and msg.run_id == self.s.run_id):
                return late_byes(self, got, late)
            return self.chan.reject(got, f"{msg.kind.name} from a connection that is no client")
        if msg.sender != client_name(cid):
            return self.chan.reject(got, f"sender {msg.sender[:40]!r} on client {cid}'s connection")
        if msg.kind == MsgKind.READY:
            return self._on_ready(cid, got)
        if msg.run_id != self.s.run_id:  # e.g. results of a server before a --resume
            return self.chan.reject(got, f"{msg.kind.name} of another run or server start")
        if msg.kind in (MsgKind.RESULT, MsgKind.FAILURE):
            self._on_result(cid, got)
        elif msg.kind == MsgKind.HOP_DONE:
            self._on_hop_done(cid, got)
        elif msg.kind == MsgKind.BYE and "cids" in msg.arrays:  # a whole process's clients
            on_byes(self, got)
        elif msg.kind == MsgKind.BYE:
            self.chan.accept(got, client_name(cid))
            self.byes[cid] = dict(msg.body)
        else:  # HEARTBEAT
            self.chan.accept(got, client_name(cid))

    def _on_result(self, cid: int, got: Received) -> None:
        """A RESULT or FAILURE: only for a task still pending, sent to this client, this round."""
        msg = got.msg
        task = self._pending.get(msg.task_id)
        if task is None or cid not in task.route or msg.round != task.round:
            return self.chan.reject(got, f"unexpected {msg.kind.name} for task {msg.task_id}")
        self.chan.accept(got, client_name(cid))
        self._pending.pop(msg.task_id)
        self._holder.pop(msg.task_id, None)
        self._progress = time.monotonic()
        done = receive(self.s, msg, cid, got.nbytes, task)
        # --availability: offline before the result arrived?
        self._reply(self.s.driver.churn.upload(done, msg.sim_time, msg.body.get("skipped", 0)))

    def _on_hop_done(self, cid: int, got: Received) -> None:
        """A ring's hand-off report. It may arrive after the task's RESULT (another connection):
        any task sent in this round or the last, once per hop, from the client that held it."""
        msg, b = got.msg, got.msg.body
        why = self.hops.problem(cid, msg)
        if why:
            return self.chan.reject(got, why)
        self.chan.accept(got, client_name(cid))
        self._progress = time.monotonic()
        if msg.task_id in self._pending:
            self._holder[msg.task_id] = b["to"]
        self.hops.count(self.s.ledger, cid, msg)
        if b.get("skipped"):  # offline peers passed over
            self.s.driver.churn.note(msg.round, b["skipped"])

    def _on_hello(self, got: Received) -> None:
        b = got.msg.body
        cid = b["cid"]
        if got.msg.sender != client_name(cid) or got.route[-SUB_BYTES:] != sub_frame(cid):
            return self.chan.reject(got, "hello whose sender or envelope is not its cid")
        if cid >= self.s.cfg.clients:
            self.chan.reject(got, "client id out of range")
            return self._send_reject(got, f"client id out of range: this run has "
                                          f"{self.s.cfg.clients} clients")
        now = time.monotonic()
        if now - self._hello_at.get(got.route, -1e9) < HELLO_EVERY_S:
            return self.chan.reject(got, "repeated hello")
        key = got.prop("User-Id")
        if self.conns.route_of.get(cid) not in (None, got.route):
            self._read_monitor()  # its old connection may have closed just before: know it first
        why = self.conns.check_claim(cid, got.route, key, b.get("nonce"), b.get("proof"),
                                     b.get("token"))
        if why:
            self.chan.reject(got, why)
            return self._send_reject(got, why)
        if len(self._hello_at) > 100_000:
            self._hello_at.clear()
        self._hello_at[got.route] = now
        self.chan.accept(got, client_name(cid))
        self.conns.bind(cid, got.route, key)
        self.hello[cid] = dict(b)
        self.dead.pop(cid, None)
        for tid, task in list(self._pending.items()):  # the client drops its queued work at
            if task.route[self._holder.get(tid, task.hop)] == cid:  # WELCOME: those tasks are lost
                self._fail(tid, f"client {cid} registered again; the task was lost with its "
                                "old connection")
        body = {"config": self._config_dict(), "profile": self.s.profiles[cid].to_dict(),
                "run_id": self.s.run_id, "cid": cid, "peers": self.s.handoffs,
                "token": self.conns.token(cid)}
        if self.conns.ident.key_ids:  # --secure: the key that checks this client's grants,
            body["grant"] = grant_key(self.conns.ident.grants, cid)  # and the keys its peer
            body["peer_keys"] = list(self.conns.ident.key_ids)  # port may admit (one per host)
        needed = welcome_plugins(self.s.cfg)  # [name, version] of the plugins the run uses
        if needed:
            body["plugins"] = needed
        # the client's partition travels with the configuration: no client process
        # recomputes the whole partition (30 ms for Dirichlet on digits, per process)
        arrays = {"indices": self.s.parts[cid].astype("int64")}
        arrays.update(self._traces(cid))
        self._send(cid, Message(MsgKind.WELCOME, SERVER, self.s.run_id, body=body, arrays=arrays))

    def _traces(self, cid: int | list[int]) -> dict:
        """What WELCOME carries of the latency and availability traces (the client host needs
        no copy of the files): all of both when the algorithm hands models between clients
        (a receiver charges its sender's link and checks who was offline), else only the
        client's own intervals (its profile is in the body)."""
        out: dict = {}
        whole = self.s.handoffs
        av = self.s.availability
        if isinstance(av, Trace):  # a trace file: its intervals travel
            out.update(av.to_arrays() if whole else av.to_arrays(
                cid if isinstance(cid, list) else [cid]))
        if self.s.cfg.latency.file and whole:
            if self._profiles_array is None:  # built once: every WELCOME carries the same
                self._profiles_array = latency.to_array(self.s.profiles)
            out["profiles"] = self._profiles_array
        return out

    def _config_dict(self) -> dict:
        """The run's configuration as WELCOME carries it, built once per configuration (every
        client's WELCOME carries the same; building it is a walk over every field)."""
        cached = self.__dict__.get("_welcome_config")
        if cached is None or cached[0] is not self.s.cfg:
            cached = self._welcome_config = (self.s.cfg, self.s.cfg.to_dict())
        return cached[1]

    def _on_ready(self, cid: int, got: Received) -> None:
        if cid not in self.hello:
            return self.chan.reject(got, "READY(ready) before hello")
        if got.msg.body["phase"] == "readys":  # a whole process's clients (server/enroll.py)
            return on_readys(self, got)
        why = self.examples_problem(cid, got.msg.body["n"])
        if why:
            self.chan.reject(got, why)
            return self._send_reject(got, why)
        self.chan.accept(got, client_name(cid))
        h = self.hello[cid]
        peer = got.msg.body.get("endpoint") or h.get("endpoint", "")  # bound after WELCOME
        self.clients[cid] = ClientInfo(cid, part_size(self.s.parts, cid),  # the server's count
                                       str(h.get("device", "?")), str(peer),
                                       int(h.get("pid", 0)), str(h.get("host", "")))

    def examples_problem(self, cid: int, n: int) -> str:
        """Why client cid's READY cannot stand ('' when it can): it says it holds other than
        the examples the server's partition gave it (another dataset on its host)."""
        want = part_size(self.s.parts, cid)
        return "" if n == want else (
            f"client {cid} holds {n} examples on its host, the server's partition gave it "
            f"{want}: is the dataset under --data-root the same on both hosts?")

    def _send_reject(self, got: Received, reason: str) -> None:
        """A REJECT to a connection that made a claim it cannot have, at most REJECTS_PER_S a
        second; never blocks, never raises (the sender may be gone), carries no run secret."""
        now = time.monotonic()
        if now - self._reject_window > 1.0:
            self._reject_window, self._rejects_sent = now, 0
        if self._rejects_sent >= REJECTS_PER_S:
            self.chan.dropped_sends += 1
            return
        self._rejects_sent += 1
        try:
            self.chan.send(Message(MsgKind.REJECT, SERVER, body={"reason": reason[:4096]}),
                           "unknown", route=got.route, block=False)
        except zmq.ZMQError:  # gone already, or not reading: nothing is queued for it
            self.chan.dropped_sends += 1
