"""The Strategy's declared hooks for the pieces of its update path (contract.ServerPiece): a
piece's state fields survive a checkpoint's encode/decode, its cohort, tasks, sum, row, stop and
summary are asked where contract.py says; --dp's server part is such a piece, held by the
algorithm's own class (no class made at run time)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from fednet.algorithms import build
from fednet.algorithms.aggregate import StreamingMean
from fednet.algorithms.contract import ServerPiece, extended_state
from fednet.algorithms.fedavg import FedAvg
from fednet.algorithms.fedopt import FedAdam, FedOptState
from fednet.algorithms.state import Shapes, decode, encode
from fednet.types import ClientInfo, Result
from tests.conftest import small_config

try:  # (imported with the module, not inside a test: it takes a second)
    import dp_accounting
except ImportError:
    dp_accounting = None


def _model() -> dict[str, np.ndarray]:
    return {"w": np.array([1.0, 2.0], np.float32), "n": np.array(7, np.int64)}


@dataclass
class TallyFields:
    tally: dict[str, Any] = field(default_factory=dict)
    seen: np.ndarray | None = None


class Tally(ServerPiece):
    """Picks the even clients, counts the tasks per client in its own state fields, sums the
    model by a mean it makes (weights 1), adds to the row and the summary; stops after 2."""

    name = "Tally"
    Fields = TallyFields

    def __init__(self) -> None:
        self.calls: list[str] = []

    def init_state(self, st: Any) -> None:
        st.tally, st.seen = {"rounds": 0}, np.zeros(4, np.int64)

    def select(self, rnd, clients):
        return [c for c in clients if c.cid % 2 == 0]

    def configured(self, rnd, clients, tasks) -> None:
        self.calls.append(f"configured {rnd} {len(tasks)}")
        for t in tasks:
            self.srv.state.seen[t.route] += 1

    def sum_of(self, part):
        self.calls.append(f"sum_of {part}")
        return StreamingMean() if part == "model" else None

    def closed(self, rnd, results, failures, metrics):
        self.srv.state.tally["rounds"] += 1
        return {**metrics, "tally": len(results)}

    def stop_before(self, rnd, clients):
        return ("done", "two rounds") if self.srv.state.tally["rounds"] >= 2 else None

    def report(self):
        return {"tally": dict(self.srv.state.tally)}

    def resume_problem(self, st, rounds_done, participants, last_row):
        return None if st.tally["rounds"] == rounds_done else ("json", "tally off")


def test_a_piece_is_called_at_its_declared_hooks_and_its_fields_are_checkpointed():
    algo = FedAvg(small_config(clients=4, algo={"fraction": 1.0}), None)
    piece = Tally()
    algo.add_piece(piece)
    algo.setup(_model(), trainable={"w"})
    st = algo.state
    assert type(st).__name__ == "TallyServerState" and st.tally == {"rounds": 0}
    clients = [ClientInfo(c, 10) for c in range(4)]
    for rnd in range(2):
        assert algo.stop_before(rnd, clients) is None
        tasks = algo.configure_round(rnd, clients)
        assert [t.route for t in tasks] == [[0], [2]] and algo.target == 2
        rs = [Result(t.task_id, rnd, t.route[0], {"w": np.array([3.0, 4.0], np.float32),
                                                  "n": np.array(7)}, {}, 5) for t in tasks]
        row = algo.aggregate_round(rnd, rs, [])
        assert row["tally"] == 2 and algo.state.model["w"].tolist() == [3.0, 4.0]
    assert algo.stop_before(2, clients) == ("done", "two rounds")
    assert algo.report() == {"tally": {"rounds": 2}}
    assert piece.calls == ["configured 0 2", "sum_of model", "configured 1 2", "sum_of model"]
    arrays, meta = encode(algo.state, lambda n: f"state/{n}")
    assert meta["tally"] == {"rounds": 2} and arrays["state/seen"].tolist() == [2, 0, 2, 0]

    def fail(m):
        raise AssertionError(m)
    back, _ = decode(type(algo.state), arrays, meta, lambda n: f"state/{n}",
                     Shapes(_model(), [(2,)], 4, algo.state), fail, fail)
    assert back.seen.tolist() == [2, 0, 2, 0] and back.tally == {"rounds": 2}
    assert algo.resume_problem(back, 2, None, None) is None
    assert algo.resume_problem(back, 3, None, None) == ("json", "tally off")


def test_an_extended_state_keeps_its_own_fields_first_and_is_made_once():
    a = extended_state(FedOptState, (TallyFields,), "TallyFedOptState")
    assert [f.name for f in dataclasses.fields(a)] == ["model", "next_task", "m", "v", "tally",
                                                       "seen"]
    assert extended_state(FedOptState, (TallyFields,), "TallyFedOptState") is a
    assert issubclass(a, FedOptState)


@pytest.mark.parametrize("name, cls", [("fedavg", FedAvg), ("fedadam", FedAdam)])
def test_dp_is_a_piece_the_algorithms_own_class_holds(name, cls):
    if dp_accounting is None:
        pytest.skip("needs dp_accounting (the [dp] extra)")
    cfg = small_config(clients=4, algo={"name": name}, dp={"mode": "central", "noise": 0.4})
    algo = build(cfg)
    assert type(algo) is cls and algo.privacy is not None and algo.pieces == (algo.privacy,)
    algo.setup(_model(), trainable={"w"})
    assert [f.name for f in dataclasses.fields(algo.state)][-2:] == ["dp", "dp_counts"]
    assert isinstance(algo.state, cls.State) and algo.epsilon() == 0.0
    assert type(build(small_config(clients=4, algo={"name": name}))) is cls
