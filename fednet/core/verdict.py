"""The run's verdict: its failures so far, and when the run has failed (--max-failed-rounds, no
usable round) or diverged. The round driver owns one (composition) and gives it its `end`
(RoundDriver.end), through which the verdict ends the run."""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

from fednet.algorithms.common import finite
from fednet.algorithms.layout import NON_FINITE
from fednet.core.status import RunStatus
from fednet.metrics.progress import Progress
from fednet.types import Arrays, Failure, Result

log = logging.getLogger("fednet.server")
DIVERGED_LOCALLY = "its local training diverged"
"""Part of the reason of every result refused for a NaN/inf loss it reports (core/replies.py);
with layout.NON_FINITE (NaN/inf values), what non_finite() reads."""
Ending = tuple[RunStatus, str]
"""A status and the one line that says why (summary.json's `error`)."""


class Verdict:
    """The failures of a run (summary.json's list) and the status decisions made of them."""

    def __init__(self, max_failed_rounds: int, progress: Progress,
                 end: Callable[[RunStatus, str], None],
                 cause: Callable[[Arrays], str] = lambda model: "") -> None:
        self.max_failed = max_failed_rounds
        self.cause = cause  # why a model may go NaN/inf (DP's noise: core/replies.dp_cause)
        self.progress, self.end = progress, end
        self.failures: list[dict[str, Any]] = []
        self.log_hint = ""  # where the clients' tracebacks are (set by the runtime)
        self.failed_streak = self.usable_rounds = 0
        self.unusable: list[tuple[int, str]] = []  # (round, why) of the steps without a result

    def note(self, rnd: int, failures: list[Failure]) -> None:
        """Record a round's failures (and show each distinct reason once), in task order: the
        order they reached the server in is real time under launch, and the record is the
        same under both runtimes."""
        for f in sorted(failures, key=lambda f: (f.task_id, f.cid)):
            self.failures.append({"round": rnd, "client": f.cid, "task": f.task_id,
                                  "reason": f.reason})
            self.progress.failure(rnd, f.cid, f.reason, self.hint_for(f.reason))

    def count_usable(self, rnd: int, metrics: dict[str, Any], results: int, failures: int
                     ) -> None:
        """A round without a usable result (what the algorithm says it aggregated: `results` in
        its metrics, else every result that came) is said on the console with its cause, and
        counts towards --max-failed-rounds: the run has failed when it is reached."""
        if int(metrics.get("results", results)):
            self.usable_rounds += 1
            self.failed_streak = 0
            return
        why = unusable_why(metrics, results, failures)
        self.unusable.append((rnd, why))
        self.progress.message(f"round {rnd + 1}: no usable result: {why}")
        self.failed_streak += 1
        k = self.max_failed
        if k and self.failed_streak >= k:
            first = rnd + 2 - k
            span = f"round {first}" if k == 1 else f"rounds {first}-{rnd + 1}"
            self.end(*self.failed(f"{k} round{'s' if k > 1 else ''} in a row without a usable "
                                  f"result ({span}; the last: {why})"))

    def mostly_failed(self) -> Ending | None:
        """At the run's end: failed when most of its steps had no usable result (a run whose
        rounds mostly failed is no result, whatever --max-failed-rounds allowed in a row)."""
        bad, total = len(self.unusable), len(self.unusable) + self.usable_rounds
        if bad == 0 or (bad * 2 <= total and self.usable_rounds > 0):
            return None
        rnd, why = self.unusable[-1]
        what = ("no round of the run had a usable result" if self.usable_rounds == 0 else
                f"{bad} of {total} rounds had no usable result")
        return self.failed(f"{what} (the last, round {rnd + 1}: {why})")

    def hint_for(self, reason: str) -> str:
        """Where a failure's traceback is: the runtime's hint for a failure that an exception
        raised on the client, none for one without a traceback (offline, a dropout, a
        straggler, a refused result)."""
        return self.log_hint if raised(reason) else ""

    def check_finite(self, rnd: int, model: Arrays, results: list[Result],
                     failures: list[Failure], loss: float) -> None:
        """The run has diverged when the round's aggregate has (diverged)."""
        ending = self.diverged(rnd, model, results, failures, loss, self.cause)
        if ending is not None:
            self.end(*ending)

    def failed(self, why: str) -> Ending:
        """Failed, with the first failure's reason and where its traceback is."""
        if not self.failures:  # (the round's own cause says it all: SecAgg, a defense)
            log.error("the run failed: %s", why)
            return RunStatus.FAILED, why
        f = self.failures[0]
        hint = self.hint_for(str(f["reason"]))
        where = f" ({hint})" if hint else ""
        error = f"{why}; the first failure: client {f['client']}: {f['reason']}{where}"
        log.error("the run failed: %s", error)
        return RunStatus.FAILED, error

    def check_clients(self, rnd: int, results: list[Result], failures: list[Failure]) -> None:
        """Clients that evaluate their own models (personalized runs): the run has failed when
        the model of a client diverged this round (its result refused for a NaN/inf loss or
        NaN/inf values: core/replies.py). The round's mean client accuracy would be over the
        others only, which flatters the run, and a personal model does not recover."""
        ending = self.clients_diverged(rnd, results, failures)
        if ending is not None:
            self.end(*ending)

    @staticmethod
    def clients_diverged(rnd: int, results: list[Result], failures: list[Failure]
                         ) -> Ending | None:
        """Failed, naming the clients and the first one's cause, when a client's own model
        diverged in round `rnd` (see check_clients); None otherwise."""
        bad = sorted((f for f in failures if non_finite(f.reason)), key=lambda f: f.cid)
        if not bad:
            return None
        ids = ", ".join(str(f.cid) for f in bad[:8]) + (", ..." if len(bad) > 8 else "")
        evaluated = len(results) + len(bad)
        error = (f"round {rnd + 1}: the own model of {len(bad)} of the {evaluated} clients "
                 f"evaluated diverged (client{'s' if len(bad) > 1 else ''} {ids}); the mean "
                 f"client accuracy of the others would flatter the run, so it stops here "
                 f"(client {bad[0].cid}: {bad[0].reason})")
        log.error("the run failed: %s", error)
        return RunStatus.FAILED, error

    @staticmethod
    def diverged(rnd: int, model: Arrays, results: list[Result], failures: list[Failure],
                 loss: float, cause: Callable[[Arrays], str] = lambda model: ""
                 ) -> Ending | None:
        """Diverged when the run's own aggregate is: the global model has NaN/inf, or its loss
        is not finite (weights so large that the logits overflow), or no result of the round
        was usable and the results of two clients or more were NaN/inf (every client diverged:
        each such result is its client's failure, core/replies.py, so one client's never ends
        the run). The error names which, and what to try: under differential privacy whose
        noise made the results NaN/inf (their reasons name it: privacy/plan.noise_cause), or
        whose noise on the server's model is large enough to (`cause`), the noise; otherwise a
        smaller --lr."""
        from fednet.privacy.plan import DP_CAUSE

        bad = {f.cid for f in failures if non_finite(f.reason)}
        all_bad = not results and len(bad) >= 2
        what = (f"the results of all {len(bad)} clients that answered have NaN/inf parameters "
                "or losses"
                if all_bad else
                "the global model has NaN/inf parameters" if not finite(model)
                else "the global model's test loss is not finite" if not math.isfinite(loss)
                else "")
        if not what:
            return None
        noise = next((f.reason[f.reason.index(DP_CAUSE):] for f in failures
                      if DP_CAUSE in f.reason), "") or cause(model)
        hint = noise or "try a smaller --lr; for FedDyn --param clip=30 or a smaller alpha"
        error = f"round {rnd + 1}: {what}; the run diverged and stops here ({hint})"
        log.error("%s", error)
        return RunStatus.DIVERGED, error


