"""Secure aggregation in whole runs (fednet local): the round's model within the quantization
bound of plain FedAvg's; dropouts at every stage recovered while enough clients survive, and a
round that cannot be unmasked kept out of the model, naming its stage; the server holds only
masked vectors, each unlike its client's update, and their sum; algorithms whose server needs
individual updates refused in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.algorithms import secagg as S
from fednet.algorithms import secagg_client
from fednet.core.inproc import run_local
from fednet.errors import ConfigError
from fednet.secagg import field
from fednet.secagg.server import Aggregation
from tests.conftest import small_config
from tests.harness import final_model, same_arrays


def _cfg(tmp_path, name, **net):
    return small_config(clients=6, rounds=1, net=net, out=str(tmp_path / name))


def test_one_round_is_plain_fedavg_within_one_quantization_step(tmp_path):
    run_local(_cfg(tmp_path, "plain"), quiet=True)
    s = run_local(_cfg(tmp_path, "sa", secagg="full", secagg_clip=2.0), quiet=True)
    assert s["status"] == "completed" and not s["failures"]
    a, b = final_model(tmp_path / "plain"), final_model(tmp_path / "sa")
    step = 2 * 2.0 / ((1 << 16) - 1)
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= step + 1e-6
    assert any(not np.array_equal(a[k], b[k]) for k in a)  # quantized: not the same bits
    row = json.loads((tmp_path / "sa" / "metrics.jsonl").read_text().splitlines()[0])
    assert set(row["bytes_by_stage"]) == {"keys", "shares", "input", "unmask"}
    assert sum(v["server_to_client"] for v in row["bytes_by_stage"].values()) == \
        row["bytes_round"]["server_to_client"]
    assert row["secagg_clients"] == [6, 6, 6, 6, 6]


def _drop(monkeypatch, who: dict[str, set[int]]):
    """Clients that fail (drop out) at a stage: stage -> ids."""
    run = S.SecAggClient.run

    def failing(self, ctx, task):
        if ctx.cid in who.get(task.stage, ()):
            raise RuntimeError(f"client {ctx.cid} dropped out")
        return run(self, ctx, task)
    monkeypatch.setattr(S.SecAggClient, "run", failing)


@pytest.mark.parametrize("mode", ["full", "plus"])
def test_dropouts_at_every_stage_are_recovered(tmp_path, monkeypatch, mode):
    _drop(monkeypatch, {"keys": {0}, "shares": {1}, "input": {2}, "unmask": {3}})
    cfg = small_config(clients=16, rounds=2, net={"secagg": mode}, out=str(tmp_path / "run"))
    s = run_local(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert s["status"] == "completed" and all("secagg_failed" not in r for r in rows)
    assert rows[0]["secagg_clients"] == [16, 15, 14, 13, 12]  # cohort, keys, shares, input, unmask
    assert len(s["failures"]) == 8 and all("dropped out" in f["reason"] for f in s["failures"])
    from fednet.core.session import Session
    fresh = Session(cfg, quiet=True, write=False).algo.eval_arrays()
    got = final_model(tmp_path / "run")
    assert any(not np.array_equal(got[k], v) for k, v in fresh.items())  # the rounds moved it


def test_a_round_with_too_few_survivors_keeps_the_model_and_names_the_stage(tmp_path,
                                                                            monkeypatch):
    _drop(monkeypatch, {"input": {0, 1, 2, 3}})
    s = run_local(_cfg(tmp_path, "run", secagg="full"), quiet=True)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["secagg_failed"].startswith("secure aggregation failed at stage input: 2 "
                                           "clients left, 4 needed")
    initial = final_model(tmp_path / "run")
    assert s["status"] in ("completed", "failed")
    from fednet.core.session import Session
    fresh = Session(_cfg(tmp_path, "fresh", secagg="full"), quiet=True, write=False)
    assert all(np.array_equal(initial[k], v) for k, v in fresh.algo.eval_arrays().items())


def test_the_server_holds_masked_vectors_and_their_sum_only(tmp_path, monkeypatch):
    seen: dict[int, np.ndarray] = {}
    quantized: dict[int, np.ndarray] = {}
    take = Aggregation.take_input
    quant = field.quantize

    def spy_take(self, cid, y):
        seen[cid] = y.copy()
        take(self, cid, y)

    def spy_quantize(x, clip, bits, weight, fbits, rng, levels=0):
        q = quant(x, clip, bits, weight, fbits, rng, levels)
        quantized[len(quantized)] = q
        return q
    monkeypatch.setattr(Aggregation, "take_input", spy_take)
    monkeypatch.setattr(secagg_client, "quantize", spy_quantize)
    run_local(_cfg(tmp_path, "run", secagg="plus", secagg_neighbours=4), quiet=True)
    assert len(seen) == len(quantized) == 6
    ys, qs = list(seen.values()), list(quantized.values())
    assert all(not np.array_equal(y, q) for y in ys for q in qs)  # no masked input is an update
    assert not np.array_equal(sum(ys), sum(qs))  # nor is their plain sum: the masks remain


@pytest.mark.parametrize("algo, why", [
    ("fedseq", "fedseq hands models between clients, and a ring's model is one client's update"),
    ("cfl", "cfl's clients keep personal models"),
    ("perfedavg", "perfedavg's clients keep personal models"),
    ("factorized", "factorized's clients keep personal models"),
    ("feddyn", r"feddyn's server needs every client's own update, which secure aggregation "
               r"hides \(its Spec does not declare secagg=True\)"),
    ("fedbuff", "fedbuff's server takes each update as it arrives, weighted by its own "
                "staleness, so the clients of a sum are known only as their updates come"),
    ("fedasync", "fedasync's server takes each update as it arrives")])
def test_algorithms_that_need_individual_updates_refuse_it_before_any_data(algo, why):
    """validate (what every command and each sweep cell runs before any data loads) refuses,
    with the reason its declared facts give (Spec.arrivals, handoffs, personalized, secagg),
    naming the algorithms that compose."""
    from fednet.algorithms.checks import validate

    cfg = small_config(clients=4, rounds=1, algo={"name": algo}, net={"secagg": "full"})
    with pytest.raises(ConfigError, match=f"^--secagg full: {why}.*; use fedavg, fedprox, "
                       "scaffold, fedavgm, fedadam, fedyogi, fedadagrad$"):
        validate(cfg)


def test_the_arrivals_fact_is_the_servers_own():
    """Spec.arrivals (what validate reads) is true exactly where the built server takes replies
    in arrival order (Strategy.virtual_order)."""
    from fednet.algorithms import registry
    from fednet.algorithms.halves import _load

    for name in registry.names():
        spec = registry.get(name)
        assert spec.arrivals == bool(getattr(_load(spec.server), "virtual_order", False)), name


@pytest.mark.parametrize("over, says", [
    ({"net": {"secagg": "plus", "compress": "topk"}}, "--compress topk: each client keeps other "
     "coordinates, so the sparse vectors do not add position by position, and secure "
     "aggregation unmasks only their sum; use a codec with a common grid"),
    ({"net": {"secagg": "plus"}, "latency": {"over_select": 1.5}}, "--over-select keeps"),
    ({"net": {"secagg": "full"}, "dp": {"mode": "central", "noise": 1.0}}, "--dp central.s clipping"),
    ({"net": {"secagg": "full"}, "algo": {"eval": "clients"}}, "each client evaluating its own")])
def test_settings_that_read_an_update_refuse_it_before_any_data(over, says):
    from fednet.algorithms.checks import validate

    with pytest.raises(ConfigError, match=f"^--secagg (full|plus): {says}"):
        validate(small_config(clients=4, rounds=1, **over))


def test_compress_and_over_select_refuse_it(tmp_path):
    for over, says in (({"net": {"secagg": "plus", "compress": "sign"}}, "--compress"),
                       ({"net": {"secagg": "plus"}, "latency": {"over_select": 1.5}},
                        "--over-select")):
        with pytest.raises(ConfigError, match=says):
            run_local(small_config(clients=4, rounds=1, out=str(tmp_path / says), **over),
                      quiet=True)


def test_each_stage_is_a_round_trip_in_simulated_time(tmp_path):
    """Clients that compute in no time over a 0.1 s round trip: plain FedAvg's round takes one
    round trip, secure aggregation's four (keys, shares, input, unmask: each stage starts when
    the server has the last one's replies)."""
    lat = tmp_path / "lat.csv"
    lat.write_text("client,compute_s_per_sample,rtt_s,up_bps,down_bps\n"
                   + "".join(f"{c},0,0.1,0,0\n" for c in range(6)))
    sims = {}
    for mode in ("off", "plus", "full"):
        cfg = small_config(clients=6, rounds=1, net={"secagg": mode}, out=str(tmp_path / mode),
                           latency={"preset": "lan", "file": str(lat), "server_profile": "none"})
        sims[mode] = run_local(cfg, quiet=True)["sim_time_s"]
    assert sims == pytest.approx({"off": 0.1, "plus": 0.4, "full": 0.4})


