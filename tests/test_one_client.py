"""No single client ends, stalls or steers a run beyond its own share (issue 36, item 6): every
check of a result is against what the server itself knows. A result with NaN/inf (also one that
decodes to inf from finite int8 scales), a sample count other than the partition the server
assigned, or a simulated-time stamp outside its task's window is that client's named failure;
the model is then exactly the one of a run where that client simply fails, and a run is
`diverged` only when its own aggregate is."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.algorithms.layout import NON_FINITE
from fednet.compress import encode_result, parse
from fednet.core import executor
from fednet.core.inproc import run_local
from fednet.core.replies import Bounds, accept_reply
from fednet.core.wire import failure_message
from fednet.network.latency import Profile
from fednet.protocol import Message, MsgKind
from tests.conftest import small_config

ORIG = executor.Executor.on_task


def _run(tmp_path, monkeypatch, name: str, change, rounds: int = 3, **cfg):
    """A 3-client FedAvg run whose client 0's reply is change(reply) (None: it raises)."""
    def on_task(self, msg, nbytes):
        out = ORIG(self, msg, nbytes)
        if self.cid == 0 and out.reply.kind == MsgKind.RESULT:
            if change is None:  # the reference: client 0 simply fails
                r = out.reply
                out.reply = failure_message(0, r.task_id, r.round, "client 0 fails", r.sim_time,
                                            r.run_id)
            else:
                change(out.reply)
        return out

    monkeypatch.setattr(executor.Executor, "on_task", on_task)
    s = run_local(small_config(clients=3, rounds=rounds, out=str(tmp_path / name), **cfg), quiet=True)
    with np.load(tmp_path / name / "final_model.npz", allow_pickle=False) as z:
        return s, {k: z[k] for k in z.files}


def _nan(reply):
    name = sorted(reply.arrays)[0]
    reply.arrays[name] = np.full_like(reply.arrays[name], np.nan)


def _n(reply):
    reply.body["n"] = 1 << 50


def _late(reply):
    reply.sim_time = 1.7e308


def _early(reply):
    reply.sim_time = -5.0


@pytest.mark.parametrize("change,says", [(_nan, NON_FINITE),
                                         (_n, "its sample count n = 1125899906842624, but the "
                                              "server assigned this client"),
                                         (_late, "outside its task's window"),
                                         (_early, "outside its task's window")])
def test_one_clients_bad_result_is_its_failure_and_the_model_is_as_if_it_failed(
        tmp_path, monkeypatch, change, says):
    ref, ref_model = _run(tmp_path, monkeypatch, "ref", None)
    s, model = _run(tmp_path, monkeypatch, "bad", change)
    assert s["status"] == "completed" and s["rounds"] == 3
    bad = [f for f in s["failures"] if f["client"] == 0]
    assert len(bad) == 3 and all(says in f["reason"] for f in bad), bad
    assert not [f for f in s["failures"] if f["client"] != 0]
    assert all(np.array_equal(model[k], ref_model[k]) for k in ref_model)
    assert s["sim_time_s"] == ref["sim_time_s"]  # no stamp of client 0's moved the clock
    rows = [json.loads(x) for x in (tmp_path / "bad" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["sim_s"]) for r in rows)


def test_a_non_finite_result_alone_in_its_round_does_not_end_the_run(tmp_path, monkeypatch):
    """One client a round (fraction 1/3): client 0's NaN rounds have no result, and the run
    goes on (keeping the model), rather than stopping as `diverged`."""
    s, _ = _run(tmp_path, monkeypatch, "alone", _nan, rounds=9, algo={"fraction": 0.34})
    assert s["status"] == "completed" and s["rounds"] == 9
    assert any(NON_FINITE in f["reason"] for f in s["failures"])


def test_every_client_diverging_still_ends_the_run_as_diverged(tmp_path):
    """FedDyn at lr 1e4: every client's result is NaN/inf; the aggregate diverged."""
    cfg = small_config(rounds=5, train={"lr": 1e4}, algo={"name": "feddyn"})
    s = run_local(cfg.replace(out=str(tmp_path / "boom")), quiet=True)
    assert s["status"] == "diverged" and s["rounds"] < 5, s.get("error")


def test_int8_with_finite_scales_that_decode_to_inf_is_refused():
    spec = parse("int8")
    model = {"w": np.zeros(8, np.float32)}
    wire, _ = encode_result(spec, {"w": np.arange(8, dtype=np.float32)}, model, None, None)
    wire["@q8.scale"] = np.array([[0.0, 3e38]], np.float32)  # finite; 255 * 3e38 is not
    msg = Message(MsgKind.RESULT, "c0000", "r" * 32, 0, 1, 1.0, {"n": 5, "body": {}}, wire)
    got = accept_reply(msg, 0, 100, [Profile()], {"w": ((8,), np.dtype(np.float32))}, spec,
                       model, None, Bounds(5, 0.0, 10.0))
    assert NON_FINITE in got.reason, got


def test_a_compressed_hand_off_is_checked_against_the_receivers_model_before_allocation():
    """A peer's hand-off layout claiming a 1 GiB array for one of the model's entries is refused
    before anything is allocated (it is not this model's shape)."""
    import json
    import tracemalloc

    from fednet.compress import CompressionError
    from fednet.compress.downlink import LAYOUT, decode, encode_values

    model = {"w": np.zeros(16, np.float32)}
    wire = encode_values(parse("int8"), model, 0, "x")
    wire[LAYOUT] = np.frombuffer(json.dumps([["w", [1 << 28], "<f4"]]).encode(), np.uint8)
    tracemalloc.start()
    with pytest.raises(CompressionError, match="the sender's 'w' .* is not this model's"):
        decode(parse("int8"), wire, {"w": ((16,), np.dtype(np.float32))})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20


def test_the_time_window_admits_a_client_that_trains_on_the_pooled_set(tmp_path):
    """The centralized reference's one worker trains on every example, not its partition: its
    reply's time is bounded by the pooled set's size (the window would refuse it otherwise)."""
    s = run_local(small_config(clients=40, rounds=1, algo={"name": "centralized"},
                               out=str(tmp_path / "c")), quiet=True)
    assert s["status"] == "completed" and not s["failures"], s["failures"]
