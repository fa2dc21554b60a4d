"""The in-process runtime (`fednet local`): the same executors, codec and ledger, no sockets."""
from __future__ import annotations

from collections import deque

import numpy as np

import torch

from fednet import opcount
from fednet.algorithms.updates import forget_ahead
from fednet.core.batching import Ahead, batching, note
from fednet.core.checkpoint import ClientStates
from fednet.core.executor import KEEP_BYTES, Executor, KeptExecutors, share_working_models
from fednet.config import RunConfig
from fednet.core.replies import receive
from fednet.core.rounds import FollowUp
from fednet.core.run import Run
from fednet.core.session import Session
from fednet.core.state_files import StateStore
from fednet.data.partition import part_size
from fednet.metrics.accounting import SERVER
from fednet.metrics.history import resolve_out
from fednet.models import drop_templates, keep_template
from fednet.network import latency
from fednet.network.churn import next_online_hop
from fednet.platform.gpus import check_gpus, device_for, gpu_counts
from fednet.training.batched import release_buffers
from fednet.protocol import Message, MsgKind
from fednet.protocol.handover import handover
from fednet.types import ClientInfo, Failure, Result, Roster, Task, client_name
from fednet.core.wire import (ack_message, handoff_message, hop_done_message, placeholder_endpoints,
                         record_sizes, task_message)


class Executors:
    """Client cid's Executor, built when the client is given work. A client whose algorithm
    keeps nothing between tasks shares one working model with the others
    (executor.share_working_models); its Executor (its data views, its algorithm's client half)
    is kept for its next task while all those kept weigh at most `keep_bytes` (the least recently
    used dropped first), so that a small population's clients are built once, and a large one's
    idle clients cost nothing but their partition and profile (the session's). One that keeps
    state keeps it in the run's store (core/state_files.py, RUN/checkpoint/clients) between its
    tasks, its Executor dropped after each. Only without a results folder (or when the store
    cannot be written) is a stateful client's Executor kept."""

    def __init__(self, session: Session, keep_bytes: int = KEEP_BYTES) -> None:
        self.s = session
        self.built: dict[int, Executor] = {}  # the clients whose state only their object holds
        self.resumed = dict(session.resumed_clients)  # --resume of an older checkpoint
        self.kept = KeptExecutors(keep_bytes)  # stateless clients', least recently used out
        self.held: dict[int, Executor] = {}  # built for a block trained ahead, until its task

    def __getitem__(self, cid: int) -> Executor:
        ex = self.held.pop(cid, None)
        ex = self.built.get(cid, ex)
        if ex is not None:
            return ex
        kept = self.kept.take(cid)
        return kept if kept is not None else self._build(cid)

    def done(self, ex: Executor) -> None:
        """After ex's task: kept if it is the only home of its state, or (a stateless client's)
        within the budget."""
        if ex.holds_state:
            self.built[ex.cid] = ex
        elif not ex.stateful:
            self.kept.keep(ex)

    def hold(self, ex: Executor) -> None:
        """Keep ex for its task, which runs later in the round (--batch-clients trained it
        ahead: its task then builds no Executor again)."""
        self.held[ex.cid] = ex

    def release(self) -> None:
        """The round ended: the Executors held for tasks that never ran are done."""
        while self.held:
            self.done(self.held.popitem()[1])

    def clear(self) -> None:
        """Drop the kept Executors (the run ended)."""
        self.kept.clear()

    def _build(self, cid: int) -> Executor:
        s, cfg = self.s, self.s.cfg
        ex = Executor(cid, cfg, s.profiles[cid], device_for(cid, cfg.gpus), s.run_id,
                      s.parts[cid], out=str(s.out) if s.out is not None else "")
        ex.availability = s.availability
        ex.links = s.profiles  # a hand-off pays its sender's uplink (latency.peer_delay)
        if cid in self.resumed:
            ex.restore(*self.resumed.pop(cid))
        return ex

    def items(self) -> list[tuple[int, Executor]]:
        """(cid, Executor) of every client with a state, those in the store built again with it
        (for tests and golden numbers: it builds every such client at once)."""
        out = dict(self.built)
        stored = StateStore(self.s.out, self.s.cfg.algo.name).cids() if self.s.out else []
        for cid in stored:
            if cid not in out:
                ex = out[cid] = self._build(cid)
                assert ex.store is not None, "a client whose state is in the store has the store"
                ex.take_back(ex.store.take(cid, self.s.run_id, None))
        return sorted(out.items())

    def states(self) -> ClientStates | None:
        """For a checkpoint: the states only objects hold (and those resumed from an older
        checkpoint, not built again yet); None when the store holds every client's."""
        out = {**self.resumed, **{c: ex.client_state() for c, ex in self.built.items()}}
        return out or None