def test_a_neighbourhood_that_lost_too_many_shares_says_what_to_raise(tmp_path, monkeypatch):
    _drop(monkeypatch, {"input": {0, 1, 2, 3}})
    run_local(small_config(clients=12, rounds=1, out=str(tmp_path / "run"),
                           net={"secagg": "plus", "secagg_neighbours": 4}), quiet=True)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["secagg_clients"][:3] == [12, 12, 12] and "shares" in row["secagg_failed"]
    assert row["secagg_failed"].endswith("(SecAgg+ gave each client 4 neighbours, enough for "
                                         "--secagg-neighbours: raise it to survive more dropouts)")


# ---- --secagg-drop, and the rounds it costs said ---------------------------------------------

def _who_drops(seed: int, rnd: int, clients: int, stage: str, rate: float) -> set[int]:
    """The clients --secagg-drop STAGE:RATE drops in round rnd (its documented draw)."""
    from fednet import rng
    from fednet.secagg.server import STAGES

    return {c for c in range(clients)
            if rng.generator(seed, "secagg-drop", rnd, c).random(4)[STAGES.index(stage)] < rate}


def test_secagg_drop_is_those_clients_failing_at_that_stage(tmp_path, monkeypatch):
    """--secagg-drop input:0.15 drops its seeded draw of clients at the input stage: the same
    model, failures and simulated time as those clients failing there, a failure without a
    traceback to look for, and the run recovers (completed)."""
    net = {"secagg": "full", "secagg_drop": "input:0.15"}
    cfg = small_config(clients=10, rounds=2, net=net, out=str(tmp_path / "drop"))
    s = run_local(cfg, quiet=True)
    who = [_who_drops(7, r, 10, "input", 0.15) for r in range(2)]
    assert all(1 <= len(w) <= 4 for w in who), who  # (this seed: some, and few enough)
    assert s["status"] == "completed"
    assert [(f["round"], f["client"]) for f in s["failures"]] == [
        (r, c) for r in range(2) for c in sorted(who[r])]
    assert all(f["reason"] == "dropped out at stage input (--secagg-drop input:0.15)"
               for f in s["failures"])
    run = S.SecAggClient.run

    def failing(self, ctx, task):
        if task.stage == "input" and ctx.cid in who[task.round]:
            from fednet.errors import Dropout
            raise Dropout("dropped out at stage input (--secagg-drop input:0.15)")
        return run(self, ctx, task)
    monkeypatch.setattr(S.SecAggClient, "run", failing)
    t = run_local(cfg.replace(out=str(tmp_path / "same"), **{"net.secagg_drop": ""}), quiet=True)
    assert same_arrays(final_model(tmp_path / "drop"), final_model(tmp_path / "same"))
    assert s["sim_time_s"] == t["sim_time_s"] and s["failures"] == t["failures"]


