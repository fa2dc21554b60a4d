"""The message model shared by algorithms and runtimes; knows nothing of the wire."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]


def client_name(cid: int) -> str:
    """The sender name of client cid on the wire and in ledgers ("c0007")."""
    return f"c{cid:04d}"


@dataclass(slots=True)
class ClientInfo:
    """What the server knows of a registered client (slots: a million of them take 0.1 GB)."""

    cid: int
    num_examples: int
    device: str = "cpu"
    endpoint: str = ""
    pid: int = 0
    host: str = ""


@dataclass
class Task:
    """Work for a route of clients: the first receives it, the last returns the Result."""

    task_id: int
    round: int
    route: list[int]
    arrays: Arrays = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    kind: str = "train"
    hop: int = 0
    sim_time: float = 0.0
    wire: Arrays | None = None  # the arrays as they travel, when not `arrays` (--compress-down)

    @property
    def cid(self) -> int:
        """The client that holds the task now."""
        return self.route[self.hop]


@dataclass
class Result:
    """What came back from the last client of a task's route."""

    task_id: int
    round: int
    cid: int
    arrays: Arrays = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    num_examples: int = 0
    sim_time: float = 0.0
    sent: float = 0.0  # when the client sent it (simulated s) and its bytes on the wire:
    nbytes: int = 0    # what the server link's schedule of the uploads needs
    tensor_nbytes: int = 0  # of which its arrays as they travelled (the rest is its header)


@dataclass
class Failure:
    """A task that produced no usable result: a crash, a timeout or an error."""

    task_id: int
    round: int
    cid: int
    reason: str
    sim_time: float = 0.0
