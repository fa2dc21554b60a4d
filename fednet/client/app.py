"""A ZeroMQ client (Client): register, receive tasks, train, reply; one poll loop, no threads.

What arrives from the server is read as it arrives, each message accepted (and only then
counted) or rejected; TASKs are read at once but decoded only when they run. Decoding a TASK
joins its model into memory. Decoding each one just before it runs, after the previous task's
result has left, joins it into the memory that result freed; decoding them as they arrived held
every queued model at once, each in never-touched pages (10 ResNet-18 tasks to a process of 10
clients: 60-100 ms of page faults per model, docs/benchmarks/history.md section 15). Control messages
(SHUTDOWN, WELCOME, REJECT) are decoded at once, so they are never stuck behind queued work.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from typing import Any

import torch
import zmq

from fednet.client.link import ServerLink, register, server_setup
from fednet.client.peers import PeerChainBroken, Peers, to_server
from fednet.client.trainer import Trainer
from fednet.config.liveness import DEFAULT, Liveness
from fednet.core.executor import welcome_config, welcome_tables
from fednet.core.wire import failure_message
from fednet.errors import ConfigError
from fednet.log import Throttle
from fednet.metrics.accounting import SERVER, Ledger
from fednet.network.latency import Profile
from fednet.core.plugin_check import checked_welcome
from fednet.protocol import Message, MsgKind, peek_kind
from fednet.protocol.proof import client_secret, gate_password, hello_proof, peer_key
from fednet.training import interrupt
from fednet.transport.channels import Channel, Deferred, Received, sub_frame
from fednet.transport.gate import Gate
from fednet.types import client_name

log = logging.getLogger("fednet.client")
throttled = Throttle(log)

NO_WORK: tuple = ()  # an idle client's queue (a deque is made at its first task: ~600 B each)
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

FROM_SERVER = frozenset({MsgKind.WELCOME, MsgKind.TASK, MsgKind.SHUTDOWN, MsgKind.REJECT,
                         MsgKind.HEARTBEAT})

TASKS = frozenset({MsgKind.TASK})


class Client:
    """One federated client: an envelope on its process's server link and a ROUTER for peer
    hand-offs. Slotted: a process holds thousands of idle ones (~1 KB each)."""

    __slots__ = ("cid", "name", "device", "run_key", "own_ctx", "ctx", "ledger", "auth", "keys",
                 "admitted", "own_link", "link", "server", "lost_timeout", "registered",
                 "refused", "peers", "connect", "run_id", "trainer", "_tracker", "parent",
                 "work", "stopping", "rehello", "token", "rehello_at", "host", "poller")

    def __init__(self, cid: int, connect: str, device: str = "cpu", advertise: str = "127.0.0.1",
                 threads: int = 1, secure: str = "", ctx: zmq.Context | None = None,
                 run_key: bytes | None = None, key_name: str = "",
                 curve: tuple[bytes, bytes] | None = None, link: ServerLink | None = None,
                 admitted: set[bytes] | None = None, liveness: Liveness = DEFAULT) -> None:
        """`link`: the server link of this process, shared by its clients (client/host.py);
        None: this client opens its own (with the timers `liveness`). `admitted`: the keys the
        shared context's ZAP handler admits (--secure; filled from WELCOME)."""
        self.cid, self.name, self.device = cid, client_name(cid), device
        # under `fednet launch`: the run key came through the zygote's pipe (never a socket);
        # this client's secret is derived from it when it says hello alone (inbox.hello)
        self.run_key = run_key
        self.own_ctx = ctx is None  # several logical clients of one process share a context
        self.ctx = ctx if ctx is not None else zmq.Context()
        self.ledger = Ledger()
        self.auth, self.keys, self.admitted = None, None, admitted
        gate = gate_password(run_key) if run_key and not secure else None
        if secure:  # CURVE to the server; our peer socket admits only the run's keys (ZAP)
            from fednet.transport import security
            self.keys = security.load_keys(secure, need_server_secret=False, name=key_name,
                                           pair=curve)
            if self.own_ctx:  # one ZAP handler per context: a Host starts its own
                self.admitted = set()
                self.auth = security.start_authenticator(self.ctx, self.admitted)
        elif gate is not None and self.own_ctx:  # plaintext launch: only run-key holders
            self.auth = Gate(self.ctx, gate)  # complete a handshake
        self.own_link = link is None
        self.link = link if link is not None else \
            ServerLink(self.ctx, connect, server_setup(self.keys, gate),
                       secure=self.keys is not None, liveness=liveness)
        self.server = Channel(self.link.sock, self.ledger, self.name, router=False,
                              sub=sub_frame(cid))
        self.link.add(self)
        self.lost_timeout = 60.0
        self.registered, self.refused = False, None  # refused: the server's reason (REJECT)
        self.peers = Peers(self.ctx, self.name, advertise, self.ledger, self.keys,
                           peer_key(run_key) if run_key else None, gate)
        self.connect, self.run_id = connect, ""
        self.trainer = Trainer(cid, device)  # its settings from WELCOME, its executor
        self._tracker: Any = None
        self.parent = os.getppid()
        # tasks (decoded when they run) and hand-offs, run one at a time
        self.work: deque[tuple[Message | Deferred, int]] | tuple = NO_WORK
        self.stopping = self.rehello = False
        self.token: bytes | None = None  # from WELCOME: proves a reconnect (rejoin_token)
        self.rehello_at: float | None = None
        self.host: Any = None  # the Host of this process's clients (client/host.py), if any
        self.poller: zmq.Poller | None = None  # this client's own loop's (serve)
        if self.own_ctx:  # a Host sets it once for its clients
            torch.set_num_threads(threads)

    def _send_server(self, msg: Message, track: bool = False) -> int:
        n, tracker = self.server.send(msg, SERVER, track=track)
        if track:
            self._tracker = tracker
            self.link.tracked.add(self)
        return n

    def _welcome(self, msg: Message) -> None:
        """Take the run's configuration; keep the data and model when it did not change (a
        restarted server resuming the same run), then answer READY (ready)."""
        b = checked_welcome(msg.body)  # the run's plugins imported (PluginError: one line)
        cfg = welcome_config(b)
        if self.host is not None:
            self.host.kept.clear()  # built under the last WELCOME's settings
        n = self.take_welcome(cfg, b, Profile.from_dict(b.get("profile", {})),
                              msg.arrays.get("indices"), b.get("token"), b.get("grant"),
                              welcome_tables(cfg, msg.arrays, bool(b.get("peers"))))
        self.send_ready(n, bool(b.get("peers")))

    def take_welcome(self, cfg: Any, b: dict[str, Any], profile: Profile, indices: Any,
                     token: bytes | None, grant: bytes | None, tables: tuple) -> int:
        """This client's part of a WELCOME (its own, or its process's: client/host.py);
        returns its number of training examples."""
        self.run_id, self.token = str(b.get("run_id", "")), token
        if self.admitted is not None:  # --secure: the run's client keys may reach our peer port
            self.admitted.update(k.encode() for k in b.get("peer_keys", []))
        if self.host is None:
            torch.set_num_threads(cfg.train.threads)
        examples = self.trainer.take(cfg, self.run_id, profile, indices, tables)
        self.peers.take_welcome(cfg, self.run_id, grant, self.trainer.availability)
        return examples

    def send_ready(self, n: int, peers: bool) -> None:
        """READY(ready) with this client's number of examples; first, when the run's routes hand
        models between clients, its peer socket listens and the message says where."""
        ready = {"phase": "ready", "n": n}
        if peers:
            if self.host is not None:
                self.host.check_files()
            self.peers.pump = self.pump_now  # acknowledge hand-offs to us while we wait
            new = self.peers.listen()
            if new is not None:
                self.on_socket(new)
            ready["endpoint"] = self.peers.endpoint
        self._send_server(Message(MsgKind.READY, self.name, self.run_id, body=ready))

    def _run_task(self, msg: Message, nbytes: int) -> None:
        if self._tracker is not None:  # the last zero-copy send still reads our model's memory
            self._tracker.wait()
            self._tracker = None
        if isinstance(msg, Deferred):  # decoded now, into the memory the last task freed
            got = self._accepted(self.server.finish(msg))
            if got is None or got.msg.kind != MsgKind.TASK:
                return
            msg, nbytes = got.msg, got.nbytes
        try:
            ex = self.trainer.executor_now()
        except Exception as e:  # noqa: BLE001 - e.g. its data cannot be built: the task fails
            log.exception("client %d: cannot build its data and model", self.cid)
            self._send_server(failure_message(self.cid, msg.task_id, msg.round,
                                              f"{type(e).__name__}: {e}", msg.sim_time,
                                              self.run_id))
            return
        # wired: --shaped-links, the network already took the received bytes' transfer time
        out, wired = self.trainer.train(ex, msg, nbytes)
        reply = out.reply
        nxt = self.peers.next_hop(msg, reply)
        sleep = self.trainer.sleep_real
        if nxt is not None:  # a ring route: hand the model straight to the next client
            sleep(out.sim_delay - wired, out.real_elapsed, self.pump)
            try:
                self.peers.handoff(nxt, msg, reply)
                self._send_server(self.peers.hop_done(msg, reply))
                return
            except PeerChainBroken:
                log.error("client %d: the rest of the route is unreachable; returning the model"
                          " to the server", self.cid)
                reply = to_server(reply)
        sleep(out.sim_delay - wired, out.real_elapsed, self.pump, self.trainer.up_delay(reply))
        self._send_server(reply, track=True)

    def pump(self, timeout_ms: int) -> None:
        """Read the sockets (hand-offs acknowledged at once and queued, a re-sent duplicate not
        run again; tasks queued; SHUTDOWN stops the loop): the Host's, or this client's own."""
        if self.host is not None:
            return self.host.pump(timeout_ms)
        return self.read(dict(self.poller.poll(timeout_ms)))

    def pump_now(self) -> None:
        """pump(0): what a wait calls to serve the sockets meanwhile."""
        self.pump(0)

    def on_socket(self, sock: zmq.Socket) -> None:
        """A socket opened after serving began (the peer socket): poll it too."""
        if self.host is not None:
            return self.host.watch(sock, self)
        if self.poller is not None:  # else serve() polls every socket when it starts
            self.poller.register(sock, zmq.POLLIN)
        return None

    def sockets(self) -> list[zmq.Socket]:  # the server link and the peer socket (if bound)
        return [self.link.sock] + ([self.peers.sock] if self.peers.sock is not None else [])

    def serve(self) -> int:
        """The poll loop of a process that holds only this client (see Host for several)."""
        self.poller = zmq.Poller()
        for sock in self.sockets():
            self.poller.register(sock, zmq.POLLIN)
        self.peers.pump = self.pump_now
        interrupt.install(self.must_stop)  # a long task stops between two batches
        while not self.stopping:
            code = self.check()
            if code is not None:
                return code
            try:
                if not self.step():
                    self.pump(1000)
            except interrupt.Interrupted:  # the loop's check (or SHUTDOWN) says why
                log.warning("client %d: stopped in the middle of a task", self.cid)
        self.bye()
        return EXIT_OK

    def step(self) -> bool:
        """Run one queued task or hand-off (then read what arrived meanwhile); False if idle."""
        if not self.work:
            return False
        self._run_task(*self.work.popleft())
        self.pump(0)
        return True

    def bye(self) -> None:
        """BYE to the server with this client's ledger totals."""
        self._drop_work()
        tot = dict(self.ledger.totals())  # rejected: bytes; rejected_messages: how many
        self._send_server(Message(MsgKind.BYE, self.name, self.run_id, body=tot))

    def close(self) -> None:
        """Close sockets (waiting briefly for queued messages) and the context."""
        self.link.remove(self)
        self.peers.close()
        if self.own_link:
            self.link.close()
        if self.auth is not None:
            self.auth.stop()
        if self.own_ctx:
            self.ctx.term()

    # What arrives from the server: each message accepted (and only then counted) or rejected; TASKs
    # decoded when they run.

    def hello(self) -> None:
        """READY(hello): this client's claim of its id (proven under launch), alone."""
        hello = {"phase": "hello", "cid": self.cid, "endpoint": self.peers.endpoint,
                 "device": self.device, "pid": os.getpid(), "host": socket.gethostname()[:256]}
        if self.token is not None:  # a reconnect: the server's own token from our WELCOME
            hello["token"] = self.token
        if self.run_key is not None:  # prove the id: a fresh nonce, signed with our secret
            nonce = os.urandom(16)
            secret = client_secret(self.run_key, self.cid)
            hello.update(nonce=nonce, proof=hello_proof(secret, self.cid, nonce))
        self._send_server(Message(MsgKind.READY, self.name, body=hello))

    def register(self, timeout_s: float) -> None:
        """READY (hello) -> WELCOME -> build data and model -> READY (ready)."""
        register(self.link, [self], timeout_s)
        if self.refused is not None:
            raise ConfigError(f"the server refused client {self.cid}: {self.refused}")

    def read(self, ready: dict[Any, int]) -> None:
        """Handle what the readable sockets in `ready` (a poll result) hold."""
        if self.peers.sock in ready:
            self.read_peers()
        if self.own_link and self.link.sock in ready:
            self.link.drain()

    def read_peers(self) -> None:
        """Hand-offs from peers: acknowledged at once and queued; a re-sent duplicate is not
        queued again."""
        for got in self.peers.fresh():
            self.queue_work(got)

    def queue_work(self, item: tuple[Any, int]) -> None:
        """A task or hand-off to run; the process's scheduler learns that this client has work."""
        if not isinstance(self.work, deque):  # an idle client's queue: none yet
            self.work = deque()
        self.work.append(item)
        self.link.ready.append(self)

    def on_server(self, parts: list[Any]) -> None:
        """One message from the server (its envelope removed): a TASK is queued undecoded;
        the rest is decoded, accepted (or rejected) and acted on at once."""
        d = Deferred(b"", parts, "server")
        if peek_kind(parts) in TASKS:
            return self.queue_work((d, 0))
        got = self._accepted(self.server.finish(d))
        if got is None:
            return None
        msg = got.msg
        if msg.kind == MsgKind.SHUTDOWN and "cids" in msg.arrays and self.host is not None:
            self.host.enroll.on_shutdown(msg)  # the run ended for all the process's clients
        elif msg.kind == MsgKind.SHUTDOWN:
            self.stopping = True
            self.link.attention.add(self)
        elif msg.kind == MsgKind.WELCOME and "cids" in msg.arrays and self.host is not None:
            self.host.enroll.on_welcome(msg)  # the process's WELCOME, for all its clients
        elif msg.kind == MsgKind.WELCOME:
            self._drop_work()  # what the old server sent is void now
            self._welcome(msg)
            if not self.registered:
                self.registered = True
                self.link.settled.append(self)
        elif msg.kind == MsgKind.REJECT:
            reason = str(msg.body.get("reason", ""))[:200]
            if self.host is not None and self.host.enroll.batching:  # the process's hellos refused
                return self.host.enroll.batch_refused(reason)
            if not self.registered:  # its first registration: this client stops
                if self.refused is None:
                    self.refused = reason
                    self.link.settled.append(self)
                return None
            # a re-registration refused: e.g. the server has not yet seen our old connection
            # close; try again shortly
            wait = self.link.liveness.rehello_s
            throttled.warning("client %d: the server refused to register it again (%s); "
                              "retrying in %g s", self.cid, reason, wait)
            self.rehello_at = time.monotonic() + wait
            self.link.attention.add(self)
        elif msg.kind != MsgKind.HEARTBEAT:
            log.warning("client %d: unexpected %s from the server", self.cid, msg.kind.name)
        return None

    def _accepted(self, got: Received | None) -> Received | None:
        """got counted as accepted; None if undecodable, or a kind the server never sends
        (counted as rejected)."""
        if got is None:
            return None
        if got.msg.kind not in FROM_SERVER:
            self.server.reject(got, f"{got.msg.kind.name} is not sent by the server", "server")
            return None
        self.server.accept(got, SERVER)
        return got

    def _drop_work(self) -> None:
        """Forget the queued work; tasks not decoded yet are decoded and counted first."""
        for msg, _ in self.work:
            if isinstance(msg, Deferred):
                self._accepted(self.server.finish(msg))
        self.work = ()

    def check(self) -> int | None:
        """Launcher and server liveness, re-registration; an exit code when this client must stop."""
        code = self.check_process()
        if code is None:
            self.check_flags()
        return code

    def check_process(self) -> int | None:
        """What every client of this process shares: its launcher and its server link; an exit
        code when they must all stop."""
        return EXIT_ERROR if self.link.abandoned(self.parent, self.lost_timeout) else None

    def check_flags(self) -> None:
        """Register again when the link came back, or when a refused re-registration's wait
        is over."""
        if self.rehello_at is not None and self.link.lost_since is None \
                and time.monotonic() >= self.rehello_at:
            self.rehello_at, self.rehello = None, True
        self.hello_again()

    def must_stop(self) -> bool:
        """Between two batches of a task (training/interrupt.py): read the sockets (a SHUTDOWN
        sets stopping; hand-offs are acknowledged), then stop_due()."""
        self.pump(0)
        return self.stop_due()

    def stop_due(self) -> bool:
        """The run ended for this client (SHUTDOWN), or its launcher or server is gone."""
        return self.stopping or os.getppid() != self.parent or self.link.gone(self.lost_timeout)

    def hello_again(self) -> None:
        """A link that dropped and came back lost the hello (or the WELCOME) with the old
        connection, or a refused re-registration waited: say hello again."""
        if self.rehello:
            self.rehello = False
            self.hello()