def non_finite(reason: str) -> bool:
    """True when a failure's reason is a result refused for NaN/inf: in its values
    (layout.NON_FINITE) or in the loss its client reported (DIVERGED_LOCALLY)."""
    return NON_FINITE in reason or DIVERGED_LOCALLY in reason


_EXCEPTION_NAME = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failed|Failure|Interrupt|Exit|"
                             r"Warning|Iteration)$")


def raised(reason: str) -> bool:
    """True when a failure's reason is an exception's ("ValueError: ..."), as the client's
    executor writes it: there is a traceback in the client's log."""
    name, colon, _ = reason.partition(":")
    return bool(colon) and bool(_EXCEPTION_NAME.match(name.strip()))


def unusable_why(metrics: dict[str, Any], results: int, failures: int) -> str:
    """Why a round had no usable result: the algorithm's own reason (round_failed: secure
    aggregation's stage, a defense's refusal), else what became of its tasks."""
    why = metrics.get("round_failed")
    if why:
        return str(why)
    bad = int(metrics.get("non_finite", 0) or 0)
    if bad:
        return f"{bad} of {results} results had NaN/inf values" + (
            f", {failures} tasks failed" if failures else "")
    if failures:
        return f"all {failures} tasks failed" if not results else (
            f"{failures} tasks failed and the algorithm took none of the {results} results")
    return "no client answered" if not results else f"the algorithm took none of the {results} results"
