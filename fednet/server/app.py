"""The ZeroMQ server (ZmqServer, a Dispatcher): registration, task dispatch, result collection,
shutdown; and what arrives: every message from a connection is accepted (and only then counted)
or rejected, by who sent it, for which run, and whether it was expected. Registration is the
registrar's (registrar.py), the connections' bookkeeping conns.py's, the registered clients
book.py's, what became of each client (deaths, BYEs) fates.py's; each client's phase, read
from them, phases.py's."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
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
from fednet.protocol import Message, MsgKind, peek, peek_kind
from fednet.protocol.proof import route_grants
from fednet.server.book import ClientBook
from fednet.server.conns import Connections, Identity
from fednet.server.fates import Fates
from fednet.server.hops import Hops
from fednet.server.inflight import process_cap
from fednet.server.phases import ClientTable
from fednet.server.tasks import TaskBook
from fednet.server.registrar import Registrar
from fednet.transport.channels import (SUB_BYTES, Channel, Received, bind_router,
                                       server_context)
from fednet.transport.monitor import open_monitor, stop_monitor
from fednet.data.partition import part_size
from fednet.types import Failure, Result, Roster, Task, client_name, id_array

log = logging.getLogger("fednet.server")
UNPROVEN_BYTES = 64 << 10
"""Array bytes a connection that holds no client id may have read beside its ids' (a READY)."""
RESULT_SLACK_BYTES = 4096
"""What a RESULT's arrays may carry beyond its task's result layout before it is not read."""
throttled = Throttle(log)

