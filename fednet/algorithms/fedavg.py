"""FedAvg. McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017. Spec: docs/algorithms.md §3.1. FedProx (§3.2) is FedAvg's
server with the proximal client rule; Per-FedAvg (§3.10) also uses this server.

The FedAvg family's round: the results folded into the round's sums (`sum_of`: a piece's own,
e.g. --dp central's noised mean, else the defense's RobustMean, else the exact mean), the
server rule's `step` on the model's mean (FedAvg: the mean is the model; FedOpt: an optimizer
step), then the pieces' row (Strategy.closed). Differential privacy is such a piece
(`self.privacy`, algorithms/private.Privacy), held, not mixed in."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fednet.algorithms import robust_spec
from fednet.algorithms.aggregate import StreamingMean
from fednet.algorithms.common import round_metrics
from fednet.algorithms.contract import ClientContext, ClientUpdate, ServerState, Strategy
from fednet.algorithms.layout import non_finite, proven_finite
from fednet.algorithms.robust import RobustMean
from fednet.algorithms.catalog import ProxParams
from fednet.algorithms.updates import Dyn, Plain, Prox
from fednet.config import RunConfig
from fednet.models.arrays import state_arrays
from fednet.types import Arrays, Failure, Result, Task

log = logging.getLogger("fednet.server")


class Spends(Protocol):
    """What FedAvg reads of the privacy piece it holds (algorithms/private.Privacy, which
    imports this module: no import back)."""

    def epsilon(self) -> float:
        """Epsilon spent so far, at the run's delta."""
        ...


@dataclass
class CenteredState(ServerState):
    """FedAvg's state under --defense centered_clip: the last aggregate update (flattened),
    where the next round's clipping starts."""

    center: np.ndarray | None = None


class FedAvg(Strategy):
    """The server averages the clients' models by sample count, streaming (folded on arrival);
    with --defense, the round's models are kept and aggregated robustly (robust.RobustMean)."""

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, params)
        self._sums: dict[str, Any] = {}
        self._finite: dict[int, bool] = {}  # task id -> its result was finite (and folded in)
        self.privacy: Spends | None = None  # --dp: the server's part (a piece: Privacy.attach)
        self.defense = "" if cfg.defense.name == "none" else cfg.defense.name
        if self.defense:
            self._dp = robust_spec.defense_params(cfg)
            self._bad = frozenset(robust_spec.malicious_ids(cfg))  # (reported, never used)
            self._share = robust_spec.assumed_share(cfg)  # what f = -1 assumes

    def init_state(self, init: Arrays) -> Any:
        """The model, and the clipping center under a defense that keeps one (centered_clip)."""
        if self.defense and robust_spec.defense_spec(self.defense).keeps_center:
            return CenteredState(model=dict(init))
        return super().init_state(init)

    # ---- streamed aggregation: each result is folded in on arrival, then its arrays dropped --
    def sum_of(self, part: str) -> Any:
        """The round's running sum named `part` (created on first use): the first piece's that
        makes one (ServerPiece.sum_of: --dp central's PrivateMean), else under --defense the
        model's is the defense's RobustMean."""
        if part not in self._sums:
            for piece in self.pieces:
                made = piece.sum_of(part)
                if made is not None:
                    self._sums[part] = made
                    break
        if part == "model" and self.defense and part not in self._sums:
            self._sums[part] = RobustMean(self.defense, self._dp, self._share, self.state.model,
                                          getattr(self.state, "center", None), self._bad)
        return self._sums.setdefault(part, StreamingMean())

    def robust_close(self, mean: Any, metrics: dict[str, Any]) -> bool:
        """Under --defense: the defense's row metrics, its center kept (centered clipping);
        False when it refused the round (the model stays). True without a defense. metrics:
        the round's row, numbers and a refusal's text (round_failed, core/verdict reads it)."""
        if not isinstance(mean, RobustMean):
            return True
        refused = mean.refused
        metrics.update(mean.outcome.metrics if mean.outcome else {})
        if refused and mean.outcome is not None:  # a round without a usable result, named
            metrics.update(results=0, round_failed=mean.outcome.why)
        if not refused and hasattr(self.state, "center"):
            self.state.center = mean.update()
        return not refused

    def fold(self, r: Result) -> None:
        """Add one finite result to the round's sums: the model, weighted by samples."""
        self.sum_of("model").add(r.arrays, r.num_examples, key=r.cid)

    def absorb(self, done: Result | Failure) -> None:
        """Fold a result in and release its arrays; non-finite ones, and ones that do not fit
        the model (names, shapes, dtypes: logged), are only counted as dropped."""
        if isinstance(done, Result) and done.task_id not in self._finite:
            ok = (proven_finite(done.vetted, done.arrays)  # (found finite on arrival)
                  or non_finite(done.arrays) is None)  # (common.finite's answer, in one pass)
            if ok:
                try:
                    self.fold(done)
                except ValueError as e:
                    log.warning("round %d: result of client %d dropped: %s", done.round + 1, done.cid,
                                e)
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
        """The round's sums finished; the server rule's step on the model's (unless no result
        was usable or the defense refused the round); the pieces' row."""
        ok, dropped, sums = self.take_round(results)
        metrics = round_metrics(ok, failures, dropped)
        if ok and self.robust_close(sums["model"], metrics):
            self.step(sums["model"], metrics)
        return self.closed(rnd, results, failures, metrics)

    def step(self, mean: Any, metrics: dict[str, Any]) -> None:
        """The server rule on the round's model mean (a StreamingMean, RobustMean or a piece's:
        its result() and mean64()), adding to the row `metrics`: FedAvg takes the mean,
        theta = sum_k n_k theta_k / sum_k n_k over the usable results (any arrival order)."""
        self.state.model = mean.result()

    def epsilon(self) -> float:
        """The privacy spent so far (--dp: the accountant's epsilon at the run's delta), 0.0
        without differential privacy."""
        return self.privacy.epsilon() if self.privacy is not None else 0.0

    def resume_problem(self, st: Any, rounds_done: int, participants: Any,
                       last_row: dict[str, Any] | None) -> tuple[str, str] | None:
        """Why a checkpointed state cannot go on ('json' or 'npz', one line), or None: the
        pieces' checks (ServerPiece.resume_problem: differential privacy's accounting); an
        override asks super() first."""
        for piece in self.pieces:
            why = piece.resume_problem(st, rounds_done, participants, last_row)
            if why:
                return why
        return None


class FedAvgClient(ClientUpdate):
    """E epochs of SGD from the received model; sends the whole model back."""

    # the received arrays may become the model's memory (the runtime's adopt_arrays): every
    # local rule here loads them first and keeps its own copies of what it needs (anchors)
    adopts_received = True

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, params)
        self.local: Plain | Prox | Dyn = Plain()

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """The local rule from the received model; returns the whole model."""
        body = self.local.run(ctx, task)
        return state_arrays(ctx.model), body


class FedProxClient(FedAvgClient):
    """FedProx. Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.
    docs/algorithms.md §3.2: SGD with a proximal term toward the received model (mu)."""

    def __init__(self, cfg: RunConfig, params: ProxParams) -> None:
        super().__init__(cfg, params)
        self.local = Prox(params.mu)
