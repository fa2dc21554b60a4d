"""A peer killed inside a FedSeq ring: the holder retries, then skips it (or returns the model to
the server); the chain's model is never lost and the run finishes."""
from __future__ import annotations

import json
import os
import signal

import pytest

from fednet.server.main import run_zmq
from tests.conftest import small_config

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _kill_in_ring(session, victim_index: int, when: int = 1):
    orig = session.algo.configure_round

    def configure_round(rnd, clients):
        tasks = orig(rnd, clients)
        if rnd == when:
            route = tasks[0].route
            pid = next(c.pid for c in clients if c.cid == route[victim_index])
            os.kill(pid, signal.SIGKILL)
            session.killed = route[victim_index]
        return tasks
    session.algo.configure_round = configure_round


@pytest.mark.parametrize("mode,victim", [("skip", 2), ("skip", 3), ("server", 2)])
def test_dead_peer_in_a_ring_is_skipped_or_the_model_returns(tmp_path, mode, victim):
    p = {"min_samples": 1400, "max_clients": 4, "superclient_fraction": 1.0, "pretrain_epochs": 1}
    cfg = small_config(clients=4, rounds=3, algo={"name": "fedseq", "params": p},
                       net={"ack_timeout": 1.0, "ack_retries": 2, "dead_peer": mode})
    sessions = []
    s = run_zmq(cfg.replace(out=str(tmp_path)), quiet=True,
                prepare=lambda ss: (sessions.append(ss), _kill_in_ring(ss, victim)))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert s["status"] == "completed" and s["rounds"] == 3
    assert [r["results"] for r in rows] == [1, 1, 1]       # the chain's model came back every round
    killed = sessions[0].killed
    assert any(f["client"] == killed for f in s["failures"])
    assert s["final_accuracy"] is not None and s["final_accuracy"] > 0.1
