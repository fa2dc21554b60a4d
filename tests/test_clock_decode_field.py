"""Work that was done and not on the clock (issue 52's follow-up): the server's decoding of
--compress results, its unpacking of a codec grid's masked inputs under SecAgg, a client's
decoding of a --compress-down task, and a SecAgg client's update flattened, clipped and weighted
onto a grid or encoded by distributed DP. Each is charged now, on its side, in proportion to the
values it handles (fednet/compress decode_work, secagg/cost.py)."""
from __future__ import annotations

import numpy as np
import pytest

from fednet import opcount
from fednet.algorithms import secagg as S
from fednet.compress import DECODE_PASSES, decode_counted, decode_work, encode_result, parse
from fednet.compress.codecs import REGISTERED, codec_work, topk_count
from fednet.core import server_clock
from fednet.core.inproc import run_local
from fednet.network import latency
from fednet.secagg import cost
from tests.conftest import small_config


def _small(**over):
    """small_config on mclr (the work counted does not depend on the model; a faster run)."""
    return small_config(**over, train={"model": "mclr"})


def _arrays(n: int, seed: int = 0) -> tuple[dict, dict, dict]:
    g = np.random.default_rng(seed)
    arrays = {"a": g.standard_normal(n // 2).astype(np.float32),
              "b": g.standard_normal((n - n // 2,)).astype(np.float32), "k": np.arange(3)}
    ref = {k: (v - 0.01).astype(np.float32) for k, v in arrays.items() if k != "k"}
    expect = {k: (v.shape, v.dtype) for k, v in arrays.items()}
    return arrays, ref, expect


@pytest.mark.parametrize("name", ["fp16", "int8", "qsgd", "topk", "sign"])
def test_the_servers_decoding_is_counted_in_proportion_to_the_values(name):
    """decode_counted: the codec's decode and decode_result's own passes (the reference's copy,
    the sum, the cast: DECODE_PASSES), twice for twice the values."""
    got = []
    for n in (2000, 4000):
        arrays, ref, expect = _arrays(n)
        spec = parse(name)
        rng = np.random.default_rng(1) if spec.random else None
        wire, _ = encode_result(spec, arrays, ref, None, rng)
        out, ops = decode_counted(spec, wire, expect, ref)
        assert set(out) == set(arrays)
        m = int(wire["@qsgd.lvl"].size) if name == "qsgd" else 0
        arg = spec.arg
        want = opcount.add(codec_work(name, n, decode=True, m=m,
                                      k=topk_count(n, arg) if name == "topk" else 0),
                           opcount.add(decode_work(n // 2, True), decode_work(n - n // 2, True)))
        assert ops == want and ops["code"] >= DECODE_PASSES[True] * n > 0
        got.append(ops["code"] - 5 * m)  # (QSGD's pass over its M levels follows the data)
    assert got[1] == 2 * got[0]
    assert REGISTERED[name].decode is not None


def _spy_round_work(monkeypatch) -> list[tuple[dict, list]]:
    seen: list[tuple[dict, list]] = []
    orig = server_clock.ServerClock.round_work

    def spy(self, results):
        work = orig(self, results)
        seen.append((dict(work), [r.server_ops for r in results]))
        return work
    monkeypatch.setattr(server_clock.ServerClock, "round_work", spy)
    return seen


def test_a_compressed_rounds_decoding_is_on_the_servers_clock(tmp_path, monkeypatch):
    """A FedAvg round under --compress int8: each result's decoding (its n model values, int8's
    decode and the rebuild against the reference) is in the round's server work."""
    seen = _spy_round_work(monkeypatch)
    cfg = _small(clients=3, rounds=1, out=str(tmp_path / "c"), net={"compress": "int8"})
    s = run_local(cfg, quiet=True)
    assert s["status"] == "completed"
    (work, per), = seen
    n = sum(int(a.size) for a in _model_floats(tmp_path / "c"))
    one = opcount.add(codec_work("int8", n, decode=True), {"code": DECODE_PASSES[True] * n})
    assert len(per) == 3 and all(p == one for p in per)
    assert work["code"] == 3 * one["code"] > 0


def _model_floats(out) -> list[np.ndarray]:
    from tests.harness import final_model
    return [a for a in final_model(out).values() if a.dtype.kind == "f"]


def _spy_client_ops(monkeypatch) -> list[dict]:
    calls: list[dict] = []
    orig = latency.compute_time

    def spy(p, samples, flops=0, protocol=None):
        calls.append(dict(protocol or {}))
        return orig(p, samples, flops, protocol)
    monkeypatch.setattr(latency, "compute_time", spy)
    return calls


def test_a_clients_decoding_of_a_compressed_task_is_on_its_clock(tmp_path, monkeypatch):
    """--compress-down int8: each client's task decoded (int8's decode and the copy into the
    model's arrays, DECODE_PASSES without a reference) charges its own meter."""
    calls = _spy_client_ops(monkeypatch)
    cfg = _small(clients=3, rounds=1, out=str(tmp_path / "d"),
                       net={"compress_down": "int8"})
    assert run_local(cfg, quiet=True)["status"] == "completed"
    n = sum(int(a.size) for a in _model_floats(tmp_path / "d"))
    want = codec_work("int8", n, decode=True)["code"] + DECODE_PASSES[False] * n
    tasks = [c for c in calls if "code" in c and "shamir" not in c]
    assert len(tasks) == 3 and all(c["code"] == want > 0 for c in tasks)


def _spy_server_stage(monkeypatch) -> dict[str, dict]:
    seen: dict[str, dict] = {}
    orig = S.SecAggServer._server

    def spy(self, stage, work):
        opcount.add(seen.setdefault(stage, {}), work)
        return orig(self, stage, work)
    monkeypatch.setattr(S.SecAggServer, "_server", spy)
    return seen


def test_secaggs_grid_inputs_are_unpacked_and_prepared_on_the_clock(tmp_path, monkeypatch):
    """--secagg plus --compress int8: the server's input stage unpacks each of the k inputs
    (UNPACK_PASSES a value) before it sums them; each client's input flattens its update,
    clips and weights it onto the grid, quantizes and packs it (all "field")."""
    seen = _spy_server_stage(monkeypatch)
    calls = _spy_client_ops(monkeypatch)
    cfg = _small(clients=4, rounds=1, out=str(tmp_path / "g"),
                       net={"secagg": "plus", "compress": "int8"})
    assert run_local(cfg, quiet=True)["status"] == "completed"
    n = sum(int(a.size) for a in _model_floats(tmp_path / "g"))
    d = n + 1  # (the loss travels as one more value)
    assert seen["input"] == opcount.add({"stream": 4.0 * d}, cost.unpacked(4 * d))
    assert seen["input"]["field"] == cost.UNPACK_PASSES * 4 * d > 0
    inputs = [c for c in calls if "field" in c and "shamir" not in c]  # (not a bound's)
    per = cost.FLATTEN_PASSES * n + (cost.GRID_PASSES + cost.QUANTIZE_PASSES
                                     + cost.PACK_PASSES) * d
    assert len(inputs) == 4 and all(c["field"] == per for c in inputs)


def test_distributed_dps_encoding_is_on_the_clients_clock(tmp_path, monkeypatch):
    """--dp distributed: a client's input is flattened and encoded by distributed.encode (its
    element work, DDP_PASSES a value, beside the draws it charges itself), not quantized; the
    time split's count of the task (cost.of_task) says the same."""
    calls = _spy_client_ops(monkeypatch)
    cfg = _small(clients=4, rounds=1, out=str(tmp_path / "p"), net={"secagg": "plus"},
                       dp={"mode": "distributed", "noise": 0.4})
    assert run_local(cfg, quiet=True)["status"] == "completed"
    n = sum(int(a.size) for a in _model_floats(tmp_path / "p"))
    inputs = [c for c in calls if "field" in c and "shamir" not in c]  # (not a bound's)
    assert len(inputs) == 4
    for c in inputs:
        assert c["field"] == (cost.FLATTEN_PASSES + cost.DDP_PASSES) * n > 0
        assert c["noise"] >= 4 * n  # (the rounding's uniforms and three draws an attempt)
    arrays = {"sa.partners": np.arange(3), "sa.from": np.arange(3)}
    ddp = cost.of_task("input", {}, arrays, n, 8, "sa.", ddp=True)
    assert ddp["field"] == (cost.FLATTEN_PASSES + cost.DDP_PASSES) * n
    assert ddp["noise"] == pytest.approx(cost.DDP_DRAWS * n)
    assert "field" in cost.of_task("input", {}, arrays, n, 8, "sa.")  # (quantize's, not DDP's)
    assert cost.of_task("input", {}, arrays, n, 8, "sa.")["field"] != ddp["field"]
    assert cost.bound(4, n)["noise"] >= 2 * ddp["noise"]


@pytest.mark.net
@pytest.mark.slow
@pytest.mark.parametrize("over", [
    {"net": {"compress": "qsgd:8", "compress_down": "int8"}},
    {"net": {"secagg": "plus"}, "dp": {"mode": "distributed", "noise": 0.4}}])
def test_launch_charges_the_same_work_as_the_local_run(tmp_path, over):
    """The server's decoding (QSGD's count follows the levels it was sent), a client's decoding
    of its task, distributed DP's encoding: the same simulated seconds under `fednet launch`."""
    import json

    from fednet.server.main import run_zmq

    def cfg(name):
        return _small(clients=3, rounds=2, out=str(tmp_path / name), **over)
    a, b = run_local(cfg("local"), quiet=True), run_zmq(cfg("launch"), quiet=True)
    assert a["status"] == b["status"] == "completed"
    assert a["sim_time_s"] == b["sim_time_s"]
    rows = [[json.loads(x) for x in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
            for n in ("local", "launch")]
    assert [r["server_compute_s"] for r in rows[0]] == [r["server_compute_s"] for r in rows[1]]
    assert [r["sim_s"] for r in rows[0]] == [r["sim_s"] for r in rows[1]]
    assert all(r["server_compute_s"] > 0 for r in rows[0])


# ---- clocktail2: the server's encoding of tasks, a hand-off's encoding, an asynchronous
# server's unused replies, the setup stage's grouping ---------------------------------------
def _no_plots(monkeypatch) -> None:
    """(The run's plots: half a second of matplotlib these tests do not read.)"""
    from fednet.metrics import plots
    monkeypatch.setattr(plots, "plot_run", lambda *a, **k: None)


def _spy_before(monkeypatch) -> list[tuple[dict, list[float]]]:
    _no_plots(monkeypatch)
    seen: list[tuple[dict, list[float]]] = []
    orig = server_clock.ServerClock.before

    def spy(self, tasks, work):
        at = [t.sim_time for t in tasks]
        s = orig(self, tasks, work)
        seen.append((dict(work), [t.sim_time - a for t, a in zip(tasks, at)]))
        return s
    monkeypatch.setattr(server_clock.ServerClock, "before", spy)
    return seen


def test_the_servers_encoding_of_compressed_tasks_is_on_its_clock(tmp_path, monkeypatch):
    """--compress-down int8: the server encodes each round's model once (the flattening,
    int8's encoding, and the decoding it keeps as the tasks' arrays), on its clock before the
    tasks leave: they leave that many server seconds later."""
    from fednet.compress import FLAT_PASSES
    from fednet.network.server_cost import server_rates
    seen = _spy_before(monkeypatch)
    cfg = _small(clients=3, rounds=2, out=str(tmp_path / "e"), net={"compress_down": "int8"})
    assert run_local(cfg, quiet=True)["status"] == "completed"
    n = sum(int(a.size) for a in _model_floats(tmp_path / "e"))
    one = (codec_work("int8", n)["code"] + FLAT_PASSES[False] * n
           + codec_work("int8", n, decode=True)["code"] + DECODE_PASSES[False] * n)
    rounds = [(w, d) for w, d in seen if d]
    assert len(rounds) == 2  # (a round's 3 tasks share one encoding)
    s = opcount.seconds({"code": one}, server_rates(cfg.latency.server_profile))
    for work, delays in rounds:
        assert work == {"code": one} and one > 0
        assert len(delays) == 3 and all(d == pytest.approx(s) and d > 0 for d in delays)


FEDSEQ = {"name": "fedseq", "params": {"pretrain_epochs": 1, "min_samples": 600,
                                       "max_clients": 2, "superclient_fraction": 1.0}}


def test_a_clients_encoding_of_a_hand_off_is_on_its_clock(tmp_path, monkeypatch):
    """--compress-handoff int8 (FedSeq's ring): the holder encodes the model for its peer after
    its training (the flattening and int8's encoding of its n values) on its own clock: the
    hand-off leaves that many of its seconds later."""
    from fednet.compress import FLAT_PASSES
    _no_plots(monkeypatch)
    calls: list[tuple[dict, float]] = []
    orig = latency.protocol_time

    def spy(p, protocol):
        s = orig(p, protocol)
        calls.append((dict(protocol or {}), s))
        return s
    monkeypatch.setattr(latency, "protocol_time", spy)
    cfg = _small(clients=4, rounds=1, out=str(tmp_path / "h"), algo=FEDSEQ,
                 net={"compress_handoff": "int8"})
    s = run_local(cfg, quiet=True)
    assert s["status"] == "completed" and s["bytes"]["client_to_client"] > 0
    n = sum(int(a.size) for a in _model_floats(tmp_path / "h"))
    one = {"code": codec_work("int8", n)["code"] + FLAT_PASSES[False] * n}
    handoffs = [sec for c, sec in calls if c == one]
    rings = s["bytes"]["client_to_client"]  # (each hand-off the same bytes: a model's int8)
    assert one["code"] > 0 and all(sec > 0 for sec in handoffs)
    # every hand-off charged: this ring makes 2 (each the same bytes), and a run that charged
    # fewer than it sent fails here, not only the divisibility of the bytes
    assert len(handoffs) == 2 and rings % 2 == 0


def test_an_asynchronous_servers_unused_replies_are_decoded_on_its_clock(tmp_path, monkeypatch):
    """FedBuff under --compress int8: a reply that arrives after the step's last update is not
    used, but the server decoded it (its n values, int8's decode and the rebuild against the
    reference): charged all the same, one decoding per reply taken in."""
    from fednet.algorithms import asynchronous
    _no_plots(monkeypatch)
    charged: list[dict] = []
    orig = asynchronous.Asynchronous.charge

    def spy(self, work):
        charged.append(dict(work))
        return orig(self, work)
    monkeypatch.setattr(asynchronous.Asynchronous, "charge", spy)
    cfg = _small(clients=6, rounds=1, out=str(tmp_path / "b"), net={"compress": "int8"},
                 algo={"name": "fedbuff", "params": {"concurrency": 3, "buffer": 2}})
    s = run_local(cfg, quiet=True)
    assert s["status"] == "completed"
    import json
    row, = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    n = sum(int(a.size) for a in _model_floats(tmp_path / "b"))
    one = opcount.add(codec_work("int8", n, decode=True), {"code": DECODE_PASSES[True] * n})
    assert row["unused"] >= 1 and one["code"] > 0
    assert sum(c == one for c in charged) == 2 + row["unused"]  # (the buffer's 2, the rest)


@pytest.mark.net
@pytest.mark.slow
def test_launch_charges_a_hand_offs_encoding_as_the_local_run(tmp_path):
    """--compress-handoff int8 on FedSeq's ring (and --compress-down's encoding at the
    server): the same simulated seconds under `fednet launch` (client/peers.handoff) as in
    `fednet local` (core/inproc)."""
    from fednet.server.main import run_zmq

    def cfg(name):
        return _small(clients=4, rounds=1, out=str(tmp_path / name), algo=FEDSEQ,
                      net={"compress_handoff": "int8", "compress_down": "fp16"})
    a, b = run_local(cfg("local"), quiet=True), run_zmq(cfg("launch"), quiet=True)
    assert a["status"] == b["status"] == "completed" and a["bytes"]["client_to_client"] > 0
    assert a["sim_time_s"] == b["sim_time_s"]


@pytest.mark.parametrize("name,measure", [("greedy", "kl"), ("greedy", "cosine"),
                                          ("greedy", "wasserstein"), ("kmeans", "kl")])
def test_the_grouping_counts_its_work_in_proportion_to_the_representations(name, measure):
    """FedSeq's grouping (the server's, at the setup stage): a greedy pick scores the R
    remaining clients' d values (GREEDY_PASSES, WASSERSTEIN) and builds the superclient's
    representation; KMeans its iterations over K x k x d; PCA K d min(K, d) FLOPs."""
    from fednet.algorithms.grouping import approximators, superclients as sc
    got = []
    for d in (8, 16):
        g = np.random.default_rng(0)
        reps = np.repeat(g.dirichlet(np.ones(8), 12), d // 8, axis=1) / (d // 8)
        with opcount.counted() as work:
            groups = sc.group(name, reps, np.full(12, 100), measure, 300, 3, 0, 4)
        assert sorted(i for grp in groups for i in grp) == list(range(12))
        got.append(work["stream"])
        if name == "greedy":  # 12 picks, the remaining 12..1, 3 to a superclient
            want = sum(sc.pick_work(measure, 12 - p, d, p % 3)["stream"] for p in range(12))
            assert work == {"stream": want}
        with opcount.counted() as pca:
            approximators.pca_reduce(reps, 0.9, 0)
        assert pca == {"gemm": approximators.PCA_FLOPS * 12 * d * min(12, d)}
    assert got[0] > 0 and (got[1] > got[0] if measure == "wasserstein" else got[1] == 2 * got[0])


def test_the_setup_stages_grouping_is_on_the_servers_clock(tmp_path, monkeypatch):
    """FedSeq: the server's grouping of the clients' representations is counted (as
    superclients.group counts it) and the first round waits for it."""
    from fednet.algorithms.grouping import superclients as sc
    _no_plots(monkeypatch)
    did: list[dict] = []
    orig = server_clock.ServerClock.did
    counted: list[dict] = []
    group = sc.group

    def spy(self, work):
        did.append(dict(work))
        return orig(self, work)

    def grouped(*a, **k):
        with opcount.counted() as w:
            out = group(*a, **k)
        counted.append(dict(w))
        opcount.charge(w)
        return out
    monkeypatch.setattr(server_clock.ServerClock, "did", spy)
    monkeypatch.setattr(sc, "group", grouped)
    cfg = _small(clients=4, rounds=1, out=str(tmp_path / "s"), algo=FEDSEQ)
    assert run_local(cfg, quiet=True)["status"] == "completed"
    assert len(counted) == 1 and counted[0]["stream"] > 0
    assert counted[0] in did
