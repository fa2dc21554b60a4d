"""The round driver: runtime-agnostic loop over a Dispatcher (in-process or ZeroMQ)."""
from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fednet import opcount
from fednet.algorithms.common import client_accuracy
from fednet.algorithms.contract import NOT_STAGED, RoundContext, StagedStrategy, Strategy
from fednet.compress.downlink import NO_DOWNLINK, Downlink
from fednet.config import RunConfig
from fednet.core.arrivals import Arrivals, AsArrived, Order
from fednet.core.boundary import Checkpoints, Clock, Mark, Marks
from fednet.core.participants import Participants
from fednet.core.replies import dp_cause
from fednet.core.server_clock import ServerClock
from fednet.core.time_split import TimeSplit
from fednet.core.state_files import NO_MANIFEST, Manifest
from fednet.core.summary import run_summary
from fednet.core.status import RunStatus
from fednet.core.verdict import Verdict
from fednet.core.work import ClientCompute
from fednet.platform.heap import settled_heap
from fednet.platform.proc import interrupts_deferred
from fednet.metrics.accounting import Ledger
from fednet.metrics.history import History
from fednet.metrics.progress import Progress
from fednet.network.churn import NO_CHURN, Churn, NoChurn
from fednet.network.step import NO_NETWORK, Network, NoNetwork
from fednet.types import Arrays, ClientInfo, Failure, Result, Task

log = logging.getLogger("fednet.server")


FollowUp = Callable[[Result | Failure], list[Task]]


class Dispatcher(Protocol):
    """Delivers a round's tasks to clients and collects what comes back."""

    def alive_clients(self) -> Sequence[ClientInfo]: ...

    def run_round(self, rnd: int, tasks: list[Task], follow: FollowUp | None = None
                  ) -> tuple[list[Result], list[Failure]]: ...


def no_cause(model: Arrays) -> str:
    """No known cause of a non-finite model beyond the learning rate (no differential privacy)."""
    return ""


def no_extra_eval(arrays: Arrays) -> dict[str, float]:
    """No more row metrics of the evaluated model (an attack without metrics of its own)."""
    return {}


