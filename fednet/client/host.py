"""Several logical clients in one process (`--clients-per-process N`).

One zmq context, one poll loop and one worker serve N clients, so N clients cost one process:
one fork, one interpreter, one CUDA context on a GPU (a context holds hundreds of MB of device
memory, so 100 separate processes may not fit on one device). Each logical client keeps its own
identity, server link, peer socket, ledger, data and state: the server and the wire see exactly
what N separate processes would send. Their tasks run one at a time, round-robin, so clients
whose algorithm keeps no model between tasks share one working model (executor.
share_working_models); before a task starts, every earlier zero-copy send of the process has
left (it may still read that model's memory). Hand-offs between two clients of the same process
travel over their peer sockets like any other, and any wait (for an acknowledgement, a real-time
delay) reads every client's sockets, so a hand-off to a neighbour in the same process is
acknowledged while its sender waits.
"""
from __future__ import annotations

import logging
import time

import torch
import zmq

from fednet.client.app import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Client
from fednet.client.executor import share_working_models
from fednet.errors import ConfigError
from fednet.platform.proc import check_files_per_process
from fednet.transport.channels import stop_monitor
from fednet.plugin_check import report
from fednet.protocol import MsgKind
from fednet.training import interrupt

log = logging.getLogger("fednet.client")

SOCKETS_PER_CLIENT = 8  # server link, its monitor pair, peer socket, hand-off dealers
CHECK_EVERY_S = 0.05  # the clients' liveness checks (launcher, server link) at most this often:
#                       0.2 ms for 63 clients, once per task otherwise


class Host:
    """The logical clients of one process and their shared poll loop."""

    def __init__(self, cids: list[int], connect: str, device: str = "cpu",
                 advertise: str = "127.0.0.1", threads: int = 1, secure: str = "",
                 run_key: bytes | None = None, key_name: str = "",
                 curve: tuple[bytes, bytes] | None = None) -> None:
        check_files_per_process(len(cids))
        share_working_models()
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, max(1023, SOCKETS_PER_CLIENT * len(cids) + 64))
        self.auth, self.admitted = None, None
        self.clients: list[Client] = []
        self.poller = zmq.Poller()
        try:
            if secure:  # one ZAP handler for the shared context, admitting the allowed keys
                from fednet.transport import security

                security.load_keys(secure, need_server_secret=False, name=key_name, pair=curve)
                self.admitted = set()  # the run's client keys, from WELCOME
                self.auth = security.start_authenticator(self.ctx, self.admitted)
            elif run_key:  # plaintext launch: only run-key holders complete a handshake
                from fednet.protocol.proof import gate_password
                from fednet.transport.gate import Gate

                self.auth = Gate(self.ctx, gate_password(run_key))
            for cid in cids:  # one link heartbeats for the process (libzmq's timer upkeep)
                c = Client(cid, connect, device, advertise, threads, secure, ctx=self.ctx,
                           run_key=run_key, key_name=key_name, curve=curve,
                           link=self.clients[0] if self.clients else None,
                           admitted=self.admitted)
                self.clients.append(c)
                c.pump = self.pump
                c.drop_idle = True  # a working model shared, data rebuilt when chosen again
                c.on_socket = lambda sock: self.poller.register(sock, zmq.POLLIN)
                c.peers.pump = lambda: self.pump(0)
                for sock in c.sockets():
                    self.poller.register(sock, zmq.POLLIN)
        except BaseException:  # a client half built (a failed bind) has sockets close() misses
            for c in self.clients:
                stop_monitor(c.server.sock, c.monitor)
            if self.auth is not None:
                self.auth.stop()
            self.ctx.destroy(linger=0)
            raise
        self._next = 0
        self.rejected: list[Client] = []

    def pump(self, timeout_ms: int) -> None:
        """Read every client's sockets (waiting up to timeout_ms for the first message)."""
        ready = dict(self.poller.poll(timeout_ms))
        if ready:
            for c in self.clients:
                if any(s in ready for s in c.sockets()):
                    c.read(ready)

    def register(self, timeout_s: float) -> None:
        """READY (hello) from every client, then each takes its WELCOME as it comes (the wait
        restarts with every WELCOME: building each client's data and model takes time). A client
        the server refuses stops alone; ConfigError when none is left."""
        for c in self.clients:
            c.hello()
        waiting = {c.server.sock: c for c in self.clients}
        poller = zmq.Poller()
        for sock in waiting:
            poller.register(sock, zmq.POLLIN)
        deadline, recheck = time.monotonic() + timeout_s, time.monotonic() + 1.0
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConfigError(f"the server at {self.clients[0].connect} did not answer within "
                                  f"{timeout_s:.0f}s; check --connect (address and port) and "
                                  "that the server runs")
            ready = dict(poller.poll(int(min(left, 1.0) * 1000)))
            if time.monotonic() >= recheck:  # links that dropped meanwhile: hello again
                recheck = time.monotonic() + 1.0
                for c in waiting.values():
                    c.hello_again()
            for sock in ready:
                c = waiting[sock]
                got = c.recv_server()
                if got is None:
                    continue
                msg = got.msg
                if msg.kind not in (MsgKind.WELCOME, MsgKind.REJECT):
                    continue
                poller.unregister(sock)
                del waiting[sock]
                if msg.kind == MsgKind.REJECT:
                    log.error("client %d: the server refused it: %s", c.cid, msg.body.get("reason"))
                    self._drop(c)
                    self.rejected.append(c)
                    continue
                c._welcome(msg)
                deadline = time.monotonic() + timeout_s
        if len(self.rejected) == len(self.clients):
            raise ConfigError("the server refused every client of this process")
        if self.clients[0].real and len(self.clients) > 1:
            log.warning("clients %s: --real-time with several clients per process: each waits "
                        "out the others' simulated delays, so wall-clock times are inflated",
                        ids_text([c.cid for c in self.clients]))

    def _drop(self, c: Client) -> None:
        """Stop reading a client's sockets (it stopped; the others go on)."""
        for sock in c.sockets():
            try:
                self.poller.unregister(sock)
            except KeyError:
                pass

    def serve(self) -> int:
        """Run the clients' work round-robin until every one of them stopped; the exit code is
        0 only if all stopped cleanly. A client whose work raises stops alone (logged)."""
        live = [c for c in self.clients if c not in self.rejected]
        worst = EXIT_USAGE if self.rejected else EXIT_OK
        interrupt.install(lambda: self.pump(0) or any(c.stop_due() for c in live))
        check_at = 0.0
        while live:
            now = time.monotonic()
            due = now >= check_at
            if due:
                check_at = now + CHECK_EVERY_S
            for c in list(live):
                code = c.check() if due else None
                if code is None and c.stopping:
                    c.bye()
                    code = EXIT_OK
                if code is not None:
                    worst = max(worst, code)
                    live.remove(c)
                    self._drop(c)
            if not live:
                break
            c = self._next_with_work(live)
            if c is None:
                self.pump(1000)
                continue
            self._settle()
            try:
                c.step()
            except interrupt.Interrupted:  # the run ended, or the server or launcher is gone
                log.warning("clients %s: stopped in the middle of a task", ids_text(
                    [c.cid for c in live]))
            except Exception:  # noqa: BLE001 - one client's failure is not its neighbours'
                log.exception("client %d: stopped by an error; the other clients of this process "
                              "go on", c.cid)
                worst = max(worst, EXIT_ERROR)
                live.remove(c)
                self._drop(c)
        return worst

    def _settle(self) -> None:
        """Wait until every client's last zero-copy send has left: the next task may load a
        received model into the working model those messages still read."""
        for c in self.clients:
            if c._tracker is not None:
                c._tracker.wait()
                c._tracker = None

    def _next_with_work(self, live: list[Client]) -> Client | None:
        """The next client (round-robin) with a queued task or hand-off; None if none has."""
        n = len(live)
        for i in range(n):
            c = live[(self._next + i) % n]
            if c.work:
                self._next = (self._next + i + 1) % n
                return c
        return None

    def close(self) -> None:
        """Close every client's sockets, then the shared context."""
        for c in self.clients:
            c.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
        share_working_models(False)  # the next run in this process starts with its own models