class InprocDispatcher:
    """Delivers each task as the wire would (protocol/handover.py: the header packed and read
    back, the arrays copied, the bytes counted exactly) and calls the client's executor."""

    def __init__(self, session: Session) -> None:
        self.s = session
        t = session.model_template()  # built once, copied by every executor built
        keep_template(t["name"], t["num_classes"], tuple(t["input_shape"]), dataset=t["dataset"],
                      seed=t["seed"])
        self.executors = Executors(session)
        session.client_view = self.executors.states
        self._alive: Roster | None = None

    def close(self) -> None:
        """Forget the model template, the shared working models and the kept Executors (the
        next run builds its own)."""
        drop_templates()
        share_working_models(False)
        self.executors.clear()
        release_buffers()

    def alive_clients(self) -> Roster:
        """Every client (none can die in-process); no executor is built for it. A roster of
        ids (fednet.types.Roster): a client's record, its size with it, is built when it is read
        (building ten million took half of a one-round run)."""
        if self._alive is None:
            parts, gpus = self.s.parts, self.s.cfg.gpus

            def info(cid: int) -> ClientInfo:
                return ClientInfo(cid, part_size(parts, cid), device_for(cid, gpus), "inproc", 0,
                                  "localhost")

            self._alive = Roster(np.arange(self.s.cfg.clients, dtype=np.int64), info,
                                 lambda ids: gpu_counts(ids, gpus))
        return self._alive

    def run_round(self, rnd: int, tasks: list[Task], follow: FollowUp | None = None
                  ) -> tuple[list[Result], list[Failure]]:
        """Run the tasks one after another; follow-up tasks join the queue as results arrive.
        With --batch-clients the round's first tasks train in blocks (core/batching.py), each
        block just before its first task runs; the tasks still run one after another."""
        results: list[Result] = []
        failures: list[Failure] = []
        queue = deque(tasks)
        cfg, ex = self.s.cfg, self.executors
        ahead = (Ahead(cfg, tasks, lambda c: device_for(c, cfg.gpus), ex.__getitem__, ex.hold)
                 if batching(cfg) else None)  # --batch-clients: core/batching.py
        try:
            while queue:
                task = queue.popleft()
                if ahead is not None:
                    ahead.before(task)
                got = self._deliver(task)
                if isinstance(got, Failure):
                    failures.append(got)
                else:
                    results.append(got)
                if follow is not None:
                    queue.extend(follow(got))
        finally:
            forget_ahead()
            ex.release()
        return results, failures

    def _send(self, msg: Message, src: str, dst: str) -> tuple[Message, int]:
        """The message as the receiver gets it (decode(encode(msg)), each array copied into
        memory of its own) and its bytes, counted in the ledger (protocol/handover.py)."""
        got, header, payload = handover(msg)  # the payload is the arrays' bytes, as they were
        return got, record_sizes(self.s.ledger, msg, header, payload, src, dst, payload)

    def _deliver(self, task: Task) -> Result | Failure:
        """The task's whole route: TASK, then HANDOFF/ACK/HOP_DONE per hop, then RESULT."""
        led = self.s.ledger
        msg = task_message(task, self.s.run_id)
        if len(task.route) > 1:
            msg.body["endpoints"] = placeholder_endpoints(task.route)
        got, n = self._send(msg, SERVER, client_name(task.cid))
        while True:
            cid = task.route[int(got.body["hop"])]
            ex = self.executors[cid]
            out = ex.on_task(got, n)
            self.executors.done(ex)
            reply = out.reply
            hop = int(got.body["hop"]) + 1
            if reply.kind != MsgKind.RESULT or hop >= len(task.route):
                break
            online, skipped = next_online_hop(self.s.availability, task.route, hop, reply.sim_time)
            if online is None:  # every later peer is offline: the model goes back to the server
                reply.body["skipped"] = skipped
                break
            hop = online
            me, peer = client_name(cid), client_name(task.route[hop])
            t0 = led.totals()["tensor_bytes"]
            with opcount.counted() as work:  # --compress-handoff: the client's encoding,
                sent = self.s.for_peer(reply.arrays, reply.task_id, hop)  # after its training:
            if work:  # the hand-off leaves once it is done (as client/peers.handoff)
                reply.sim_time += latency.protocol_time(ex.profile, work)
            nxt, n = self._send(handoff_message(got, reply, hop, arrays=sent), me, peer)
            _, n_ack = self._send(ack_message(nxt, peer), peer, me)
            done = hop_done_message(got, reply, n + n_ack, led.totals()["tensor_bytes"] - t0, hop)
            if skipped:  # offline peers passed over (--availability)
                done.body["skipped"] = skipped
                self.s.skipped_peers(reply.round, skipped)
            self._send(done, me, SERVER)
            got = nxt
        back, n2 = self._send(reply, client_name(cid), SERVER)
        came = receive(self.s, back, cid, n2, task)
        # --availability: offline before the result arrived?
        return self.s.arrived(came, back.sim_time, back.body.get("skipped", 0))


def run_local(cfg: RunConfig, quiet: bool = False, write: bool = True, prepare=None,
              resume: bool = False) -> dict:
    """Run a whole experiment in this process; returns the summary dict.

    `prepare(session)`, if given, runs once the session exists (as in run_zmq). The `Run`
    writes the summary and sets the status on Ctrl-C and errors, as for fednet launch.
    """
    check_gpus(cfg.gpus)
    share_working_models(False)  # nothing left from what ran in this process before
    share_working_models()  # clients that keep no model share one (Executors)
    torch.set_num_threads(cfg.train.threads)
    out = resolve_out(cfg) if write else None
    with Run("local", out) as run:
        session = run.open(Session(cfg, quiet=quiet, write=write, out=out, resume=resume,
                                   local=True))
        if prepare is not None:
            prepare(session)
        session.progress.message(session.describe())
        if note(cfg):  # --batch-clients asked of an algorithm that cannot batch
            session.progress.message(note(cfg))
        session.driver.verdict.log_hint = "its traceback is in this command's log above"
        dispatcher = InprocDispatcher(session)
        run.on_stop(dispatcher.close)
        run.clients = dispatcher.alive_clients
        run.finish_here()
        run.started()
        session.driver.run(dispatcher)
    assert run.summary is not None
    return run.summary