DeathWatch = Callable[[], list[tuple[Sequence[int], str]]]  # (a process's ids, why) each
UNREACHABLE = "client unreachable"
LOST = "connection lost (no answer to heartbeats, or closed)"
WARN_DEATHS = 5  # warnings per batch of deaths (a process's end is one line and a count)

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
            bound = (ctx, *bind_router(ctx, host, port, live=session.cfg.liveness))
        self.ctx, self.sock, self.endpoint = bound
        self.chan = Channel(self.sock, session.ledger, SERVER, router=True, enveloped=True)
        self.conns = Connections(identity or Identity(), session.cfg.clients)
        self.chan.known = self.conns.knows  # the others are lumped in the log
        self.monitor = open_monitor(self.sock, zmq.EVENT_DISCONNECTED)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.clients = ClientBook(session.cfg.clients, lambda c: part_size(session.parts, c))
        self._live: tuple[tuple[int, int, int], Roster] | None = None  # (_roster)
        self.fates = Fates(session.cfg.clients)
        self.reg = Registrar(self)
        self.watch: DeathWatch | None = None
        self.round = 0  # the round in progress, or the next one between rounds
        # at most this many tasks out to one client process (0: no cap; server/inflight.py)
        self.tasks_per_process = process_cap(session.cfg, session.evaluator.model_bytes)
        self.tasks = TaskBook(session.cfg.net.max_inflight, self.tasks_per_process,
                              self._process_of, self._dispatch)
        self.table = ClientTable(self.clients, self.conns, self.fates, self.reg.said, self.tasks)
        self.shutting_down = False
        self.hops = Hops(session.run_id, session.handoff_codec)  # routed tasks' hand-offs

    # ---- helpers -------------------------------------------------------------------------
    def send(self, cid: int, msg: Message) -> bool:
        route = self.conns.route_of(cid)
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
            self.conns.lose(cid)  # before the monitor says so
            throttled.warning("cannot reach client %d: %s", cid, e.strerror)
            return False

    def _check_deaths(self) -> None:
        # under `fednet launch` the zygote reports a dead process with its exit code within
        # moments; a lost connection decides only after a longer grace (a frozen process)
        live = self.s.cfg.liveness
        grace = live.lost_grace_s * (1 if self.watch is None else 3)
        found = [(id_array(ids), why) for ids, why in self.watch()] if self.watch else []
        lost = self.conns.gone(grace, live.heartbeat_timeout_ms / 1000,
                               live.reconnect_max_ms / 1000)
        if lost.size:
            found.append((lost[self.reg.said[lost] > 0], LOST))
        for ids, why in found:
            self.conns.release(ids)  # their ids are free: a restarted client may claim one again
            new = self.fates.die(ids, why, self.round, self.shutting_down)
            unclean = new[~self.fates.clean[new]]
            for cid in unclean[:WARN_DEATHS].tolist():
                throttled.warning("client %d is gone: %s", cid, why)
            if unclean.size > WARN_DEATHS:
                log.warning("... and %d more clients gone: %s", unclean.size - WARN_DEATHS, why)
        if found and self.tasks.pending:
            dead, reason = self.fates.died, self.fates.reason
            self.tasks.fail_holders(lambda c: dead[c] >= 0,  # later dead peers are skipped
                                    lambda c: f"client {c} died holding the model: {reason(c)}")

    def fail_held(self, ids: np.ndarray, why: str) -> None:
        """Fail the tasks that clients `ids` hold: f"client {holder} {why}"."""
        if self.tasks.pending:
            held = np.zeros(self.s.cfg.clients, bool)
            held[ids] = True
            self.tasks.fail_holders(held.__getitem__, lambda c: f"client {c} {why}")

    def _process_of(self, cid: int) -> Hashable:
        """The client process that holds client cid (the host and pid of its hello)."""
        return self.clients.process_of(cid) or cid

    def _poll_once(self, timeout_s: float) -> None:
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        if self.monitor in ready:
            self.read_monitor()
        self.conns.trim_memory()
        if self.sock not in ready:
            return
        for _ in range(1000):  # drain what is queued without starving the death watch
            got = self.chan.received(admit=self._admit)
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
            dead = self.fates.dead_count
            if dead and len(self.clients) + dead >= n and not self._missing(n):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.clients)} of {n} clients registered within "
                                   f"{timeout_s:.0f}s: {self.table.missing(np.arange(n))}")
            self._poll_once(0.05)

    def _missing(self, n: int) -> bool:
        """Whether a client of the first n neither registered nor died."""
        registered = self.clients.registered(np.arange(n))
        return bool((~registered & (self.fates.died[:n] < 0)).any())

    def alive_clients(self) -> Roster:
        """Registered clients that have not died. A client whose connection was just lost is
        waited for (it comes back, or its grace runs out and it is dead): a round never starts
        with clients it cannot reach."""
        # launch's grace and one more (the liveness timers: config/liveness.py), or the wait
        # for lost clients after this server stalled (conns.Connections.gone)
        deadline = time.monotonic() + 4 * self.s.cfg.liveness.lost_grace_s
        while time.monotonic() < max(deadline, self.conns.settled_at()):
            self._check_deaths()
            lost = self.conns.lost_ids()
            if not any(c in self.clients for c in lost[self.fates.died[lost] < 0].tolist()):
                break
            self._poll_once(0.05)
        return self._roster()

    def _roster(self) -> Roster:
        """The live registered clients as a roster (fednet.types), rebuilt only when a client
        came or died since the last one (sorting a million ids took seconds every step)."""
        key = (len(self.clients), self.fates.dead_count, self.conns.binds)
        if self._live is None or self._live[0] != key:
            ids = self.clients.ids()
            if self.fates.dead_count:
                ids = ids[self.fates.died[ids] < 0]
            self._live = (key, self.clients.roster(ids))
        return self._live[1]

    def _dispatch(self, task: Task) -> None:
        msg = task_message(task, self.s.run_id)
        if len(task.route) > 1:  # peers find each other through the route itself
            msg.body["endpoints"] = [self.clients[c].endpoint if c in self.clients else ""
                                     for c in task.route]
            if self.conns.ident.key_ids:  # --secure: each peer's key, to check the hand-off's
                b = msg.body  # sender, and every hop's grant of all a hand-off tells (proof.py)
                b["keys"] = [self.conns.key_of(c) for c in task.route]
                b["grants"] = route_grants(self.conns.ident.grants, self.s.run_id, task.round,
                                           task.task_id, task.route, b["keys"], b["endpoints"],
                                           task.kind, b["body"], task.stage)
        if len(task.route) > 1:
            self.hops.send(task, msg.body, self.s.algo.result_layout(task))
        if not self.send(task.cid, msg):
            if self.conns.is_lost(task.cid) and not self.fates.is_dead(task.cid):
                return  # its connection just closed: it fails as dead after the grace
            self.tasks.fail(task.task_id, UNREACHABLE)

    def run_round(self, rnd: int, tasks: list[Task], follow: FollowUp | None = None
                  ) -> tuple[list[Result], list[Failure]]:
        """Send every task, then collect results until all arrived, died or timed out.

        `follow` sees each reply the moment it arrives; tasks it returns are sent at once
        (asynchronous slots).
        """
        self.round = rnd
        self.hops.new_round(rnd)
        self.tasks.start(tasks, follow)
        timeout = self.s.cfg.net.round_timeout
        staged = bool(getattr(self.s.algo, "chained", False))  # stages within the round (SecAgg)
        try:
            self.tasks.fill()
            while self.tasks.busy():
                self.tasks.fill()
                self._check_deaths()
                if time.monotonic() - self.tasks.progress > timeout:
                    why = f"no progress within --round-timeout {timeout:g}s"
                    if staged:  # each stage has the deadline: its silent clients drop out
                        self.tasks.stage_time_out(f"{why} (a stage's deadline): it dropped out")
                        continue
                    self.tasks.time_out(why)
                    break
                self._poll_once(0.05)
        finally:  # also when a callback raised: no stale task survives into the next round
            results, failures = self.tasks.end()
        self._check_deaths()  # a send can fail before the exit of its client is reported
        for f in failures:
            if f.reason == UNREACHABLE and self.fates.is_dead(f.cid):
                f.reason = f"{UNREACHABLE}: {self.fates.reason(f.cid)}"
        self.round = rnd + 1
        return results, failures

    def untasked_deaths(self, failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Failure rows for clients that died while holding no task (between rounds, at start)."""
        return self.fates.unclean({f.get("client") for f in failures})

    def final_phases(self) -> dict[str, int]:
        """How many clients ended in each phase (phases.py), the exits the launcher reported
        since the last look recorded first (called after it stopped the clients; failure rows
        are taken before: untasked_deaths)."""
        for ids, why in self.watch() if self.watch is not None else []:
            self.fates.die(id_array(ids), why, self.round, self.shutting_down)
        return self.table.census()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """SHUTDOWN to every live client; wait briefly for their BYE."""
        self.shutting_down = True
        targets = self._roster().ids
        for ids in self.conns.groups(targets):  # one per process
            self.send(int(ids[0]), Message(MsgKind.SHUTDOWN, SERVER, self.s.run_id,
                                            arrays={"cids": ids.astype(np.int64)}))
        deadline = time.monotonic() + timeout_s
        done = self.fates.said_bye, self.fates.died
        while targets.size and time.monotonic() < deadline:
            targets = targets[~done[0][targets] & (done[1][targets] < 0)]
            if targets.size:
                self._check_deaths()
                self._poll_once(0.05)

    def close(self) -> None:
        """Close the socket and the context."""
        stop_monitor(self.sock, self.monitor)  # never hangs while connections close
        self.sock.close(linger=100)  # after SHUTDOWN and BYE nothing is left worth waiting for
        self.ctx.term()

    # What arrives: each message accepted (and only then counted) or rejected.

    def read_monitor(self) -> None:
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
        arrays = sum(len(f) for f in frames[1:])
        if self.conns.knows(route):
            return self._oversized(frames, arrays)
        kind = peek_kind(frames)
        if kind == MsgKind.READY or (kind == MsgKind.BYE and
                                     self.conns.released_cid(route) is not None):
            most = 8 * self.s.cfg.clients + UNPROVEN_BYTES
            return "" if arrays <= most else (
                f"{kind.name} with {arrays} bytes of arrays (at most {most}) from a connection "
                "that is no client")
        return (f"{kind.name if kind is not None else 'a message'} from a connection that is no "
                f"client ({arrays} bytes of arrays not read)")

    def _oversized(self, frames: list[Any], arrays: int) -> str:
        """Why a client's RESULT is not read ('' when it may be): it carries more bytes of
        arrays than its pending task's result layout holds (with --compress, than twice that),
        so a key holder's or any client's oversized reply costs no joined copy; the task then
        fails as its client's (a reply that could not be read)."""
        kind, tid = peek(frames)
        task = self.tasks.pending.get(tid) if kind == MsgKind.RESULT and tid is not None else None
        layout = self.s.algo.result_layout(task) if task is not None else None
        if layout is None:
            return ""
        most = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in layout.values())
        most = (2 * most if self.s.compress.on else most) + RESULT_SLACK_BYTES
        return "" if arrays <= most else (
            f"a RESULT with {arrays} bytes of arrays for task {tid}, whose result holds at most "
            f"{most}")

    def _refused_reply(self, route: bytes, kind: MsgKind | None, why: str) -> None:
        """A bound client's reply that could not be decoded ends its task at once (its
        client's failure), rather than holding the round until --round-timeout."""
        cid = self.conns.cid_of(route)
        if cid is None or kind not in (MsgKind.RESULT, MsgKind.FAILURE):
            return
        self.tasks.fail_holders(cid.__eq__,
                                lambda c: f"client {c}'s reply could not be read: {why}"[:500])

    def _handle(self, got: Received) -> None:
        """Accept (and account) a message only from the connection bound to its client, for
        this run, when it is expected; everything else is counted as rejected."""
        msg = got.msg
        if got.fd >= 0 and self.conns.fd_of.get(got.route[:-SUB_BYTES]) != got.fd:
            self.read_monitor()  # a new connection, maybe on a reused fd: its older events first
        self.conns.seen(got.route, got.fd)
        if msg.kind not in FROM_CLIENTS:
            return self.chan.reject(got, f"{msg.kind.name} is not sent to the server")
        if msg.kind == MsgKind.READY and msg.body["phase"] == "hellos":
            return self.reg.on_hellos(got)
        cid = self.conns.cid_of(got.route)
        if cid is None:
            late = self.conns.released_cid(got.route)  # it exited with the BYE queued
            if (msg.kind == MsgKind.BYE and late is not None and msg.sender == client_name(late)
                    and msg.run_id == self.s.run_id):
                return self.reg.late_bye(got, late)
            return self.chan.reject(got, f"{msg.kind.name} from a connection that is no client")
        if msg.sender != client_name(cid):
            return self.chan.reject(got, f"sender {msg.sender[:40]!r} on client {cid}'s connection")
        if msg.kind == MsgKind.READY:
            return self.reg.on_ready(got)
        if msg.run_id != self.s.run_id:  # e.g. results of a server before a --resume
            return self.chan.reject(got, f"{msg.kind.name} of another run or server start")
        if msg.kind in (MsgKind.RESULT, MsgKind.FAILURE):
            self._on_result(cid, got)
        elif msg.kind == MsgKind.HOP_DONE:
            self._on_hop_done(cid, got)
        elif msg.kind == MsgKind.BYE:
            self.reg.on_bye(cid, got)
        else:  # HEARTBEAT
            self.chan.accept(got, client_name(cid))

    def _on_result(self, cid: int, got: Received) -> None:
        """A RESULT or FAILURE: only for a task still pending, sent to this client, this round."""
        msg = got.msg
        task = self.tasks.pending.get(msg.task_id)
        if task is None or cid not in task.route or msg.round != task.round:
            return self.chan.reject(got, f"unexpected {msg.kind.name} for task {msg.task_id}")
        self.chan.accept(got, client_name(cid))
        self.tasks.answered(msg.task_id)
        done = receive(self.s, msg, cid, got.nbytes, task)
        # --availability: offline before the result arrived?
        self.tasks.reply(self.s.arrived(done, msg.sim_time, msg.body.get("skipped", 0)))

    def _on_hop_done(self, cid: int, got: Received) -> None:
        """A ring's hand-off report. It may arrive after the task's RESULT (another connection):
        any task sent in this round or the last, once per hop, from the client that held it."""
        msg, b = got.msg, got.msg.body
        why = self.hops.problem(cid, msg)
        if why:
            return self.chan.reject(got, why)
        self.chan.accept(got, client_name(cid))
        self.tasks.handed(msg.task_id, b["to"])
        self.hops.count(self.s.ledger, cid, msg)
        if b.get("skipped"):  # offline peers passed over
            self.s.skipped_peers(msg.round, b["skipped"])
