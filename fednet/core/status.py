"""How a run ends: its status, one enum, set in one place (RoundDriver.end)."""
from __future__ import annotations

from enum import Enum


class RunStatus(str, Enum):
    """summary.json's `status` (a str: it compares, prints and serialises as its value)."""

    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"          # Ctrl-C or SIGTERM
    ERROR = "error"                      # an exception (e.g. a disk that cannot be written)
    FAILED = "failed"                    # --max-failed-rounds, or no usable round at all
    DIVERGED = "diverged"                # the aggregate (model or loss) is not finite
    NO_CLIENTS = "no_clients"            # every client is dead
    NO_CLIENTS_ONLINE = "no_clients_online"  # --availability: nobody online now or later
    REGISTRATION_TIMEOUT = "registration_timeout"
    BUDGET_SPENT = "budget_spent"        # --dp-epsilon: the next round would spend past it

    __str__ = str.__str__
    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    @property
    def ended_by_itself(self) -> bool:
        """The run reached an end of its own: its rounds are history no resume may replace
        (an interrupted run, one stopped by an error, and one that crashed may be run again
        from their checkpoint: every round is reproduced exactly)."""
        return self in ENDED

    @property
    def stops(self) -> bool:
        """The round loop stops after the step that set it."""
        return self in (RunStatus.FAILED, RunStatus.DIVERGED)


ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.DIVERGED,
                   RunStatus.NO_CLIENTS, RunStatus.NO_CLIENTS_ONLINE, RunStatus.BUDGET_SPENT})
