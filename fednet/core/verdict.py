"""The run's verdict: when a run has failed (--max-failed-rounds, no usable round) or diverged."""
from __future__ import annotations

import logging
import math
from typing import Any

from fednet.algorithms.common import finite
from fednet.algorithms.layout import NON_FINITE
from fednet.types import Failure, Result

log = logging.getLogger("fednet.server")


class Verdict:
    """The round driver's status decisions (core/rounds.RoundDriver mixes this in)."""

    cfg: Any
    algo: Any
    failures: list[dict[str, Any]]
    log_hint: str
    status: str
    error: str
    failed_streak: int
    usable_rounds: int
    progress: Any

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

    def _check_diverged(self, rnd: int, results: list[Result], failures: list[Failure],
                        loss: float) -> None:
        """Stop as `diverged` when the run's own aggregate is: the global model has NaN/inf, or
        its loss is not finite (weights so large that the logits overflow), or no result of the
        round was usable and the results of two clients or more were NaN/inf (every client
        diverged: each such result is its client's failure, core/replies.py, so one client's
        never ends the run). The error names which."""
        bad = {f.cid for f in failures if NON_FINITE in f.reason}
        all_bad = not results and len(bad) >= 2
        what = (f"the results of all {len(bad)} clients that answered have NaN/inf parameters"
                if all_bad else
                "the global model has NaN/inf parameters" if not finite(self.algo.eval_arrays())
                else "the global model's test loss is not finite" if not math.isfinite(loss)
                else "")
        if what:
            self.status = "diverged"
            self.error = (f"round {rnd}: {what}; the run diverged and stops here (try a smaller "
                          "--lr; for FedDyn --param clip=30 or a smaller alpha)")
            log.error("%s", self.error)

    def _note_failures(self, rnd: int, failures: list[Failure]) -> None:
        for f in failures:
            self.failures.append({"round": rnd, "client": f.cid, "task": f.task_id, "reason": f.reason})
            self.progress.failure(rnd, f.cid, f.reason, self.log_hint)
