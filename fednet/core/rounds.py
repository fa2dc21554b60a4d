"""The round driver: runtime-agnostic loop over a Dispatcher (in-process or ZeroMQ)."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fednet.algorithms.common import client_accuracy
from fednet.algorithms.contract import NOT_STAGED, RoundContext, StagedStrategy, Strategy
from fednet.compress.downlink import Downlink
from fednet.config import RunConfig
from fednet.core.arrivals import Arrivals
from fednet.core.participants import Participants
from fednet.core.state_files import NO_MANIFEST, Manifest
from fednet.core.summary import run_summary
from fednet.core.status import RunStatus
from fednet.core.verdict import Verdict
from fednet.core.work import ClientCompute
from fednet.platform.proc import interrupts_deferred
from fednet.metrics.accounting import Ledger
from fednet.metrics.history import History
from fednet.metrics.progress import Progress
from fednet.compress import Spec
from fednet.network.churn import NO_CHURN, Churn, NoChurn
from fednet.network.step import NO_NETWORK, Network, NoNetwork
from fednet.types import ClientInfo, Failure, Result, Task

log = logging.getLogger("fednet.server")


FollowUp = Callable[[Result | Failure], list[Task]]


class Dispatcher(Protocol):
    """Delivers a round's tasks to clients and collects what comes back."""

    def alive_clients(self) -> Sequence[ClientInfo]: ...

    def run_round(self, rnd: int, tasks: list[Task], follow: FollowUp | None = None
                  ) -> tuple[list[Result], list[Failure]]: ...


