"""FedAvg. McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017. Spec: docs/algorithms.md §3.1. FedProx (§3.2) is FedAvg's
server with the proximal client rule; Per-FedAvg (§3.10) also uses this server."""
from __future__ import annotations

import logging
from typing import Any

from fednet.algorithms.aggregate import StreamingMean
from fednet.algorithms.common import finite, round_metrics
from fednet.algorithms.contract import ClientContext, ClientUpdate, Strategy
from fednet.algorithms.updates import Plain, Prox
from fednet.config import RunConfig
from fednet.models.arrays import state_arrays
from fednet.types import Arrays, Failure, Result, Task

log = logging.getLogger("fednet.server")


class FedAvg(Strategy):
    """The server averages the clients' models by sample count, streaming (folded on arrival)."""

    def __init__(self, cfg: RunConfig, params: Any) -> None:
        super().__init__(cfg, params)
        self._sums: dict[str, StreamingMean] = {}
        self._finite: dict[int, bool] = {}  # task id -> its result was finite (and folded in)

    # ---- streamed aggregation: each result is folded in on arrival, then its arrays dropped --
    def sum_of(self, part: str) -> StreamingMean:
        """The round's running sum named `part` (created on first use)."""
        return self._sums.setdefault(part, StreamingMean())

    def fold(self, r: Result) -> None:
        """Add one finite result to the round's sums: the model, weighted by samples."""
        self.sum_of("model").add(r.arrays, r.num_examples, key=r.cid)

    def absorb(self, done: Result | Failure) -> None:
        """Fold a result in and release its arrays; non-finite ones, and ones that do not fit
        the model (names, shapes, dtypes: logged), are only counted as dropped."""
        if isinstance(done, Result) and done.task_id not in self._finite:
            ok = finite(done.arrays)
            if ok:
                try:
                    self.fold(done)
                except ValueError as e:
                    log.warning("round %d: result of client %d dropped: %s", done.round, done.cid, e)
                    ok = False
            self._finite[done.task_id] = ok
            done.arrays = {}

    def take_round(self, results: list[Result]) -> tuple[list[Result], int, dict[str, StreamingMean]]:
        """Finish the round's sums (folding results the runtime did not stream); returns the
        usable results, how many were non-finite, and the sums."""
        for r in results:
            self.absorb(r)
        ok = sorted((r for r in results if self._finite.get(r.task_id)), key=lambda r: r.cid)
        sums, self._sums, self._finite = self._sums, {}, {}
        return ok, len(results) - len(ok), sums

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """theta = sum_k n_k theta_k / sum_k n_k over the usable results (any arrival order)."""
        ok, dropped, sums = self.take_round(results)
        if ok:
            self.state.model = sums["model"].result()
        return round_metrics(ok, failures, dropped)


class FedAvgClient(ClientUpdate):
    """E epochs of SGD from the received model; sends the whole model back."""

    # the received arrays may become the model's memory (the runtime's adopt_arrays): every
    # local rule here loads them first and keeps its own copies of what it needs (anchors)
    adopts_received = True

    def __init__(self, cfg: RunConfig, params: Any) -> None:
        super().__init__(cfg, params)
        self.local: Any = Plain()

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """The local rule from the received model; returns the whole model."""
        body = self.local.run(ctx, task)
        return state_arrays(ctx.model), body


class FedProxClient(FedAvgClient):
    """FedProx. Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.
    docs/algorithms.md §3.2: SGD with a proximal term toward the received model (mu)."""

    def __init__(self, cfg: RunConfig, params: Any) -> None:
        super().__init__(cfg, params)
        self.local = Prox(params.mu)