def run_host(cids: list[int], connect: str, device: str = "cpu", advertise: str = "127.0.0.1",
             threads: int = 1, register_timeout: float = 60.0, secure: str = "",
             run_key: bytes | None = None, key_name: str = "",
             curve: tuple[bytes, bytes] | None = None) -> int:
    """Run several clients in this process to completion; returns the process exit code."""
    try:
        host = Host(cids, connect, device, advertise, threads, secure, run_key, key_name, curve)
    except ConfigError as e:
        log.error("clients %s: %s", ids_text(cids), e)
        return EXIT_USAGE
    for c in host.clients:
        c.lost_timeout = register_timeout
    try:
        host.register(register_timeout)
        return host.serve()
    except ConfigError as e:
        if not report(e):  # a missing plugin: one line per host, not one per client
            log.error("clients %s: %s", ids_text(cids), e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_ERROR
    finally:
        host.close()


def ids_text(cids: list[int]) -> str:
    """'0-299' for consecutive ids, else the ids with commas (at most 10 shown)."""
    if cids == list(range(cids[0], cids[0] + len(cids))):
        return f"{cids[0]}-{cids[-1]}" if len(cids) > 1 else str(cids[0])
    return ",".join(map(str, cids[:10])) + (",..." if len(cids) > 10 else "")


def run_client(cid: int | list[int], connect: str, device: str = "cpu",
               advertise: str = "127.0.0.1", threads: int = 1, register_timeout: float = 60.0,
               secure: str = "", run_key: bytes | None = None, key_name: str = "",
               curve: tuple[bytes, bytes] | None = None) -> int:
    """Run one client (or, given a list of ids, several in this process) to completion; returns
    a process exit code. `run_key`: the launcher's secret (clients it forked prove their ids
    with it); `key_name`: which key pair of the --secure folder is this host's; `curve`: the
    key pair `fednet launch --secure` issued to this process instead."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if isinstance(cid, list):
        if len(cid) > 1:
            return run_host(cid, connect, device, advertise, threads, register_timeout, secure,
                            run_key, key_name, curve)
        cid = cid[0]
    try:
        client = Client(cid, connect, device, advertise, threads, secure, run_key=run_key,
                        key_name=key_name, curve=curve)
    except ConfigError as e:
        log.error("client %d: %s", cid, e)
        return EXIT_USAGE
    client.lost_timeout = register_timeout
    try:
        client.register(register_timeout)
        return client.serve()
    except ConfigError as e:
        if not report(e):
            log.error("client %d: %s", cid, e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_ERROR
    finally:
        client.close()