def test_a_run_whose_secagg_rounds_mostly_failed_is_failed_naming_the_stage(tmp_path,
                                                                            monkeypatch):
    """Rounds 2 and 3 of 3 lose too many clients at the input stage: each says so, and the run
    ends failed (exit code 4) naming the stage, though no 3 rounds failed in a row."""
    run = S.SecAggClient.run

    def failing(self, ctx, task):
        if task.round > 0 and task.stage == "input" and ctx.cid < 4:
            raise RuntimeError("gone")
        return run(self, ctx, task)
    monkeypatch.setattr(S.SecAggClient, "run", failing)
    s = run_local(_cfg(tmp_path, "run", secagg="full").replace(rounds=3), quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("round_failed", "") for r in rows] == [
        "", *["secure aggregation failed at stage input: 2 clients left, 4 needed"] * 2]
    assert [r["secagg_clients"] for r in rows] == [[6] * 5, [6, 6, 6, 2], [6, 6, 6, 2]]
    assert s["status"] == "failed"
    assert s["error"].startswith("2 of 3 rounds had no usable result (the last, round 3: "
                                 "secure aggregation failed at stage input: 2 clients left, "
                                 "4 needed)")
    from fednet.metrics.run_end import run_error
    assert run_error(s)[0] == 4


def test_a_cohort_of_one_at_run_time_fails_its_round_named(tmp_path):
    """A round whose cohort is one client (validate refuses it up front; here the protocol
    alone): a sum of one input would be that update, so the keys stage needs 2."""
    from fednet.secagg.server import Aggregation, SecAggFailed
    agg = Aggregation(0, [3], {3: 10}, None, 0.5, 32, np.random.default_rng(0))
    from fednet.secagg import crypto
    pk = np.frombuffer(crypto.keypair(bytes(range(32)))[1], np.uint8)
    assert agg.take_keys(3, pk, pk[::-1].copy()) == ""
    with pytest.raises(SecAggFailed, match="stage keys: 1 clients left, 2 needed"):
        agg.share_requests()


