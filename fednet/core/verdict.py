"""The run's verdict: its failures so far, and when the run has failed (--max-failed-rounds, no
usable round) or diverged. The round driver owns one (composition) and gives it its `end`
(RoundDriver.end), through which the verdict ends the run."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from fednet.algorithms.common import finite
from fednet.algorithms.layout import NON_FINITE
from fednet.core.status import RunStatus
from fednet.types import Arrays, Failure, Result

log = logging.getLogger("fednet.server")
Ending = tuple[RunStatus, str]
"""A status and the one line that says why (summary.json's `error`)."""


class Verdict:
    """The failures of a run (summary.json's list) and the status decisions made of them."""

    def __init__(self, max_failed_rounds: int, progress: Any,
                 end: Callable[[RunStatus, str], None]) -> None:
        self.max_failed = max_failed_rounds
        self.progress, self.end = progress, end
        self.failures: list[dict[str, Any]] = []
        self.log_hint = ""  # where the clients' tracebacks are (set by the runtime)
        self.failed_streak = self.usable_rounds = 0

    def note(self, rnd: int, failures: list[Failure]) -> None:
        """Record a round's failures (and show each distinct reason once), in task order: the
        order they reached the server in is real time under launch, and the record is the
        same under both runtimes."""
        for f in sorted(failures, key=lambda f: (f.task_id, f.cid)):
            self.failures.append({"round": rnd, "client": f.cid, "task": f.task_id,
                                  "reason": f.reason})
            self.progress.failure(rnd, f.cid, f.reason, self.log_hint)

    def count_usable(self, rnd: int, usable: int) -> None:
        """A round without a usable result counts towards --max-failed-rounds: the run has
        failed when it is reached."""
        if usable:
            self.usable_rounds += 1
            self.failed_streak = 0
            return
        self.failed_streak += 1
        k = self.max_failed
        if k and self.failed_streak >= k:
            self.end(*self.failed(f"{k} rounds in a row without a usable result "
                                  f"(through round {rnd})"))

    def check_finite(self, rnd: int, model: Arrays, results: list[Result],
                     failures: list[Failure], loss: float) -> None:
        """The run has diverged when the round's aggregate has (diverged)."""
        ending = self.diverged(rnd, model, results, failures, loss)
        if ending is not None:
            self.end(*ending)

    def failed(self, why: str) -> Ending:
        """Failed, with the first failure's reason and where its traceback is."""
        f = self.failures[0] if self.failures else {"client": "?", "reason": "no client answered"}
        where = f" ({self.log_hint})" if self.log_hint else ""
        error = f"{why}; the first failure: client {f['client']}: {f['reason']}{where}"
        log.error("the run failed: %s", error)
        return RunStatus.FAILED, error

    @staticmethod
    def diverged(rnd: int, model: Arrays, results: list[Result], failures: list[Failure],
                 loss: float) -> Ending | None:
        """Diverged when the run's own aggregate is: the global model has NaN/inf, or its loss
        is not finite (weights so large that the logits overflow), or no result of the round
        was usable and the results of two clients or more were NaN/inf (every client diverged:
        each such result is its client's failure, core/replies.py, so one client's never ends
        the run). The error names which."""
        bad = {f.cid for f in failures if NON_FINITE in f.reason}
        all_bad = not results and len(bad) >= 2
        what = (f"the results of all {len(bad)} clients that answered have NaN/inf parameters"
                if all_bad else
                "the global model has NaN/inf parameters" if not finite(model)
                else "the global model's test loss is not finite" if not math.isfinite(loss)
                else "")
        if not what:
            return None
        error = (f"round {rnd}: {what}; the run diverged and stops here (try a smaller --lr; "
                 "for FedDyn --param clip=30 or a smaller alpha)")
        log.error("%s", error)
        return RunStatus.DIVERGED, error