class RoundDriver:
    """Runs cfg.rounds rounds of `algo` over a dispatcher, logging as it goes.

    Its collaborators come in the constructor, each one always there: the network's policies
    (`network`: NoNetwork when none is set), availability (`churn`: NoChurn without
    --availability), the task encoder (`downlink`: passes arrays through without
    --compress-down), replies in simulated-time order for asynchronous servers (`arrivals`;
    a synchronous step takes them as they come, AsArrived), the checkpoint writer
    (`checkpoint`: returns whether it wrote one; one that never does without a results folder)
    with the clients' store manifest (`manifest`), both asked through Checkpoints after every
    step, more metrics of the evaluated model (`extra_eval`: the attack's own, attack_client.py)
    and the client compute asked for (`compute`). Where the run stands is in small records of
    its own (core/boundary.py: its Clock, its Marks, its Checkpoints). How the run ends is one
    RunStatus, set by `end`; its failures and verdicts are the Verdict's."""

    def __init__(self, cfg: RunConfig, algo: Strategy, evaluate: Callable[[Any], tuple[float, float]],
                 ledger: Ledger, history: History, progress: Progress, *,
                 arrivals: Callable[[], Arrivals], compute: ClientCompute,
                 network: Network | NoNetwork = NO_NETWORK, churn: Churn | NoChurn = NO_CHURN,
                 downlink: Downlink = NO_DOWNLINK, checkpoint: Callable[[], bool] = lambda: False,
                 manifest: Manifest = NO_MANIFEST, client_state: bool = False,
                 extra_eval: Callable[[Any], dict[str, float]] = no_extra_eval) -> None:
        self.cfg, self.algo, self.evaluate = cfg, algo, evaluate
        self.staged = algo if isinstance(algo, StagedStrategy) else NOT_STAGED  # the extra hooks
        self.ledger, self.history, self.progress = ledger, history, progress
        self.network, self.churn, self.downlink = network, churn, downlink
        self.arrivals, self.compute, self.extra_eval = arrivals, compute, extra_eval
        self.server = ServerClock(cfg, algo)  # the server's compute on the clock
        self.split = TimeSplit()  # where each step's simulated time went (rows' sim_split)
        self.step_start = 0.0
        self.encoded_s = 0.0  # the server's --compress-down encoding in this step (seconds)
        # client_state: the algorithm's clients keep state between rounds
        self.checkpoints = Checkpoints(cfg.net.checkpoint_every, cfg.rounds, checkpoint,
                                       manifest, client_state)
        self.verdict = Verdict(cfg.net.max_failed_rounds, progress, self.end,
                               functools.partial(dp_cause, cfg) if cfg.dp.mode != "none"
                               else no_cause)
        self.status = RunStatus.RUNNING
        self.error = ""  # why the run failed or stopped (summary.json's error)
        self.sim_time = 0.0
        self.rounds_done = 0
        self.setup_stats: dict[str, Any] = {}
        self.participants = Participants()  # tasks per client that had one (clients.jsonl)
        self.clock = Clock(cfg.rounds)
        # the last round boundary and the last row logged (or the setup's end, or the
        # checkpoint resumed from): an interrupted run's checkpoint and totals
        self.marks = Marks(self._mark(), (0, 0.0, ledger.totals(), 0))

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The run's failures so far (summary.json, checkpoints): the verdict's record."""
        return self.verdict.failures

    def end(self, status: RunStatus, error: str = "") -> None:
        """The one place the run's status is set (with why, for summary.json's error)."""
        self.status = status
        if error:
            self.error = self.error or error

    def run(self, dispatcher: Dispatcher) -> None:
        """The setup stage, then all rounds; stops early (status says why). The objects alive
        before the setup and after the first step are kept out of the collector's full passes
        (platform/heap.py): the imports' (torch._dynamo's, first used in the first step) and
        the run's own, which live on."""
        self.clock.start()
        try:
            with settled_heap() as settle:
                settle()
                self._run(dispatcher, settle)
        finally:
            self.clock.stop()

    def _run(self, dispatcher: Dispatcher, settle: Callable[[], None]) -> None:
        if self.rounds_done == 0 and not self.setup(dispatcher):
            return
        step = max(1, self.staged.rounds_per_step())
        first = self.rounds_done
        for rnd in range(self.rounds_done, self.cfg.rounds, step):
            try:
                if not self._step(rnd, step, dispatcher):
                    return
            except KeyboardInterrupt:  # the server state is still the last finished round's
                self.marks.interrupted(self.rounds_done)  # (unless it was aggregating)
                raise
            if rnd == first:  # what the first step imported (torch._dynamo) and built
                settle()
        ending = self.verdict.mostly_failed()
        self.end(*(ending or (RunStatus.COMPLETED, "")))

    def _mark(self) -> Mark:
        return self.ledger.totals(), self.algo.state.next_task, self.sim_time

    def _step(self, rnd: int, step: int, dispatcher: Dispatcher) -> bool:
        """One step, then its checkpoint when one is due; False when the run stops here."""
        self.marks.mark = self._mark()
        clients = alive = dispatcher.alive_clients()
        if not clients:
            self.end(RunStatus.NO_CLIENTS)
            log.error("round %d: no client is alive; stopping the run", rnd + 1)
            return False
        clients, self.sim_time = self.churn.select(clients, self.sim_time)  # among those online
        if not clients:  # (--availability: none now, nor later)
            self.end(RunStatus.NO_CLIENTS_ONLINE)
            log.error("round %d: no client is online now or later (--availability); "
                      "stopping the run", rnd + 1)
            return False
        # an asynchronous step picks its clients as it goes (online then): all of them
        pool = alive if self.staged.virtual_order else clients
        halt = self.algo.stop_before(rnd, pool)  # e.g. differential privacy's budget_spent
        if halt is not None:
            status, why = halt
            self.end(RunStatus(status))
            self.progress.message(why)
            return False
        self.round(rnd, pool, dispatcher, min(step, self.cfg.rounds - rnd))
        self.checkpoints.step_done(rnd, self.rounds_done)
        return not self.status.stops

    def setup(self, dispatcher: Dispatcher) -> bool:
        """Round -1: tasks the algorithm needs before training (e.g. FedSeq's pre-training)."""
        clients, self.sim_time = self.churn.select(dispatcher.alive_clients(), self.sim_time)
        tasks = self.staged.setup_tasks(clients)
        if not tasks:
            return True
        for t in tasks:  # sent now (after a wait for clients to come online), as a round's
            t.sim_time = self.sim_time
        tasks = self.stamp(tasks)
        self.progress.message(f"setup stage: {len(tasks)} tasks")
        step = self.network.step(self.sim_time, -1, tasks, 1, None, setup=True)
        results, failures = dispatcher.run_round(-1, self.compute.charge(step.send(tasks)),
                                                 self.progress.counter(len(tasks), "setup stage"))
        results = step.close(results, None)
        self.verdict.note(-1, failures)
        self.sim_time = max([self.sim_time] + [r.sim_time for r in results])
        t0 = time.perf_counter()
        with opcount.counted() as work:  # the server's work on them (e.g. FedSeq's grouping)
            stats = self.setup_stats = self.staged.setup_results(results, failures)
        stats["server_s"] = time.perf_counter() - t0  # e.g. FedSeq's grouping
        self.sim_time += self.server.did(work)  # on its clock: the first round waits for it
        self.progress.message(_setup_done(stats))
        self.participants.commit()
        stats["sim_s"] = self.sim_time
        stats["bytes"] = self.ledger.round_totals(-1)
        self.marks.logged = (0, self.sim_time, self.ledger.totals(), self.ledger.messages)
        return True

    def resume(self, state: dict[str, Any]) -> None:
        """Continue after the checkpointed round (state from checkpoint.load)."""
        self.rounds_done = int(state["rounds_done"])
        self.checkpoints.resume(self.rounds_done)
        self.sim_time = float(state["sim_time"])
        self.verdict.failures[:] = list(state.get("failures", []))
        self.setup_stats = dict(state.get("setup", {}))
        self.ledger.add_totals(-2, {k: int(v) for k, v in state["ledger"].items()})
        self.clock.segments = list(state.get("segments", []))
        self.participants = state.get("_participants") or Participants()
        self.marks.logged = (self.rounds_done, self.sim_time, self.ledger.totals(),
                             self.ledger.messages)
        self.compute.resume(self.history.rows)  # the client compute of the rows it keeps
        self.server.resume(self.history.rows)

    def stamp(self, tasks: list[Task]) -> list[Task]:
        """Tasks about to leave: the checkpoint's tag for clients that keep state
        (Checkpoints.stamp), their clients counted, their arrays as they travel."""
        self.checkpoints.stamp(tasks)
        self.participants.note(tasks)
        if not self.downlink.spec.on:  # no --compress-down: the arrays travel as they are
            return tasks
        work: dict[str, float] = {}
        for t in tasks:
            with opcount.counted() as enc:  # the server's encoding (a model's first task)
                t.wire, t.arrays = self.downlink.encode(t.arrays, t.task_id, t.round)
            opcount.add(work, enc)
        self.encoded_s += self.server.before(tasks, work)  # they leave once it is done
        return tasks

    def round(self, rnd: int, clients: Sequence[ClientInfo], dispatcher: Dispatcher, span: int = 1
              ) -> dict[str, Any]:
        """One step (span logical rounds): configure, dispatch, aggregate, evaluate, log."""
        algo = self.algo
        self.checkpoints.step_start = rnd
        ctx = RoundContext(rnd, self.sim_time, self.churn.online_at)
        tasks = algo.start_round(ctx, clients)
        for t in tasks:
            t.sim_time = self.sim_time
        self.encoded_s = 0.0  # (the step's server encoding, its sim_split server_s)
        tasks = self.stamp(tasks)
        ordered = self.staged.virtual_order
        step = self.network.step(self.sim_time, rnd, tasks, span, ctx.target, ordered=ordered)
        order = self.arrivals() if ordered else AsArrived()  # in simulated-time order, or as they come
        order.open(self.ledger)
        # replies release follow-up tasks: several rounds a step, replies in simulated-time
        # order, or stages of one round (secure aggregation)
        pipelined = span > 1 or ordered or self.staged.chained
        charged = self.staged.server_charged
        streams = ordered and self.staged.streams_points  # evaluation points as replies go on

        def release(seen: Result | Failure) -> list[Task]:
            algo.absorb(seen)  # streaming algorithms fold the result in and free its arrays
            self.compute.arrived(seen)  # (an ordered step's tasks count once done)
            nxt = self.stamp(self.staged.follow_up(seen)) if pipelined else []
            self.server.total += charged()  # an asynchronous server's work, as it happens
            nxt = self.churn.trim(nxt)  # (offline first hops skipped)
            return self._sent(self.compute.charge(step.send(nxt), ordered))

        def on_reply(done: Result | Failure) -> list[Task]:
            seen = step.reply(done)  # None: held or a straggler (network/step.py)
            if seen is None:
                return []
            order.arrive(seen)
            out: list[Task] = []
            for ready in order.released():
                nxt = release(ready)
                order.sent(nxt)
                out += nxt
                if streams:
                    self._points(order)
            return out

        self.step_start = self.sim_time
        first = self._sent(self.compute.charge(step.send(tasks), ordered))
        order.sent(first)
        results, failures = dispatcher.run_round(rnd, first, on_reply)
        with interrupts_deferred():  # a Ctrl-C now comes once the round is logged
            return self._close(rnd, span, results, failures, step, order)

    def _sent(self, tasks: list[Task]) -> list[Task]:
        """Tasks leaving (stamped): noted for the step's time split."""
        self.split.sent(tasks)
        return tasks

    def _close(self, rnd: int, span: int, results: list[Result], failures: list[Failure],
               step: Any, order: Order) -> dict[str, Any]:
        """The step's end: aggregate, evaluate, log; the boundary mark of the round after it."""
        self.marks.mutating = True  # until the round is logged: no checkpoint of it on Ctrl-C
        results = step.close(results, self.algo.absorb)
        metrics = self.algo.aggregate_round(rnd, results, failures)
        end = self.staged.step_end()  # None: at its last reply
        self.sim_time = max([self.sim_time, step.end]
                            + [r.sim_time for r in results]) if end is None else end
        if not self.staged.virtual_order:  # the server aggregates before the next round
            server_s = self.server.charge(self.server.round_work(results), metrics)
            self.sim_time += server_s
        else:  # (charged as replies went on: the step's last update's wait for the server)
            server_s = self.staged.server_tail() if end is not None else 0.0
            self.server.total += self.staged.server_charged()
        for r in results:
            self.split.arrived(r)
        metrics = {**metrics, **self.split.close(self.step_start, self.sim_time,
                                                 server_s + self.encoded_s, metrics)}
        self.verdict.note(rnd, failures)  # (in task order, whatever order they came in)
        # usable: what the algorithm says it aggregated (secure aggregation: one unmasked
        # result, or none), else every result that came
        self.verdict.count_usable(rnd, metrics, len(results), len(failures))
        self._points(order)  # e.g. FedSeqInter's bank
        acc, loss, metrics = self._evaluate(rnd, results, failures, metrics)
        late = step.stragglers  # (an ordered step's are in its results)
        metrics = {**metrics, "tasks": len(results) + len(failures) + late,  # (of the step)
                   **order.columns(failures, step.row),
                   **self.churn.row(rnd, span)}  # online, waits, skipped peers
        self.compute.settle()  # every task of the step counts in its last row
        row = self._log(rnd + span - 1, acc, loss, metrics, self.sim_time, order)
        self.rounds_done = rnd + span
        self.participants.commit()
        self.marks.mark, self.marks.mutating = self._mark(), False
        return row

    def _evaluate(self, rnd: int, results: list[Result], failures: list[Failure],
                  metrics: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
        """(accuracy, loss, metrics) of the step's model; the run ends if it diverged."""
        if self.algo.eval_clients:  # personalized: clients evaluated their own models
            acc, loss, spread = client_accuracy(results)
            self.verdict.check_clients(rnd, results, failures)  # a client's own model diverged
            return acc, loss, {**metrics, **spread}
        model = self.algo.eval_arrays()
        acc, loss = self.evaluate(model)
        self.verdict.check_finite(rnd, model, results, failures, loss)
        return acc, loss, {**metrics, **self.extra_eval(model)}  # the attack's own metrics

    def _points(self, order: Order) -> None:
        """Evaluate and log the step's interim points: at its end, and as replies go on when
        an ordered step's algorithm streams them (FedAsync, FedBuff)."""
        for t, arrays, sim, extra in self.staged.interim_points():
            acc_t, loss_t = self.evaluate(arrays)
            flag = {} if self.staged.streams_points else {"interim": True}  # (a row of its own)
            self._log(t, acc_t, loss_t, {**extra, **flag}, sim, order)

    def _log(self, rnd: int, acc: float, loss: float, metrics: dict[str, Any], sim: float,
             order: Order) -> dict[str, Any]:
        """Write one metrics row (its traffic: Order.row) and show it."""
        count = order.row(rnd)
        self.marks.logged = (rnd + 1, sim, count.totals, count.messages)
        row: dict[str, Any] = {
            "round": rnd, "accuracy": acc, "loss": loss, **metrics, "wall_s": self.clock.wall(),
            "sim_s": sim, "bytes_round": count.bytes_round, "bytes_total": count.total,
            **self.compute.row(count.upto),  # client compute so far
            "server_compute_s": self.server.total,  # the server's, so far
        }
        if count.stages:  # a protocol's stages inside the round (secure aggregation): their bytes
            row["bytes_by_stage"] = count.stages
        if not math.isfinite(loss):
            log.warning("round %d: the model's loss is not finite", rnd + 1)
        self.history.log_round(row)
        self.progress.update(row)
        return row

    def summary(self, clients: Sequence[ClientInfo], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The summary.json dictionary (core/summary.py)."""
        return run_summary(self, clients, extra)


def _setup_done(stats: dict[str, Any]) -> str:
    """The line that ends the setup stage (FedSeq: the superclients it grouped)."""
    took = stats["server_s"]
    if "superclients" not in stats:
        return f"setup stage done ({took:.2f}s)"
    groups = stats["superclients"]
    return f"setup stage done: {groups} superclient{'' if groups == 1 else 's'}, grouped in {took:.2f}s"