# ---- the algorithms secure aggregation wraps: SCAFFOLD's two sums, FedProx, the FedOpt family --

def _scaffold_rounds(tmp_path, monkeypatch, name, rounds, **net):
    """A SCAFFOLD run of 3 toy clients; the server's (model, c) after each round."""
    from fednet.algorithms.scaffold import Scaffold

    seen: list[tuple[dict, dict]] = []
    agg = Scaffold.aggregate_round

    def spy(self, rnd, results, failures):
        out = agg(self, rnd, results, failures)
        seen.append(({k: v.copy() for k, v in self.state.model.items()},
                     {k: v.copy() for k, v in self.state.c.items()}))
        return out
    monkeypatch.setattr(Scaffold, "aggregate_round", spy)
    s = run_local(small_config(clients=3, rounds=rounds, algo={"name": "scaffold"},
                               net=net, out=str(tmp_path / name)), quiet=True)
    assert s["status"] == "completed" and not s["failures"], s.get("error")
    return seen


@pytest.mark.parametrize("mode", ["full", "plus"])
def test_scaffold_sums_its_model_and_control_changes_securely(tmp_path, monkeypatch, mode):
    """SCAFFOLD under --secagg: one masked vector holds each client's model change (weighted by
    its samples) and its control change (weighing 1). After a round the server's model is plain
    SCAFFOLD's within one quantization step, and its control c = c + (sum of the 3 clients'
    changes) / N within 3 steps / N; the server's c is exactly the unmasked sum the clients'
    quantized control changes make."""
    clip, bits = 2.0, 16
    step = 2 * clip / ((1 << bits) - 1)
    plain = _scaffold_rounds(tmp_path, monkeypatch, "plain", 1)
    qs: list[np.ndarray] = []
    quant = field.quantize

    def spy_quantize(x, c, b, weight, fbits, rng, levels=0):
        q = quant(x, c, b, weight, fbits, rng, levels)
        if weight == 1:  # the control change's part (its own call, weight 1)
            qs.append(q)
        return q
    monkeypatch.setattr(secagg_client, "quantize", spy_quantize)
    sa = _scaffold_rounds(tmp_path, monkeypatch, "sa", 1, secagg=mode, secagg_clip=clip)
    (m0, c0), (m1, c1) = plain[0], sa[0]
    assert set(c1) == set(c0) and c1 and len(qs) == 3
    assert max(float(np.abs(m0[k] - m1[k]).max()) for k in c0) <= step + 1e-6
    assert max(float(np.abs(c0[k] - c1[k]).max()) for k in c0) <= 3 * step / 3 + 1e-6
    assert any(float(np.abs(c1[k]).max()) > 10 * step for k in c1)  # c moved: not a zero sum
    total = sum(q.astype(np.int64) for q in qs)  # sum_u q_u, each weighing 1
    want = (total * step - 3 * clip) / 3  # the decoded sum over N = 3 clients
    got = np.concatenate([c1[k].ravel() for k in sorted(c1)]).astype(np.float64)
    assert np.allclose(got, want, atol=1e-6)


