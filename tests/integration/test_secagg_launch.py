"""Secure aggregation over real processes and sockets: `fednet launch` gives the in-process run's
model, bytes (each stage's too) and simulated time bit for bit, with clients going offline
between stages (--availability); a client process killed in the middle of a round is a dropout
and the round is unmasked without it."""
from __future__ import annotations

import os
import signal

import pytest

from fednet.core.inproc import run_local
from fednet.server import app
from fednet.server.main import run_zmq
from tests.conftest import small_config
from tests.harness import BYTE_KEYS, byte_totals, final_model, same_arrays

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _cfg(tmp_path, name, **over):
    return small_config(clients=12, rounds=3, out=str(tmp_path / name),
                        latency={"preset": "wan", "availability": "offline:0.1:0.2"},
                        net={"secagg": "plus"}, **over)


def test_launch_agrees_with_local_under_dropouts(tmp_path):
    a = run_local(_cfg(tmp_path, "local"), quiet=True)
    b = run_zmq(_cfg(tmp_path, "launch"), quiet=True)
    assert a["status"] == b["status"] == "completed"
    assert same_arrays(final_model(tmp_path / "local"), final_model(tmp_path / "launch"))
    assert byte_totals(a, BYTE_KEYS + ("header_bytes",)) == byte_totals(b, BYTE_KEYS +
                                                                       ("header_bytes",))
    assert a["bytes_by_stage"] == b["bytes_by_stage"]
    assert a["sim_time_s"] == b["sim_time_s"] and a["failures"] == b["failures"]
    assert any("offline" in f["reason"] for f in a["failures"])  # clients dropped out


def test_a_client_process_killed_mid_round_is_a_dropout(tmp_path, monkeypatch):
    """Client 5's process is killed when the shares stage's first result arrives: its task
    fails when the server sees it die, and the round is unmasked from the others."""
    orig = app.ZmqServer._on_result
    killed: list[int] = []

    def on_result(self, cid, got):
        stage = got.msg.body.get("stage") if isinstance(got.msg.body, dict) else None
        if stage == "shares" and not killed and 5 in self.clients:
            killed.append(self.clients[5].pid)
            os.kill(self.clients[5].pid, signal.SIGKILL)
        return orig(self, cid, got)
    monkeypatch.setattr(app.ZmqServer, "_on_result", on_result)
    s = run_zmq(small_config(clients=12, rounds=2, out=str(tmp_path / "kill"),
                             net={"secagg": "plus", "clients_per_process": 1}), quiet=True)
    assert killed and s["status"] == "completed", s.get("error")
    assert [f for f in s["failures"] if f["client"] == 5]
    assert s["final_accuracy"] is not None


def test_secagg_drop_gives_the_same_run_under_launch(tmp_path):
    """--secagg-drop's seeded dropouts (here at two stages) are the same clients under both
    runtimes: the same model, failures, bytes and simulated time. The run is SCAFFOLD's (its
    model and control changes in one masked vector, each client's c_k kept in its process), so
    its second round's model also depends on the first round's securely summed c."""
    over = {"net": {"secagg": "full", "secagg_drop": "shares:0.1,input:0.15"},
            "algo": {"name": "scaffold"}}
    a = run_local(small_config(clients=10, rounds=2, out=str(tmp_path / "local"), **over),
                  quiet=True)
    b = run_zmq(small_config(clients=10, rounds=2, out=str(tmp_path / "launch"), **over),
                quiet=True)
    assert a["status"] == b["status"] == "completed"
    assert a["failures"] == b["failures"] and a["failures"]
    assert all("--secagg-drop" in f["reason"] for f in a["failures"])
    assert same_arrays(final_model(tmp_path / "local"), final_model(tmp_path / "launch"))
    assert a["sim_time_s"] == b["sim_time_s"] and a["bytes_by_stage"] == b["bytes_by_stage"]


SILENT = '''
import os
import time

from fednet.algorithms import secagg
from fednet.errors import Dropout
from fednet.models.nets import register_model

_RUN = secagg.SecAggClient.run


def run(self, ctx, task):
    # (a harmless no-op without the variables: a process that loaded it may serve later runs)
    if ctx.cid == 3 and task.stage == os.environ.get("SILENT_STAGE", "-"):
        if os.environ.get("SILENT_HOW") == "drop":
            raise Dropout("dropped out")
        time.sleep(3600)  # connected, and never answers
    return _RUN(self, ctx, task)


secagg.SecAggClient.run = run
register_model("silent_probe", lambda classes, shape: None)  # (a plugin registers something)
'''


