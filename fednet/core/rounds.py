"""The round driver: runtime-agnostic loop over a Dispatcher (in-process or ZeroMQ)."""
from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import Any, Protocol

from fednet.algorithms.common import client_accuracy, finite
from fednet.algorithms.contract import Strategy
from fednet.config import RunConfig
from fednet.metrics.accounting import Ledger
from fednet.metrics.history import History
from fednet.metrics.progress import Progress
from fednet.network.churn import Churn
from fednet.network.rounds import Network
from fednet.types import ClientInfo, Failure, Result, Task

log = logging.getLogger("fednet.server")


FollowUp = Callable[[Result | Failure], list[Task]]
SHOWN_REASONS = 10  # distinct failure reasons printed on the terminal, at most


class Dispatcher(Protocol):
    """Delivers a round's tasks to clients and collects what comes back."""

    def alive_clients(self) -> list[ClientInfo]: ...

    def run_round(self, rnd: int, tasks: list[Task], follow: FollowUp | None = None
                  ) -> tuple[list[Result], list[Failure]]: ...


class RoundDriver:
    """Runs cfg.rounds rounds of `algo` over a dispatcher, logging as it goes."""

    def __init__(self, cfg: RunConfig, algo: Strategy, evaluate: Callable[[Any], tuple[float, float]],
                 ledger: Ledger, history: History, progress: Progress | None = None) -> None:
        self.cfg, self.algo, self.evaluate = cfg, algo, evaluate
        self.ledger, self.history = ledger, history
        self.progress = progress or Progress(cfg.rounds, quiet=True)
        self.sim_time = 0.0
        self.rounds_done = 0
        self.failures: list[dict[str, Any]] = []
        self.status = "running"
        self.setup_stats: dict[str, Any] = {}
        self.checkpoint: Callable[[], None] | None = None  # set by the session with --checkpoint-every
        self.ckpt_round = 0  # rounds done at the last checkpoint (tasks carry it: client state)
        self.client_state = False  # the algorithm's clients keep state between rounds
        self.churn: Churn | None = None  # --availability (network/churn.py)
        self.t0 = time.monotonic()
        self.t_end: float | None = None
        self.network: Network | None = None  # --server-bandwidth, --deadline, --over-select
        self.error = ""  # why a failed run failed (its first failure's reason)
        self.log_hint = ""  # where the clients' tracebacks are (set by the runtime)
        self.failed_streak = self.usable_rounds = 0
        self.reasons: set[str] = set()  # failure reasons shown on the terminal (_show_reason)

    def wall(self) -> float:
        """Seconds of training: from the first round's start to the last round's end (or now)."""
        return (self.t_end or time.monotonic()) - self.t0

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
        step = max(1, self.algo.rounds_per_step())
        for rnd in range(self.rounds_done, self.cfg.rounds, step):
            clients = dispatcher.alive_clients()
            if not clients:
                self.status = "no_clients"
                log.error("round %d: no client is alive; stopping the run", rnd)
                return
            if self.churn is not None:  # among the clients online (waits until one is)
                clients, self.sim_time = self.churn.select(clients, self.sim_time)
                if not clients:
                    self.status = "no_clients_online"
                    log.error("round %d: no client is online now or later (--availability); "
                              "stopping the run", rnd)
                    return
            self.round(rnd, clients, dispatcher, min(step, self.cfg.rounds - rnd))
            every = self.cfg.net.checkpoint_every
            if self.checkpoint is not None and every and (
                    self.rounds_done // every > rnd // every or self.rounds_done == self.cfg.rounds):
                self.checkpoint()
                self.ckpt_round = self.rounds_done
            if self.status in ("diverged", "failed"):
                return
        if self.usable_rounds == 0 and self.rounds_done > 0 and self.failures:
            self._fail("no round of the run had a usable result")
        else:
            self.status = "completed"

    def _count_usable(self, rnd: int, results: list[Result]) -> None:
        """A round without one result counts towards --max-failed-rounds."""
        if results:
            self.usable_rounds += 1
            self.failed_streak = 0
            return
        self.failed_streak += 1
        k = self.cfg.net.max_failed_rounds
        if k and self.failed_streak >= k:
            self._fail(f"{k} rounds in a row without a usable result (through round {rnd})")

    def _fail(self, why: str) -> None:
        """Status failed, with the first failure's reason and where its traceback is."""
        f = self.failures[0] if self.failures else {"client": "?", "reason": "no client answered"}
        where = f" ({self.log_hint})" if self.log_hint else ""
        self.status = "failed"
        self.error = f"{why}; the first failure: client {f['client']}: {f['reason']}{where}"
        log.error("the run failed: %s", self.error)

    def setup(self, dispatcher: Dispatcher) -> bool:
        """Round -1: tasks the algorithm needs before training (e.g. FedSeq's pre-training)."""
        clients = dispatcher.alive_clients()
        if self.churn is not None:
            clients, self.sim_time = self.churn.select(clients, self.sim_time)
        tasks = self.stamp(self.algo.setup_tasks(clients))
        if not tasks:
            return True
        self.progress.message(f"setup stage: {len(tasks)} tasks")
        step = self.network and self.network.step(self.sim_time, -1, tasks, 1, None, setup=True)
        results, failures = dispatcher.run_round(-1, step.send(tasks) if step else tasks,
                                                 self.progress.counter(len(tasks), "setup stage"))
        results = step.close(results, None) if step else results
        self._note_failures(-1, failures)
        self.sim_time = max([self.sim_time] + [r.sim_time for r in results])
        t0 = time.perf_counter()
        self.setup_stats = self.algo.setup_results(results, failures)
        took = self.setup_stats["server_s"] = time.perf_counter() - t0  # e.g. FedSeq's grouping
        groups = self.setup_stats.get("superclients")
        self.progress.message(f"setup stage done: {groups} superclients, grouped in {took:.2f}s"
                              if groups is not None else f"setup stage done ({took:.2f}s)")
        self.setup_stats["sim_s"] = self.sim_time
        self.setup_stats["bytes"] = self.ledger.round_totals(-1)
        return True

    def resume(self, state: dict[str, Any]) -> None:
        """Continue after the checkpointed round (state from checkpoint.load)."""
        self.rounds_done = self.ckpt_round = int(state["rounds_done"])
        self.sim_time = float(state["sim_time"])
        self.failures = list(state.get("failures", []))
        self.setup_stats = dict(state.get("setup", {}))
        self.ledger.add_totals(-2, {k: int(v) for k, v in state["ledger"].items()})

    def stamp(self, tasks: list[Task]) -> list[Task]:
        """With --checkpoint-every and clients that keep state, every task says the rounds done
        at the last checkpoint (`ckpt`): the clients keep their state files by it
        (core/state_files.py)."""
        if self.cfg.net.checkpoint_every and self.client_state:
            for t in tasks:
                t.body = {**t.body, "ckpt": self.ckpt_round}
        return tasks

    def _note_failures(self, rnd: int, failures: list[Failure]) -> None:
        for f in failures:
            self.failures.append({"round": rnd, "client": f.cid, "task": f.task_id, "reason": f.reason})
            self._show_reason(rnd, f)

    def _show_reason(self, rnd: int, f: Failure) -> None:
        """Print each distinct failure reason once (its first line; numbers do not make a reason
        distinct), the first SHOWN_REASONS of them; summary.json has every failure."""
        line = (f.reason.strip().splitlines() or ["unknown"])[0][:300]
        key = re.sub(r"\d+", "#", line)
        if key in self.reasons or len(self.reasons) > SHOWN_REASONS:
            return
        self.reasons.add(key)
        if len(self.reasons) > SHOWN_REASONS:
            self.progress.message(f"more distinct failure reasons: see {self.log_hint or 'the log'}"
                                  " and summary.json")
            return
        where = f" ({self.log_hint})" if self.log_hint else ""
        self.progress.message(f"round {rnd}: client {f.cid} failed: {line}{where}")

    def round(self, rnd: int, clients: list[ClientInfo], dispatcher: Dispatcher, span: int = 1
              ) -> dict[str, Any]:
        """One step (span logical rounds): configure, dispatch, aggregate, evaluate, log."""
        tasks = self.stamp(self.algo.configure_round(rnd, clients))
        for t in tasks:
            t.sim_time = self.sim_time
        algo = self.algo
        step = self.network and self.network.step(self.sim_time, rnd, tasks, span, algo.target)

        def on_reply(done: Result | Failure) -> list[Task]:
            seen = step.reply(done) if step else done  # None: held or a straggler
            if seen is None:
                return []
            algo.absorb(seen)  # streaming algorithms fold the result in and free its arrays
            nxt = self.stamp(algo.follow_up(seen)) if span > 1 else []
            nxt = self.churn.trim(nxt) if self.churn is not None else nxt  # offline first hops
            return step.send(nxt) if step else nxt

        results, failures = dispatcher.run_round(rnd, step.send(tasks) if step else tasks,
                                                 on_reply)
        results = step.close(results, algo.absorb) if step else results
        metrics = self.algo.aggregate_round(rnd, results, failures)
        self.sim_time = max([self.sim_time, step.end if step else 0.0]
                            + [r.sim_time for r in results])
        self._note_failures(rnd, failures)
        self._count_usable(rnd, results)
        for t, arrays, sim, extra in self.algo.interim_points():  # e.g. FedSeqInter's bank
            acc_t, loss_t = self.evaluate(arrays)
            self._log(t, acc_t, loss_t, {**extra, "interim": True}, sim)
        if self.algo.eval_clients:  # personalized: clients evaluated their own models
            acc, loss, spread = client_accuracy(results)
            metrics = {**metrics, **spread}
        else:
            acc, loss = self.evaluate(self.algo.eval_arrays())
            self._check_diverged(rnd, metrics, loss)
        last = rnd + span - 1
        late = step.stragglers if step else 0
        metrics = {**metrics, "tasks": len(results) + len(failures) + late,
                   "failures": len(failures), **(step.row if step else {})}
        if self.churn is not None:  # online clients, waits, skipped peers (--availability)
            metrics = {**metrics, **self.churn.row(rnd, span)}
        row = self._log(last, acc, loss, metrics, self.sim_time)
        self.rounds_done = last + 1
        return row

    def _check_diverged(self, rnd: int, metrics: dict[str, Any], loss: float) -> None:
        """Stop as `diverged` when every result was NaN/inf, the global model is, or its loss
        is (weights so large that the logits overflow): the error names which."""
        all_bad = bool(metrics.get("non_finite")) and not metrics.get("results")
        what = ("every client's result has NaN/inf parameters" if all_bad else
                "the global model has NaN/inf parameters" if not finite(self.algo.eval_arrays())
                else "the global model's test loss is not finite" if not math.isfinite(loss)
                else "")
        if what:
            self.status = "diverged"
            self.error = (f"round {rnd}: {what}; the run diverged and stops here (try a smaller "
                          "--lr; for FedDyn --param clip=30 or a smaller alpha)")
            log.error("%s", self.error)

    def _log(self, rnd: int, acc: float, loss: float, metrics: dict[str, Any], sim: float
             ) -> dict[str, Any]:
        """Write one metrics row (bytes: the messages of that logical round) and show it."""
        per = self.ledger.round_totals(rnd)
        after = self.ledger.totals()
        row: dict[str, Any] = {
            "round": rnd, "accuracy": acc, "loss": loss, **metrics, "wall_s": self.wall(),
            "sim_s": sim,
            "bytes_round": {k: per[k] for k in ("server_to_client", "client_to_server",
                                                "client_to_client", "tensor_bytes")},
            "bytes_total": after["server_to_client"] + after["client_to_server"]
            + after["client_to_client"],
        }
        if not math.isfinite(loss):
            log.warning("round %d: the model's loss is not finite", rnd)
        self.history.log_round(row)
        self.progress.update(row)
        return row

    def summary(self, clients: list[ClientInfo], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The summary.json dictionary (names other tools rely on)."""
        rows = self.history.rows
        tot = self.ledger.totals()
        acc = [r["accuracy"] for r in rows]
        out: dict[str, Any] = {
            "algorithm": self.cfg.algo.name, "status": self.status, "clients": self.cfg.clients,
            "rounds": self.rounds_done, "rounds_planned": self.cfg.rounds,
            "final_accuracy": acc[-1] if acc else None, "best_accuracy": max(acc) if acc else None,
            "final_loss": rows[-1]["loss"] if rows else None,
            "wall_clock_s": self.wall(), "sim_time_s": self.sim_time,
            "bytes": {k: tot[k] for k in ("server_to_client", "client_to_server", "client_to_client",
                                          "tensor_bytes", "header_bytes", "control", "rejected")},
            "rejected_messages": tot["rejected_messages"],
            "rejects_sent": {"messages": tot["rejects_sent_messages"],
                             "bytes": tot["rejects_sent"]},
            "messages": self.ledger.messages,
            "devices": {str(c.cid): c.device for c in sorted(clients, key=lambda c: c.cid)},
            "failures": self.failures, "seed": self.cfg.seed,
        }
        if self.error:
            out["error"] = self.error
        if self.setup_stats:
            out["setup"] = self.setup_stats
        if self.churn is not None:
            out["availability"] = self.churn.summary(self.failures)
        if self.network is not None:
            out.update(self.network.summary())
        if self.cfg.tuned:  # the defaults the algorithm's tuning chose (registry Spec.tuned)
            out["tuned"] = list(self.cfg.tuned)
        out.update(extra or {})
        return out
