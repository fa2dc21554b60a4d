"""A peer killed inside a FedSeq ring: the holder retries, then skips it (or returns the model to
the server); the chain's model is never lost and the run finishes."""
from __future__ import annotations

import json
import os
import signal

import pytest

from fednet.server.main import run_zmq
from fednet.transport.security import init_keys
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


def _record(session, victim_index: int, when: int = 1):
    """Kill route[victim_index] of round `when`'s chain; record each round's route and the
    clients whose RESULT came back."""
    _kill_in_ring(session, victim_index, when)
    session.routes, session.senders = {}, {}
    conf, agg = session.algo.configure_round, session.algo.aggregate_round

    def configure_round(rnd, clients):
        tasks = conf(rnd, clients)
        session.routes[rnd] = list(tasks[0].route)
        return tasks

    def aggregate_round(rnd, results, failures):
        session.senders[rnd] = [r.cid for r in results]
        return agg(rnd, results, failures)
    session.algo.configure_round, session.algo.aggregate_round = configure_round, aggregate_round


@pytest.mark.parametrize("mode", ["skip", "server", "skip --secure"])
def test_a_dead_middle_peer_is_skipped_to_its_successor(tmp_path, mode):
    """With --dead-peer skip the model goes on to the dead peer's successor (which trains and
    returns the chain's RESULT: two hand-offs in the round, one HOP_DONE each; under --secure the
    successor checks the skipping sender's own key); with server the holder returns it to the
    server itself (one hand-off)."""
    p = {"min_samples": 1400, "max_clients": 4, "superclient_fraction": 1.0, "pretrain_epochs": 1}
    net = {"ack_timeout": 1.0, "ack_retries": 2, "dead_peer": mode.split()[0]}
    if mode.endswith("--secure"):  # one key pair per client process (fednet launch --secure)
        init_keys(tmp_path / "keys")
        net.update(secure=str(tmp_path / "keys"), clients_per_process=1)
    cfg = small_config(clients=4, rounds=2, algo={"name": "fedseq", "params": p}, net=net)
    tmp_path = tmp_path / "run"
    sessions = []
    s = run_zmq(cfg.replace(out=str(tmp_path)), quiet=True,
                prepare=lambda ss: (sessions.append(ss), _record(ss, 2)))
    ss = sessions[0]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert s["status"] == "completed" and [r["results"] for r in rows] == [1, 1]
    route = ss.routes[1]
    assert len(route) == 4 and ss.killed == route[2]
    c2c = [r["bytes_round"]["client_to_client"] for r in rows]
    per_hop = c2c[0] // 3  # round 0: three hand-offs of the same model (one HOP_DONE each)
    assert c2c[0] == 3 * per_hop and per_hop > 10_000
    if mode != "server":  # 0 -> 1 -> 3: the successor of the dead peer trained and returned it
        assert ss.senders[1] == [route[3]]
        assert c2c[1] == 2 * per_hop  # the dead peer's hop is not counted
        assert s["client_rejected_messages"] == 0
    else:  # 0 -> 1, then route[1] sends the model to the server
        assert ss.senders[1] == [route[1]]
        assert c2c[1] == per_hop
