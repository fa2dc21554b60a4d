"""Round deadlines (--deadline S) and over-selection (--over-select F): which results count.

A step starts at simulated time T0 in logical round r0 (a step is one round, or a FedSeqInter
period of P rounds). A result of logical round r is on time when it arrives by
T0 + (r - r0 + 1) * S; later ones are stragglers. With over-selection the round keeps the first
`target` results to arrive on time (ties: client id, then task id) and the rest are stragglers.
The round closes when its target is reached, else at its deadline when a result was late, else
at its last arrival.
"""
from __future__ import annotations

from dataclasses import dataclass

from fednet.types import Result

INF = float("inf")


@dataclass
class Cutoff:
    """One step's deadline (0: none) and target (None: keep every result on time)."""

    start: float
    first: int
    deadline: float = 0.0
    target: int | None = None

    def due(self, rnd: int) -> float:
        """When round rnd's results must have arrived (inf without a deadline)."""
        return self.start + (rnd - self.first + 1) * self.deadline if self.deadline else INF

    def late(self, r: Result) -> bool:
        """The result arrived after its round's deadline."""
        return r.sim_time > self.due(r.round)

    def close(self, results: list[Result]) -> tuple[list[Result], list[Result], float]:
        """(kept, stragglers, the simulated time the step closes; -inf with no results)."""
        order = sorted(results, key=lambda r: (r.sim_time, r.cid, r.task_id))
        on_time = [r for r in order if not self.late(r)]
        late = [r for r in order if self.late(r)]
        if self.target is not None and len(on_time) >= self.target:
            kept = on_time[:self.target]
            return kept, on_time[self.target:] + late, kept[-1].sim_time if kept else -INF
        end = max([r.sim_time for r in on_time] + [self.due(r.round) for r in late],
                  default=-INF)
        return on_time, late, end
