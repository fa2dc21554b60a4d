"""The byte ledger: every frame sent or received, on both ends, by direction and kind."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

SERVER = "server"
# Kinds that carry the run itself; the rest (registration, heartbeats, shutdown) is control traffic,
# reported apart because its size depends on endpoints and timing, not on the algorithm.
TRAFFIC_KINDS = frozenset({"TASK", "RESULT", "HANDOFF", "HANDOFF_ACK", "HOP_DONE", "FAILURE"})


def direction(src: str, dst: str) -> str:
    """server_to_client, client_to_server or client_to_client."""
    if src == SERVER:
        return "server_to_client"
    if dst == SERVER:
        return "client_to_server"
    return "client_to_client"


@dataclass(frozen=True)
class Entry:
    """One message on one link as seen by one end."""

    round: int
    kind: str
    src: str
    dst: str
    header_bytes: int
    payload_bytes: int
    tensor_bytes: int

    @property
    def total(self) -> int:
        """Header plus payload frames (the identity frame and zmq framing are not counted)."""
        return self.header_bytes + self.payload_bytes


def _counts() -> defaultdict[str, int]:
    return defaultdict(int)


class Ledger:
    """Records messages as seen by one process; totals split by direction and round."""

    __slots__ = ("keep_entries", "entries", "_by_round", "_totals", "_by_stage")

    def __init__(self, keep_entries: bool = False) -> None:
        self.keep_entries = keep_entries
        self.entries: list[Entry] = []
        self._by_round: dict[int, dict[str, int]] = defaultdict(_counts)
        self._totals: dict[str, int] = defaultdict(int)
        # (round, stage) -> direction -> bytes: the stages of a protocol inside a round (secure
        # aggregation's keys, shares, input, unmask), for the messages that name one
        self._by_stage: dict[tuple[int, str], dict[str, int]] = defaultdict(_counts)

    def record(self, rnd: int, kind: str, src: str, dst: str, header_bytes: int, payload_bytes: int,
               tensor_bytes: int, stage: str = "") -> None:
        """Add one message (a REJECT sent is counted apart: rejects_sent, rejects_sent_messages;
        it answers someone else's mistake and is not traffic of the run)."""
        total = header_bytes + payload_bytes  # Entry.total (an Entry is built only when kept:
        if kind == "REJECT":                  # a frozen dataclass's ~3 us, twice a task)
            self._totals["rejects_sent"] += total
            self._totals["rejects_sent_messages"] += 1
            return
        if self.keep_entries:
            self.entries.append(Entry(rnd, kind, src, dst, header_bytes, payload_bytes,
                                      tensor_bytes))
        traffic = kind in TRAFFIC_KINDS
        key = direction(src, dst) if traffic else "control"
        if stage:
            self._by_stage[(rnd, stage)][key] += total
        for bucket in (self._totals, self._by_round[rnd]):
            bucket[key] += total
            if traffic:
                bucket["tensor_bytes"] += tensor_bytes
                bucket["header_bytes"] += header_bytes
                bucket["messages"] += 1
            else:
                bucket["control_messages"] += 1

    @property
    def messages(self) -> int:
        """The run's messages (control traffic's apart: totals()["control_messages"])."""
        return int(self._totals.get("messages", 0))

    def reject(self, nbytes: int) -> None:
        """Count a received message that was refused (undecodable, unproven, unexpected): apart
        from every accepted total, so an attack never inflates what the run measured."""
        self._totals["rejected"] += int(nbytes)
        self._totals["rejected_messages"] += 1

    def add_totals(self, rnd: int, totals: dict[str, int]) -> None:
        """Merge totals reported by another process (e.g. a client's peer traffic)."""
        for k, v in totals.items():
            self._totals[k] += int(v)
            self._by_round[rnd][k] += int(v)

    def totals(self) -> dict[str, int]:
        """All rounds: server_to_client, client_to_server, client_to_client, tensor_bytes, ...,
        and what was refused (rejected bytes, rejected_messages)."""
        keys = ("server_to_client", "client_to_server", "client_to_client", "tensor_bytes",
                "header_bytes", "messages", "control", "control_messages", "rejected",
                "rejected_messages", "rejects_sent", "rejects_sent_messages")
        return {k: int(self._totals.get(k, 0)) for k in keys}

    def stage_totals(self, rnd: int | None = None) -> dict[str, dict[str, int]]:
        """Bytes by stage and direction, of round rnd (None: of every round)."""
        out: dict[str, dict[str, int]] = {}
        for (r, stage), by in self._by_stage.items():
            if rnd is None or r == rnd:
                got = out.setdefault(stage, {})
                for k, v in by.items():
                    got[k] = got.get(k, 0) + v
        return out

    def round_totals(self, rnd: int) -> dict[str, int]:
        """Totals of one round (same keys as totals())."""
        r = self._by_round.get(rnd, {})
        keys = ("server_to_client", "client_to_server", "client_to_client", "tensor_bytes",
                "header_bytes", "control")
        return {k: int(r.get(k, 0)) for k in keys}