class RoundDriver:
    """Runs cfg.rounds rounds of `algo` over a dispatcher, logging as it goes.

    Its collaborators come in the constructor, each one always there: the network's policies
    (`network`: NoNetwork when none is set), availability (`churn`: NoChurn without
    --availability), the task encoder (`downlink`: passes arrays through without
    --compress-down), replies in simulated-time order for asynchronous servers (`arrivals`),
    the checkpoint writer (`checkpoint`: returns whether it wrote one; one that never does
    without a results folder), the clients' store manifest (`manifest`) and more metrics of the
    evaluated model (`extra_eval`: --attack backdoor's success rate). How the run ends is
    one RunStatus, set by `end`; its failures and verdicts are the Verdict's."""

    def __init__(self, cfg: RunConfig, algo: Strategy, evaluate: Callable[[Any], tuple[float, float]],
                 ledger: Ledger, history: History, progress: Progress | None = None, *,
                 network: Network | NoNetwork = NO_NETWORK, churn: Churn | NoChurn = NO_CHURN,
                 downlink: Downlink | None = None,
                 arrivals: Callable[[], Arrivals] | None = None,
                 checkpoint: Callable[[], bool] = lambda: False,
                 manifest: Manifest = NO_MANIFEST, client_state: bool = False,
                 extra_eval: Callable[[Any], dict[str, float]] | None = None,
                 compute: ClientCompute | None = None) -> None:
        self.cfg, self.algo, self.evaluate = cfg, algo, evaluate
        self.staged = algo if isinstance(algo, StagedStrategy) else NOT_STAGED  # the extra hooks
        self.ledger, self.history = ledger, history
        self.progress = progress or Progress(cfg.rounds, quiet=True)
        self.network, self.churn, self.manifest = network, churn, manifest
        self.downlink = downlink if downlink is not None else Downlink(Spec(), cfg.seed)
        self.arrivals = arrivals if arrivals is not None else _no_order(cfg)
        self.checkpoint = checkpoint
        self.client_state = client_state  # the algorithm's clients keep state between rounds
        # more row metrics of the evaluated model (--attack backdoor: its success rate)
        self.extra_eval = extra_eval
        # the client compute asked for (the session's knows the partition; else no samples)
        self.compute = compute or ClientCompute(cfg, lambda cid: 0)
        self.verdict = Verdict(cfg.net.max_failed_rounds, self.progress)
        self.status = RunStatus.RUNNING
        self.error = ""  # why the run failed or stopped (summary.json's error)
        self.sim_time = 0.0
        self.rounds_done = 0
        self.setup_stats: dict[str, Any] = {}
        self.participants = Participants()  # tasks per client that had one (clients.jsonl)
        # the last round is checkpointed (--checkpoint-every, or a resumed run: its checkpoint
        # must never stay behind the rounds it finished, core/checkpoint._check_history)
        self.keep_last = bool(cfg.net.checkpoint_every)
        self.ckpt_round = 0  # rounds done at the last checkpoint (tasks carry it: client state)
        self.step_start = 0  # the first round of the step now running
        self.t0 = time.monotonic()
        self.wall_before = 0.0  # the wall-clock of a resumed run's earlier segments
        self.segments: list[dict[str, Any]] = []  # those segments (summary.json)
        # (ledger totals, task counter, simulated time) at the last round boundary, and that
        # mark when Ctrl-C came while the state was still that round's (see _run)
        self.mark: tuple[dict[str, int], int, float] | None = None
        self.boundary: tuple[dict[str, int], int, float] | None = None
        self.mutating = False  # a round is being aggregated, evaluated and logged
        self.t_end: float | None = None
        # (rounds, simulated time, ledger totals, messages) at the last row logged (or the
        # setup's end, or the checkpoint resumed from): an interrupted run's totals
        self.logged: tuple[int, float, dict[str, int], int] = (0, 0.0, ledger.totals(), 0)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The run's failures so far (summary.json, checkpoints): the verdict's record."""
        return self.verdict.failures

    def end(self, status: RunStatus, error: str = "") -> None:
        """The one place the run's status is set (with why, for summary.json's error)."""
        self.status = status
        if error:
            self.error = self.error or error

    def wall(self) -> float:
        """Seconds of training: from the first round's start to the last round's end (or now),
        the earlier segments of a resumed run included."""
        return self.wall_before + (self.t_end or time.monotonic()) - self.t0

    def run(self, dispatcher: Dispatcher) -> None:
        """The setup stage, then all rounds; stops early (status says why)."""
        self.t0 = time.monotonic()
        self.t_end = None
        try:
            self._run(dispatcher)
        finally:
            self.t_end = time.monotonic()

    def _run(self, dispatcher: Dispatcher) -> None:
        if self.rounds_done == 0 and not self.setup(dispatcher):
            return
        step = max(1, self.staged.rounds_per_step())
        for rnd in range(self.rounds_done, self.cfg.rounds, step):
            try:
                if not self._step(rnd, step, dispatcher):
                    return
            except KeyboardInterrupt:  # the server state is still the last finished round's
                if not self.mutating and self.rounds_done > 0:  # (unless it was aggregating)
                    self.boundary = self.mark  # Session.checkpoint_interrupted
                raise
        if self.verdict.usable_rounds == 0 and self.rounds_done > 0 and self.failures:
            self.end(*self.verdict.failed("no round of the run had a usable result"))
        else:
            self.end(RunStatus.COMPLETED)

    def _step(self, rnd: int, step: int, dispatcher: Dispatcher) -> bool:
        """One step and its checkpoint; False when the run stops here."""
        self.mark = (self.ledger.totals(), self.algo.state.next_task, self.sim_time)
        clients = alive = dispatcher.alive_clients()
        if not clients:
            self.end(RunStatus.NO_CLIENTS)
            log.error("round %d: no client is alive; stopping the run", rnd)
            return False
        clients, self.sim_time = self.churn.select(clients, self.sim_time)  # among those online
        if not clients:  # (--availability: none now, nor later)
            self.end(RunStatus.NO_CLIENTS_ONLINE)
            log.error("round %d: no client is online now or later (--availability); "
                      "stopping the run", rnd)
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
        every = self.cfg.net.checkpoint_every
        due = (every and self.rounds_done // every > rnd // every) or (
            self.rounds_done == self.cfg.rounds and self.keep_last)
        if due and self.checkpoint():
            self.ckpt_round = self.rounds_done
        return not self.status.stops

    def setup(self, dispatcher: Dispatcher) -> bool:
        """Round -1: tasks the algorithm needs before training (e.g. FedSeq's pre-training)."""
        clients, self.sim_time = self.churn.select(dispatcher.alive_clients(), self.sim_time)
        tasks = self.stamp(self.staged.setup_tasks(clients))
        if not tasks:
            return True
        for t in tasks:  # sent now (after a wait for clients to come online), as a round's
            t.sim_time = self.sim_time
        self.progress.message(f"setup stage: {len(tasks)} tasks")
        step = self.network.step(self.sim_time, -1, tasks, 1, None, setup=True)
        results, failures = dispatcher.run_round(-1, self.compute.charge(step.send(tasks)),
                                                 self.progress.counter(len(tasks), "setup stage"))
        results = step.close(results, None)
        self.verdict.note(-1, failures)
        self.sim_time = max([self.sim_time] + [r.sim_time for r in results])
        t0 = time.perf_counter()
        self.setup_stats = self.staged.setup_results(results, failures)
        took = self.setup_stats["server_s"] = time.perf_counter() - t0  # e.g. FedSeq's grouping
        groups = self.setup_stats.get("superclients")
        plural = "" if groups == 1 else "s"
        self.progress.message(f"setup stage done: {groups} superclient{plural}, grouped in "
                              f"{took:.2f}s" if groups is not None
                              else f"setup stage done ({took:.2f}s)")
        self.participants.commit()
        self.setup_stats["sim_s"] = self.sim_time
        self.setup_stats["bytes"] = self.ledger.round_totals(-1)
        self.logged = (0, self.sim_time, self.ledger.totals(), self.ledger.messages)
        return True

    def resume(self, state: dict[str, Any]) -> None:
        """Continue after the checkpointed round (state from checkpoint.load)."""
        self.rounds_done = self.ckpt_round = int(state["rounds_done"])
        self.keep_last = True
        self.sim_time = float(state["sim_time"])
        self.verdict.failures[:] = list(state.get("failures", []))
        self.setup_stats = dict(state.get("setup", {}))
        self.ledger.add_totals(-2, {k: int(v) for k, v in state["ledger"].items()})
        self.segments = list(state.get("segments", []))
        self.participants = state.get("_participants") or Participants()
        self.wall_before = float(sum(s["wall_s"] for s in self.segments))
        self.logged = (self.rounds_done, self.sim_time, self.ledger.totals(), self.ledger.messages)
        self.compute.resume(self.history.rows)  # the client compute of the rows it keeps

    def segment(self) -> dict[str, Any]:
        """This segment of the run (so far), for the checkpoint and the summary."""
        first = self.segments[-1]["rounds"][1] if self.segments else 0
        return {"rounds": [first, self.rounds_done], "rounds_planned": self.cfg.rounds,
                "wall_s": self.wall() - self.wall_before}

    def stamp(self, tasks: list[Task]) -> list[Task]:
        """With clients that keep state, every task says the rounds done at the last checkpoint
        (`ckpt`; without --checkpoint-every, at the step's start, where an interrupt writes
        one): the clients keep their state files by it (core/state_files.py)."""
        if self.client_state:
            ckpt = self.ckpt_round if self.cfg.net.checkpoint_every else self.step_start
            for t in tasks:
                t.body = {**t.body, "ckpt": ckpt}
            self.manifest.touch(c for t in tasks for c in t.route)  # files that may change
        self.participants.note(tasks)
        for t in tasks:  # as they travel (--compress-down; else as they are)
            t.wire, t.arrays = self.downlink.encode(t.arrays, t.task_id, t.round)
        return tasks

    def round(self, rnd: int, clients: Sequence[ClientInfo], dispatcher: Dispatcher, span: int = 1
              ) -> dict[str, Any]:
        """One step (span logical rounds): configure, dispatch, aggregate, evaluate, log."""
        algo = self.algo
        self.step_start = rnd
        ctx = RoundContext(rnd, self.sim_time, self.churn.online_at)
        tasks = self.stamp(algo.start_round(ctx, clients))
        for t in tasks:
            t.sim_time = self.sim_time
        ordered = self.staged.virtual_order
        step = self.network.step(self.sim_time, rnd, tasks, span, ctx.target,
                                                  ordered=ordered)
        order = self.arrivals() if ordered else None
        # replies release follow-up tasks: several rounds a step, replies in simulated-time
        # order, or stages of one round (secure aggregation)
        pipelined = span > 1 or order is not None or self.staged.chained
        base = {**self.ledger.totals(), "messages": self.ledger.messages}

        def release(seen: Result | Failure) -> list[Task]:
            algo.absorb(seen)  # streaming algorithms fold the result in and free its arrays
            self.compute.arrived(seen)  # (an ordered step's tasks count once done)
            nxt = self.stamp(self.staged.follow_up(seen)) if pipelined else []
            nxt = self.churn.trim(nxt)  # (offline first hops skipped)
            return self.compute.charge(step.send(nxt), ordered)

        def on_reply(done: Result | Failure) -> list[Task]:
            seen = step.reply(done)  # None: held or a straggler
            if seen is None:
                return []
            if order is None:
                return release(seen)
            order.arrive(seen)  # released in simulated-time order (core/arrivals.py)
            out: list[Task] = []
            while (ready := order.next()) is not None:
                nxt = release(ready)
                order.sent(nxt)
                out += nxt
                self._points(order, base)
            return out

        first = self.compute.charge(step.send(tasks), ordered)
        if order is not None:
            order.sent(first)
        results, failures = dispatcher.run_round(rnd, first, on_reply)
        with interrupts_deferred():  # a Ctrl-C now comes once the round is logged
            return self._close(rnd, span, results, failures, step, order, base)

    def _close(self, rnd: int, span: int, results: list[Result], failures: list[Failure],
               step: Any, order: Arrivals | None, base: dict[str, int]) -> dict[str, Any]:
        """The step's end: aggregate, evaluate, log; the boundary mark of the round after it."""
        self.mutating = True  # until the round is logged: no checkpoint of it on Ctrl-C
        algo = self.algo
        results = step.close(results, algo.absorb)
        metrics = self.algo.aggregate_round(rnd, results, failures)
        end = self.staged.step_end()
        self.sim_time = max([self.sim_time, step.end]
                            + [r.sim_time for r in results]) if end is None else end
        if order is not None:  # in the order the algorithm saw them, not the runtime's
            failures = sorted(failures, key=lambda f: (f.sim_time, f.task_id))
        self.verdict.note(rnd, failures)
        # usable: what the algorithm says it aggregated (secure aggregation: one unmasked
        # result, or none), else every result that came
        ending = self.verdict.count_usable(rnd, int(metrics.get("results", len(results))))
        if ending is not None:
            self.end(*ending)
        self._points(order, base)  # e.g. FedSeqInter's bank
        if self.algo.eval_clients:  # personalized: clients evaluated their own models
            acc, loss, spread = client_accuracy(results)
            metrics = {**metrics, **spread}
        else:
            acc, loss = self.evaluate(self.algo.eval_arrays())
            ending = Verdict.diverged(rnd, self.algo.eval_arrays(), results, failures, loss)
            if ending is not None:
                self.end(*ending)
            if self.extra_eval is not None:  # --attack backdoor: the attack's success
                metrics = {**metrics, **self.extra_eval(self.algo.eval_arrays())}
        last = rnd + span - 1
        late = step.stragglers  # (an ordered step's are in its results)
        metrics = {**metrics, "tasks": len(results) + len(failures) + late,  # (of the step)
                   **({"failures": len(failures)} if order is None else {}),  # (else its round's)
                   **step.row}
        if order is not None:
            metrics = {**metrics, "stragglers": order.stragglers, "moved": order.moved}
        metrics = {**metrics, **self.churn.row(rnd, span)}  # online, waits, skipped peers
        self.compute.settle()  # every task of the step counts in its last row
        row = self._log(last, acc, loss, metrics, self.sim_time, _seen(order, base))
        self.rounds_done = last + 1
        self.participants.commit()
        self.mark = (self.ledger.totals(), self.algo.state.next_task, self.sim_time)
        self.mutating = False
        return row

    def _points(self, order: Arrivals | None, base: dict[str, int]) -> None:
        """Evaluate and log the step's interim points: at its end, or as they come when the
        algorithm streams them (FedAsync, FedBuff)."""
        if order is not None and not self.staged.streams_points:
            return
        for t, arrays, sim, extra in self.staged.interim_points():
            acc_t, loss_t = self.evaluate(arrays)
            flag = {} if self.staged.streams_points else {"interim": True}  # (a row of its own)
            self._log(t, acc_t, loss_t, {**extra, **flag}, sim, _seen(order, base))

    def _log(self, rnd: int, acc: float, loss: float, metrics: dict[str, Any], sim: float,
             seen: dict[str, int] | None = None) -> dict[str, Any]:
        """Write one metrics row (bytes: the messages of that logical round, or `seen`, those an
        ordered step sent and released since its last row) and show it."""
        if seen is None:
            per, after = self.ledger.round_totals(rnd), self.ledger.totals()
            bytes_round = {k: per[k] for k in ("server_to_client", "client_to_server",
                                               "client_to_client", "tensor_bytes")}
            total = (after["server_to_client"] + after["client_to_server"]
                     + after["client_to_client"])
            self.logged = (rnd + 1, sim, after, self.ledger.messages)
        else:
            total = seen.pop("total")
            at, messages = seen.pop("at")
            bytes_round = seen
            self.logged = (rnd + 1, sim, at, messages)
        row: dict[str, Any] = {
            "round": rnd, "accuracy": acc, "loss": loss, **metrics, "wall_s": self.wall(),
            "sim_s": sim, "bytes_round": bytes_round, "bytes_total": total,
            **self.compute.row(rnd if seen is None else None),  # client compute so far
        }
        stages = self.ledger.stage_totals(rnd) if seen is None else {}
        if stages:  # a protocol's stages inside the round (secure aggregation): their bytes
            row["bytes_by_stage"] = stages
        if not math.isfinite(loss):
            log.warning("round %d: the model's loss is not finite", rnd)
        self.history.log_round(row)
        self.progress.update(row)
        return row

    def finished(self) -> tuple[int, float, dict[str, int], int]:
        """(rounds, simulated time, ledger totals, messages) of the last finished round: what an
        interrupted run's summary reports (not the tasks of the round it was in)."""
        return self.logged

    def summary(self, clients: Sequence[ClientInfo], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The summary.json dictionary (core/summary.py)."""
        return run_summary(self, clients, extra)


def _seen(order: Arrivals | None, base: dict[str, int]) -> dict[str, Any] | None:
    """An ordered step's row bytes (Arrivals.row_bytes) and, under "at", the ledger's totals and
    message count as of that row; None for a step whose rows read the ledger itself."""
    if order is None:
        return None
    at = order.totals({k: v for k, v in base.items() if k != "messages"}, base["messages"])
    return {**order.row_bytes(base), "at": at}


def _no_order(cfg: RunConfig) -> Callable[[], Arrivals]:
    """Replies in simulated-time order without lookahead (a driver built without its
    session's bounds): each task's earliest return is its start."""
    return lambda: Arrivals(lambda t: t.sim_time, lambda t: 0, float(cfg.latency.deadline))