@pytest.mark.parametrize("stage", ["shares", "input", "unmask"])
def test_a_silent_client_is_a_dropout_of_its_stage(tmp_path, monkeypatch, stage):
    """Client 3 stays connected and never answers one stage: at the stage's deadline it drops
    out, the next stage goes out, and the round's model is the one of the run where client 3
    dropped out at that stage (fednet local)."""
    from fednet.algorithms import secagg
    from fednet.errors import Dropout

    # the server loads the plugin too (it patches the class in this process): put it back after
    monkeypatch.setattr(secagg.SecAggClient, "run", secagg.SecAggClient.run)
    (tmp_path / "silent.py").write_text(SILENT)
    monkeypatch.setenv("SILENT_STAGE", stage)
    monkeypatch.setenv("SILENT_HOW", "sleep")  # (the launched clients load the plugin)
    net = {"secagg": "plus", "secagg_neighbours": 4, "round_timeout": 3.0,
           "clients_per_process": 1}
    b = run_zmq(small_config(clients=8, rounds=1, out=str(tmp_path / "launch"), net=net,
                             plugins=(str(tmp_path / "silent.py"),)), quiet=True)
    run = secagg.SecAggClient.run

    def drop(self, ctx, task):  # the reference: client 3 drops out at that stage
        if ctx.cid == 3 and task.stage == stage:
            raise Dropout("dropped out")
        return run(self, ctx, task)
    monkeypatch.setattr(secagg.SecAggClient, "run", drop)
    a = run_local(small_config(clients=8, rounds=1, out=str(tmp_path / "local"), net=net),
                  quiet=True)
    assert a["status"] == b["status"] == "completed", b.get("error")
    assert [f["client"] for f in b["failures"]] == [3]
    assert "a stage's deadline" in b["failures"][0]["reason"]
    assert same_arrays(final_model(tmp_path / "local"), final_model(tmp_path / "launch"))


HOSTILE = '''
import os

import numpy as np

from fednet.models.nets import register_model
from fednet.secagg import client as C

_KEYS, _SHARES, _UNMASK = C.keys, C.shares, C.unmask


def keys(cid, rnd, rng):  # client 2 advertises a key no agreement can use
    out = _KEYS(cid, rnd, rng)
    if cid == 2 and os.environ.get("HOSTILE"):  # (a no-op for later runs of this process)
        out["c_pk"] = np.zeros(32, np.uint8)
    return out


def shares(s, nbrs, c_pks, s_pks, t, rng):  # client 4 seals shares that open nowhere
    out = _SHARES(s, nbrs, c_pks, s_pks, t, rng)
    if s.cid == 4 and os.environ.get("HOSTILE"):
        out["sealed"] = out["sealed"].copy()
        out["sealed"][:, :8] ^= 0xFF
    return out


def unmask(s, survivors, dropped):  # client 5 lies in one unmask share
    out = _UNMASK(s, survivors, dropped)
    if s.cid == 5 and len(out["b_share"]) and os.environ.get("HOSTILE"):
        out["b_share"] = out["b_share"].copy()
        out["b_share"][0, :4] ^= 0x5A
    return out


C.keys, C.shares, C.unmask = keys, shares, unmask
register_model("hostile_probe", lambda classes, shape: None)  # (a plugin registers something)
'''


