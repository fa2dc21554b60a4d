"""FedSeqInter (docs/algorithms.md §4.8, the `dev` semantics of §7.12): a bank of M models travels
between superclients and is averaged only every P rounds (default P = N_S).

It is asynchronous: each bank slot is its own pipeline. When a slot's superclient returns its
model, the slot's next superclient starts at once (Strategy.follow_up), whatever the other slots
are doing; the only barrier is the aggregation at the end of each period. The superclients of
every (round, slot) are drawn up front from seeded streams, so the result does not depend on
which slot finishes first, and period 1 reproduces FedSeq exactly.
"""
from __future__ import annotations

from collections.abc import Sequence

from fednet.algorithms.aggregate import weighted_mean
from fednet.algorithms.common import finite, round_metrics
from fednet.algorithms.fedseq import FedSeq
from fednet.config import RunConfig
from fednet.types import Arrays, ClientInfo, Failure, Result, Task


class FedSeqInter(FedSeq):
    """Bank slots continue from their own model; weighted merge every `period` rounds.

    The bank, the schedule and the slots live only within one step (a period): the driver
    checkpoints between steps, where the server state is FedSeq's."""

    def __init__(self, cfg: RunConfig, params: object) -> None:
        super().__init__(cfg, params)
        self.bank: list[Arrays] = []
        self.weights: list[float] = []
        self.schedule: list[list[int]] = []
        self.task_slot: dict[int, tuple[int, int]] = {}  # task id -> (slot, round)
        self.alive: set[int] = set()
        self.start = 0
        self.stats_round: dict[str, float] = {}

    def rounds_per_step(self) -> int:
        """The aggregation period P (N_S by default)."""
        return self.p.period or max(len(self.state.superclients), 1)

    def configure_round(self, rnd: int, clients: Sequence[ClientInfo]) -> list[Task]:
        """Start of a period: fresh copies of the server model in every slot, first chains."""
        self.alive = {c.cid for c in clients}
        self.start = rnd
        end = min(rnd + self.rounds_per_step(), self.cfg.rounds)
        self.schedule = [self.sample(t, self.alive) for t in range(rnd, end)]
        m = len(self.schedule[0])
        self.first_id = self.reserve_ids(len(self.schedule) * m)  # ids by (round, slot), not by timing
        self.bank = [self.state.model] * m  # arrays are never changed in place: copies for free
        self.weights = [0.0] * m
        self.task_slot = {}
        self._ok: list[Result] = []
        self._failed: list[Failure] = []
        self.snaps: dict[int, dict[int, tuple[Arrays, float, float]]] = {}
        return [self._slot_task(i, rnd, 0.0) for i in range(m)]  # the driver stamps the start

    def _slot_task(self, slot: int, rnd: int, sim_time: float) -> Task:
        s = self.schedule[rnd - self.start][slot]
        m = len(self.schedule[0])
        tid = self.first_id + (rnd - self.start) * m + slot
        t = self.chain_task(rnd, s, self.bank[slot], self.alive, tid)
        t.sim_time = sim_time
        self.task_slot[t.task_id] = (slot, rnd)
        return t

    def follow_up(self, done: Result | Failure) -> list[Task]:
        """The slot's next superclient, at once, from the model that just came back."""
        slot, rnd = self.task_slot[done.task_id]
        if isinstance(done, Result) and finite(done.arrays):
            self.bank[slot] = done.arrays
            self.weights[slot] += self.sc_size(self.task_sc[done.task_id])
            self._ok.append(done)
        elif isinstance(done, Failure):
            self._failed.append(done)
        # the slot's state after logical round rnd, to evaluate the bank round by round
        self.snaps.setdefault(rnd, {})[slot] = (self.bank[slot], self.weights[slot], done.sim_time)
        nxt = rnd + 1
        if nxt - self.start >= len(self.schedule) or slot >= len(self.schedule[nxt - self.start]):
            return []
        return [self._slot_task(slot, nxt, done.sim_time)]

    def interim_points(self) -> list[tuple[int, Arrays, float, dict[str, float]]]:
        """The bank's weighted mean after each logical round of the period but the last
        (as the official code logs it), at the time its slowest slot finished that round."""
        out: list[tuple[int, Arrays, float, dict[str, float]]] = []
        for t in range(self.start, self.start + len(self.schedule) - 1):
            snap = self.snaps.get(t, {})
            used = [(a, w) for _, (a, w, _) in sorted(snap.items()) if w > 0]  # slot order
            if not used:
                continue
            sim = max(s for _, _, s in snap.values())
            out.append((t, weighted_mean([a for a, _ in used], [w for _, w in used]), sim,
                        {"slots": len(snap)}))
        return out

    def aggregate_round(self, rnd: int, results: list[Result], failures: list[Failure]
                        ) -> dict[str, float]:
        """End of the period: theta = sum_i w_i Theta_i / sum_i w_i (w: samples each slot saw)."""
        if len(self.schedule) == 1:  # no follow-ups were asked for: record the one round here
            for r in sorted(results, key=lambda r: r.cid):
                self.follow_up(r)
            for f in failures:
                self.follow_up(f)
        used = [(b, w) for b, w in zip(self.bank, self.weights) if w > 0]
        if used:
            if self.p.local == "feddyn":
                self.state.model = self.combine([b for b, _ in used], [w for _, w in used])
            else:
                self.state.model = weighted_mean([b for b, _ in used], [w for _, w in used])
        m = round_metrics(sorted(self._ok, key=lambda r: r.cid), self._failed,
                          len(results) - len(self._ok))
        m["period"] = len(self.schedule)
        return m
