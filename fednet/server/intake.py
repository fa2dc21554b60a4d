"""The server's intake: every message from a connection is accepted (and only then counted)
or rejected, by who sent it, for which run, and whether it was expected (ZmqServer's half)."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import zmq
from zmq.utils.monitor import parse_monitor_message

from fednet.network import latency
from fednet.metrics.accounting import SERVER
from fednet.plugins.check import welcome_plugins
from fednet.protocol import Message, MsgKind
from fednet.protocol.proof import grant_key
from fednet.core.replies import receive
from fednet.server.enroll import HELLO_EVERY_S, late_byes, on_byes, on_hellos, on_readys
from fednet.transport.channels import SUB_BYTES, Received, sub_frame
from fednet.types import ClientInfo, client_name

if TYPE_CHECKING:
    from fednet.server.app import ZmqServer

log = logging.getLogger("fednet.server")

REJECTS_PER_S = 50  # REJECT replies per second at most (the rest are only counted)
FROM_CLIENTS = frozenset({MsgKind.READY, MsgKind.RESULT, MsgKind.FAILURE, MsgKind.HOP_DONE,
                          MsgKind.BYE, MsgKind.HEARTBEAT})


class Intake:
    """Message handling of ZmqServer (its state lives there)."""

    def _read_monitor(self: ZmqServer) -> None:
        for _ in range(10_000):
            if not self.monitor.poll(0):
                break
            ev = parse_monitor_message(self.monitor.recv_multipart())
            if ev["event"] == zmq.EVENT_DISCONNECTED:
                self.conns.disconnected(int(ev["value"]))

    def _handle(self: ZmqServer, got: Received) -> None:
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

    def _on_result(self: ZmqServer, cid: int, got: Received) -> None:
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
        churn = self.s.driver.churn  # --availability: offline before the result arrived?
        self._reply(done if churn is None else churn.upload(done, msg.sim_time,
                                                            msg.body.get("skipped", 0)))

    def _on_hop_done(self: ZmqServer, cid: int, got: Received) -> None:
        """A ring's hand-off report. It may arrive after the task's RESULT (another connection):
        any task sent in this round or the last, once per hop, from the client that held it."""
        msg, b = got.msg, got.msg.body
        rnd_route = self._routes.get(msg.task_id)
        if (rnd_route is None or rnd_route[0] != msg.round
                or not b["hop"] < b["to"] < len(rnd_route[1])
                or rnd_route[1][b["hop"]] != cid or (msg.task_id, b["hop"]) in self._hops):
            return self.chan.reject(got, f"unexpected HOP_DONE for task {msg.task_id}")
        self.chan.accept(got, client_name(cid))
        self._hops.add((msg.task_id, b["hop"]))
        self._progress = time.monotonic()
        if msg.task_id in self._pending:
            self._holder[msg.task_id] = b["to"]
        self.s.ledger.add_totals(msg.round, {"client_to_client": b["peer_bytes"],
                                             "tensor_bytes": b["peer_tensor_bytes"]})
        if b.get("skipped") and self.s.driver.churn is not None:  # offline peers passed over
            self.s.driver.churn.note(msg.round, b["skipped"])

    def _on_hello(self: ZmqServer, got: Received) -> None:
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

    def _traces(self: ZmqServer, cid: int | list[int]) -> dict:
        """What WELCOME carries of the latency and availability traces (the client host needs
        no copy of the files): all of both when the algorithm hands models between clients
        (a receiver charges its sender's link and checks who was offline), else only the
        client's own intervals (its profile is in the body)."""
        out: dict = {}
        whole = self.s.handoffs
        av = self.s.availability
        if av is not None and av.from_file:
            out.update(av.to_arrays() if whole else av.to_arrays(
                cid if isinstance(cid, list) else [cid]))
        if self.s.cfg.latency.file and whole:
            if self._profiles_array is None:  # built once: every WELCOME carries the same
                self._profiles_array = latency.to_array(self.s.profiles)
            out["profiles"] = self._profiles_array
        return out

    def _config_dict(self: ZmqServer) -> dict:
        """The run's configuration as WELCOME carries it, built once per configuration (every
        client's WELCOME carries the same; building it is a walk over every field)."""
        cached = self.__dict__.get("_welcome_config")
        if cached is None or cached[0] is not self.s.cfg:
            cached = self._welcome_config = (self.s.cfg, self.s.cfg.to_dict())
        return cached[1]

    def _on_ready(self: ZmqServer, cid: int, got: Received) -> None:
        if cid not in self.hello:
            return self.chan.reject(got, "READY(ready) before hello")
        if got.msg.body["phase"] == "readys":  # a whole process's clients (server/enroll.py)
            return on_readys(self, got)
        self.chan.accept(got, client_name(cid))
        h = self.hello[cid]
        peer = got.msg.body.get("endpoint") or h.get("endpoint", "")  # bound after WELCOME
        self.clients[cid] = ClientInfo(cid, got.msg.body["n"], str(h.get("device", "?")),
                                       str(peer), int(h.get("pid", 0)),
                                       str(h.get("host", "")))

    def _send_reject(self: ZmqServer, got: Received, reason: str) -> None:
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
