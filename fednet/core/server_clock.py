"""The server on the clock: the work of a round's aggregation counted in operations
(network/server_cost.py; secure aggregation's unmasking: fednet/secagg/cost.py; each result's
decoding under --compress: Result.server_ops, core/replies.py; its encoding of --compress-down
tasks before they leave: ServerClock.before) and turned into
simulated seconds at the server's rates (--server-profile). The round's end waits for it, so the
next round's tasks leave after the server has finished (core/rounds.py). Counted from the
round's parameters and what its results carried: the same seconds in every runtime."""
from __future__ import annotations

from typing import Any

from fednet import opcount
from fednet.algorithms import dp_spec, robust_spec
from fednet.algorithms.contract import NOT_STAGED, StagedStrategy
from fednet.config import RunConfig
from fednet.network.server_cost import aggregation_ops, server_rates
from fednet.types import Result, Task


class ServerClock:
    """The server's rates and the simulated seconds of its work, per round and in all."""

    def __init__(self, cfg: RunConfig, algo: Any) -> None:
        self.cfg, self.algo = cfg, algo
        self.staged = algo if isinstance(algo, StagedStrategy) else NOT_STAGED
        self.rates = server_rates(cfg.latency.server_profile)
        if "server_rates" in getattr(algo, "__dict__", {}):  # a staged protocol's own stages
            algo.server_rates = self.rates  # (secure aggregation)
        self.defense = cfg.defense.name
        self.params = robust_spec.defense_params(cfg) if self.defense != "none" else None
        self.share = robust_spec.assumed_share(cfg) if self.defense != "none" else 0.0
        self.work = robust_spec.defense_spec(self.defense).work if self.defense != "none" \
            else None  # (a plugin defense's own count of its work)
        self.central_dp = dp_spec.kind(cfg.dp.mode) == "central"  # (a plugin mechanism's too)
        self.values: int | None = None
        self.total = 0.0  # the server's simulated compute so far (rows' server_compute_s)

    def seconds(self, work: dict[str, float]) -> float:
        """Simulated seconds of `work` at the server's rates."""
        return opcount.seconds(work, self.rates)

    def round_work(self, results: list[Result]) -> dict[str, float]:
        """The work of aggregating a synchronous round's results: the protocol's own last
        stage (secure aggregation's unmasking), or the defense or mean over them; and the
        work of taking the results in (--compress's decoding, each result's server_ops)."""
        final = getattr(self.algo, "final_work", None)
        if callable(final):
            return opcount.add(dict(final()), received(results))
        n = len(results)
        f = robust_spec.byzantine_count(getattr(self.params, "f", 0), self.share, n) \
            if self.params is not None else 0
        return opcount.add(aggregation_ops(self.cfg, n, self._d(), f, self.params,
                                           self.central_dp, self.work), received(results))

    def before(self, tasks: list[Task], work: dict[str, float]) -> float:
        """The server's `work` on `tasks` before they leave (--compress-down's encoding, and
        the decoding it keeps as the tasks' arrays, counted as it did them: core/rounds.stamp):
        counted, and the tasks leave once it is done (an asynchronous server is busy until
        then: StagedStrategy.server_busy); its seconds."""
        s = self.did(work)
        for t in tasks if s > 0 else ():
            t.sim_time += s
        if s > 0 and tasks:  # (an asynchronous server's queue: its next work starts after it)
            self.staged.server_busy(max(t.sim_time for t in tasks))
        return s

    def did(self, work: dict[str, float]) -> float:
        """The server did `work` (counted: server_compute_s); its seconds, which the caller
        waits for (the setup stage's, e.g. FedSeq's grouping: core/rounds.setup)."""
        s = self.seconds(work) if work else 0.0
        self.total += s
        return s

    def charge(self, work: dict[str, float], metrics: dict[str, Any]) -> float:
        """Count `work` (and the seconds a protocol's earlier stages waited for the server: the
        row's secagg_server_sim_s but its unmask, which is `work`); the seconds the round's end
        waits for `work`."""
        s = self.seconds(work)
        staged = metrics.get("secagg_server_sim_s") or {}
        self.total += s + sum(v for k, v in staged.items() if k != "unmask")
        return s

    def _d(self) -> int:
        """The model's floating values (what a result carries to aggregate)."""
        if self.values is None:
            model = getattr(getattr(self.algo, "state", None), "model", None)
            if not isinstance(model, dict):
                model = self.algo.eval_arrays()
            self.values = sum(int(a.size) for a in model.values() if a.dtype.kind == "f")
        return self.values

    def resume(self, rows: list[dict[str, Any]]) -> None:
        """Go on from the last row a resumed run keeps."""
        self.total = float(rows[-1].get("server_compute_s", 0.0)) if rows else 0.0


def received(results: list[Result]) -> dict[str, float]:
    """The server's work taking the results in (core/replies.py: --compress's decoding,
    counted as it decoded each), summed in the results' order."""
    out: dict[str, float] = {}
    for r in results:
        opcount.add(out, r.server_ops)
    return out
