"""FedSeq and FedSeqInter: equivalences, chains, grouping stage, asynchronous slots."""
from __future__ import annotations

import pytest

from fednet.errors import ConfigError
from fednet.core.inproc import InprocDispatcher
from fednet.core.session import Session
from tests.conftest import run_for_model, same_arrays, small_config

SEQ = {"min_samples": 60, "max_clients": 4, "superclient_fraction": 0.5, "pretrain_epochs": 2}


def _session(cfg):
    s = Session(cfg, quiet=True, write=False)
    s.driver.run(InprocDispatcher(s))
    return s


def test_one_client_superclients_equal_fedavg(tmp_path):
    one = {"min_samples": 1, "max_clients": 1, "superclient_fraction": 1.0, "pretrain_epochs": 1}
    _, avg = run_for_model(small_config(clients=4, rounds=2), tmp_path, "avg")
    s, seq = run_for_model(small_config(clients=4, rounds=2, algo={"name": "fedseq", "params": one}),
                    tmp_path, "seq")
    assert s["setup"]["superclients"] == 4
    assert same_arrays(avg, seq)


def test_fedseq_inter_with_period_one_equals_fedseq(tmp_path):
    _, seq = run_for_model(small_config(clients=8, rounds=3, algo={"name": "fedseq", "params": SEQ}),
                    tmp_path, "seq")
    _, inter = run_for_model(small_config(clients=8, rounds=3, algo={
        "name": "fedseq_inter", "params": dict(SEQ, period=1)}), tmp_path, "inter")
    assert same_arrays(seq, inter)


def test_chains_travel_peer_to_peer_and_superclients_cover_classes():
    cfg = small_config(clients=12, rounds=2, data={"partition": "shards"},
                       algo={"name": "fedseq", "params": dict(SEQ, min_samples=450, max_clients=11,
                                                              pretrain_epochs=5)})
    s = _session(cfg)
    st = s.driver.setup_stats
    groups = st["groups"]
    assert sorted(c for g in groups for c in g) == list(range(12))   # a partition of the clients
    assert all(len(g) <= 11 for g in groups)
    assert st["covered_classes_mean"] > 0.5
    model = 4 * 15_466
    r0 = s.history.rows[0]["bytes_round"]
    chains = s.history.rows[0]["tasks"]
    hops = sum(len(g) - 1 for g in groups) if chains == len(groups) else None
    assert r0["client_to_client"] > 0
    assert r0["server_to_client"] < (chains + 1) * (model + 2000)      # one model per chain
    if hops is not None:
        assert r0["tensor_bytes"] == (2 * chains + hops) * model
    # pre-training: theta_pre + exemplars down to every client, a 10-float confidence vector up
    setup = st["bytes"]
    assert setup["client_to_server"] < 12 * 400
    assert setup["tensor_bytes"] == 12 * (model + 50 * 64 * 4 + 50 * 8) + 12 * 10 * 8


def test_greedy_kl_with_a_classifier_approximator_is_rejected():
    with pytest.raises(ConfigError, match="kl"):
        _session(small_config(algo={"name": "fedseq", "params": {"approximator": "clf_last"}}))


def test_classifier_approximator_with_cosine_and_kmeans_runs():
    p = dict(SEQ, approximator="clf_last2", measure="cosine", grouping="kmeans")
    s = _session(small_config(clients=8, rounds=1, algo={"name": "fedseq", "params": p}))
    assert s.driver.status == "completed" and s.driver.setup_stats["superclients"] >= 2


def test_inter_slots_are_asynchronous_in_simulated_time():
    """With slow clients, a slot that never waits for the others ends its period sooner."""
    base = dict(clients=12, rounds=4, latency={"preset": "hetero"}, data={"partition": "shards"})
    p = dict(SEQ, min_samples=40, max_clients=3, superclient_fraction=0.5)
    seq = _session(small_config(**base, algo={"name": "fedseq", "params": p}))
    inter = _session(small_config(**base, algo={"name": "fedseq_inter", "params": dict(p, period=4)}))
    pre = seq.driver.setup_stats["sim_s"]
    assert inter.driver.setup_stats["sim_s"] == pre
    t_seq, t_inter = seq.driver.sim_time - pre, inter.driver.sim_time - pre
    assert t_inter < t_seq
    rows = inter.history.rows  # the bank evaluated after every logical round, merged after the 4th
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert [bool(r.get("interim")) for r in rows] == [True, True, True, False]
    assert all(a["sim_s"] <= b["sim_s"] for a, b in zip(rows, rows[1:]))


def test_default_min_samples_fits_few_clients(tmp_path):
    """With fewer clients than classes the default |D_S|min (0.9 x mean size x classes) exceeds
    all the data; it is capped at the pre-trained clients' total: one superclient of all."""
    cfg = small_config(clients=4, algo={"name": "fedseq", "params": {"pretrain_epochs": 1}})
    s, _ = run_for_model(cfg, tmp_path, "few")
    assert s["status"] == "completed"
    assert s["setup"]["groups"] == [[0, 1, 2, 3]]
    assert s["setup"]["min_samples"] == 1437  # every training sample of digits
