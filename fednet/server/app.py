"""The ZeroMQ server: registration, task dispatch, result collection, shutdown (a Dispatcher)."""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import zmq

from fednet.log import Throttle
from fednet.metrics.accounting import SERVER
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import route_grants
from fednet.server.conns import LOST_GRACE_S, Connections, Identity
from fednet.server.inflight import next_task, process_cap
from fednet.server.enroll import by_connection
from fednet.server.intake import Intake
from fednet.core.rounds import FollowUp
from fednet.core.session import Session
from fednet.transport.channels import Channel, bind_router, server_context
from fednet.transport.monitor import open_monitor, stop_monitor
from fednet.types import ClientInfo, Failure, Result, Task, client_name
from fednet.core.wire import task_message

log = logging.getLogger("fednet.server")
throttled = Throttle(log)

DeathWatch = Callable[[], dict[int, str]]
UNREACHABLE = "client unreachable"


class ZmqServer(Intake):
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
        self.monitor = open_monitor(self.sock, zmq.EVENT_DISCONNECTED)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self._hello_at: dict[bytes, float] = {}
        self._profiles_array: Any = None  # a latency trace as WELCOME carries it (intake)
        self._reject_window, self._rejects_sent = 0.0, 0
        self.clients: dict[int, ClientInfo] = {}
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
        self._routes: dict[int, tuple[int, list[int]]] = {}  # task id -> (round, route) sent
        self._hops: set[tuple[int, int]] = set()  # (task id, hop) whose HOP_DONE was counted

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
        info = self.clients.get(cid)
        return (info.host, info.pid) if info is not None and info.pid else cid

    def _poll_once(self, timeout_s: float) -> None:
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        if self.monitor in ready:
            self._read_monitor()
        self.conns.trim_memory()
        if self.sock not in ready:
            return
        for _ in range(1000):  # drain what is queued without starving the death watch
            got = self.chan.recv()
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

    def alive_clients(self) -> list[ClientInfo]:
        """Registered clients that have not died. A client whose connection was just lost is
        waited for (it comes back, or its grace runs out and it is dead): a round never starts
        with clients it cannot reach."""
        deadline = time.monotonic() + 3 * LOST_GRACE_S + 1.0
        while time.monotonic() < deadline:
            self._check_deaths()
            if not any(c in self.clients and c not in self.dead for c in self.conns.lost):
                break
            self._poll_once(0.05)
        return [c for cid, c in sorted(self.clients.items()) if cid not in self.dead]

    def _dispatch(self, task: Task) -> None:
        self._pending[task.task_id] = task
        self._routes[task.task_id] = (task.round, list(task.route))
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
        for tid in [t for t, (r, _) in self._routes.items() if r < rnd - 1]:
            del self._routes[tid]  # late HOP_DONEs are accepted for one round after
        self._hops = {h for h in self._hops if h[0] in self._routes}
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
        targets = [c for c in self.clients if c not in self.dead]
        for ids in by_connection(self.conns.route_of, targets):  # one per process (enroll.py)
            arrays = {"cids": np.array(ids, np.int64)} if len(ids) > 1 else {}
            self._send(ids[0], Message(MsgKind.SHUTDOWN, SERVER, self.s.run_id, arrays=arrays))
        deadline = time.monotonic() + timeout_s
        while any(c not in self.byes and c not in self.dead for c in targets):
            if time.monotonic() > deadline:
                break
            self._check_deaths()
            self._poll_once(0.05)

    def close(self) -> None:
        """Close the socket and the context."""
        stop_monitor(self.sock, self.monitor)  # never hangs while connections close
        self.sock.close(linger=100)  # after SHUTDOWN and BYE nothing is left worth waiting for
        self.ctx.term()