def test_hostile_key_holders_cost_the_same_under_launch(tmp_path, monkeypatch):
    """A low-order key (client 2), sealed shares that open nowhere (client 4) and a lying
    unmask share (client 5) under fednet launch: the same model as fednet local with the same
    three clients, each named at its stage."""
    from fednet.secagg import client as C
    # the server loads the plugin too (it patches C in this process): put them back after
    monkeypatch.setattr(C, "keys", C.keys)
    monkeypatch.setattr(C, "shares", C.shares)
    monkeypatch.setattr(C, "unmask", C.unmask)
    (tmp_path / "hostile.py").write_text(HOSTILE)
    monkeypatch.setenv("HOSTILE", "1")
    net = {"secagg": "full"}
    b = run_zmq(small_config(clients=10, rounds=2, out=str(tmp_path / "launch"), net=net,
                             plugins=(str(tmp_path / "hostile.py"),)), quiet=True)
    from fednet import plugins
    plugins.load_modules([str(tmp_path / "hostile.py")])  # (once: the server's precheck may
    # have loaded it already; it patches C in this process, and monkeypatch puts C back)
    a = run_local(small_config(clients=10, rounds=2, out=str(tmp_path / "local"), net=net),
                  quiet=True)
    assert a["status"] == b["status"] == "completed" and not a["failures"] and not b["failures"]
    assert same_arrays(final_model(tmp_path / "local"), final_model(tmp_path / "launch"))
    assert a["secagg"]["failed_rounds"] == b["secagg"]["failed_rounds"] == 0
    import json
    for run in ("local", "launch"):  # the three misbehaved in both, and were named
        rows = [json.loads(x) for x in
                (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        assert [[c, st] for r in rows for c, st, _ in r["secagg_refused"]] == \
            [[2, "keys"], [4, "shares"], [5, "unmask"]] * 2, run


HUGE = '''
import os

import numpy as np

from fednet.models.nets import register_model
from fednet.secagg import client as C

_KEYS = C.keys


def keys(cid, rnd, rng):  # client 6 answers the keys stage with 32 MiB where 32 bytes go
    out = _KEYS(cid, rnd, rng)
    if cid == 6 and os.environ.get("HUGE"):  # (a no-op for later runs of this process)
        out["c_pk"] = np.zeros(32 << 20, np.uint8)
    return out


C.keys = keys
register_model("huge_probe", lambda classes, shape: None)  # (a plugin registers something)
'''


def test_an_oversized_reply_is_not_read_and_costs_only_its_sender(tmp_path, monkeypatch):
    """A key holder's reply far larger than its task's result layout is refused before any of
    its arrays is joined (the reason says so: not the layout check after decoding), its task
    fails as its client's, and the round goes on without it: the model of the run where client
    6 dropped out at the keys stage."""
    from fednet.algorithms import secagg
    from fednet.errors import Dropout
    from fednet.secagg import client as C

    monkeypatch.setattr(C, "keys", C.keys)  # (the server loads the plugin too)
    (tmp_path / "huge.py").write_text(HUGE)
    monkeypatch.setenv("HUGE", "1")
    net = {"secagg": "full"}
    b = run_zmq(small_config(clients=8, rounds=1, out=str(tmp_path / "launch"), net=net,
                             plugins=(str(tmp_path / "huge.py"),)), quiet=True)
    monkeypatch.delenv("HUGE")
    assert b["status"] == "completed", b.get("error")
    [f] = b["failures"]
    assert f["client"] == 6 and "a RESULT with 33554464 bytes of arrays for task" in f["reason"]
    assert "whose result holds at most" in f["reason"], f["reason"]
    run = secagg.SecAggClient.run

    def drop(self, ctx, task):
        if ctx.cid == 6 and task.stage == "keys":
            raise Dropout("dropped out")
        return run(self, ctx, task)
    monkeypatch.setattr(secagg.SecAggClient, "run", drop)
    run_local(small_config(clients=8, rounds=1, out=str(tmp_path / "local"), net=net), quiet=True)
    assert same_arrays(final_model(tmp_path / "local"), final_model(tmp_path / "launch"))


def test_distributed_dp_gives_the_same_run_under_launch(tmp_path):
    """--dp distributed: each client's noise share comes from its own seeded stream, so fednet
    launch gives fednet local's model, epsilon and events bit for bit."""
    over = {"net": {"secagg": "plus"}, "dp": {"mode": "distributed", "noise": 0.5}}
    a = run_local(small_config(clients=8, rounds=2, out=str(tmp_path / "local"), **over),
                  quiet=True)
    b = run_zmq(small_config(clients=8, rounds=2, out=str(tmp_path / "launch"), **over),
                quiet=True)
    assert a["status"] == b["status"] == "completed", b.get("error")
    assert same_arrays(final_model(tmp_path / "local"), final_model(tmp_path / "launch"))
    assert a["dp"] == b["dp"] and a["dp"]["events"][0][1] == 2