def test_scaffold_under_secagg_keeps_each_clients_control_across_rounds(tmp_path, monkeypatch):
    """Three rounds: each client's c_k (its own state, never sent) lives on, and the run follows
    plain SCAFFOLD's. Option II divides a model change by K lr into c, so the quantization's
    error grows round by round (at 16 bits to ~1e-2 here); at 22 bits it stays below 1e-3."""
    plain = _scaffold_rounds(tmp_path, monkeypatch, "plain", 3)
    sa = _scaffold_rounds(tmp_path, monkeypatch, "sa", 3, secagg="full", secagg_clip=2.0,
                          secagg_bits=22)
    gap = [max(float(np.abs(p[0][k] - s[0][k]).max()) for k in p[1]) for p, s in zip(plain, sa)]
    assert gap[-1] < 1e-3 and all(g > 0 for g in gap), gap


@pytest.mark.parametrize("mode", ["full", "plus"])
@pytest.mark.parametrize("algo", ["fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_the_fedopt_family_steps_from_the_unmasked_mean(tmp_path, monkeypatch, algo, mode):
    """Each server optimizer under --secagg full|plus takes its step from the mean secure
    aggregation unmasked: within one quantization step of plain FedAvg's weighted mean of the
    same clients' models, and the step is the rule's own from that mean."""
    from fednet.algorithms import fedopt

    means: dict[str, dict[str, np.ndarray]] = {}
    step_of = fedopt.server_step

    def spy(rule, x, avg, m, v, p):
        means[run][len(means[run])] = avg.copy()
        return step_of(rule, x, avg, m, v, p)
    monkeypatch.setattr(fedopt, "server_step", spy)
    for run, net in (("plain", {}), ("sa", {"secagg": mode, "secagg_clip": 2.0})):
        means[run] = {}
        s = run_local(small_config(clients=6, rounds=1, algo={"name": algo}, net=net,
                                   out=str(tmp_path / run)), quiet=True)
        assert s["status"] == "completed" and not s["failures"]
    step = 2 * 2.0 / ((1 << 16) - 1)
    assert len(means["sa"]) == len(means["plain"]) > 0
    assert max(float(np.abs(means["plain"][i] - means["sa"][i]).max())
               for i in means["plain"]) <= step + 1e-6
    assert any(not np.array_equal(means["plain"][i], means["sa"][i]) for i in means["plain"])


@pytest.mark.parametrize("mode", ["full", "plus"])
def test_fedprox_is_plain_fedprox_within_one_quantization_step(tmp_path, mode):
    run_local(small_config(clients=6, rounds=1, algo={"name": "fedprox"},
                           out=str(tmp_path / "plain")), quiet=True)
    s = run_local(small_config(clients=6, rounds=1, algo={"name": "fedprox"},
                               net={"secagg": mode, "secagg_clip": 2.0},
                               out=str(tmp_path / "sa")), quiet=True)
    assert s["status"] == "completed" and not s["failures"]
    a, b = final_model(tmp_path / "plain"), final_model(tmp_path / "sa")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 2 * 2.0 / ((1 << 16) - 1) + 1e-6
    assert any(not np.array_equal(a[k], b[k]) for k in a)
