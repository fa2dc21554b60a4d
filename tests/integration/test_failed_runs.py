"""A run with no usable result is a failure (issue 23 item 4): every client's update raising ends
the run as `failed`, exit code 4, one line with the first failure's reason and where its
traceback is, and summary.json carries the error text."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.conftest import fednet_cmd

pytestmark = [pytest.mark.slow]

PLUGIN = '''
from fednet.algorithms.fedavg import FedAvgClient
from fednet.algorithms.registry import Spec, register


class Boom(FedAvgClient):
    def run(self, ctx, task):
        raise RuntimeError("a bug in the plugin's update")


register(Spec("always_fails", "every update raises", "fednet.algorithms.fedavg:FedAvg",
              "always_fails:Boom"))
'''


def _run(tmp_path, runtime: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "always_fails.py").write_text(PLUGIN)
    out = tmp_path / runtime
    r = subprocess.run(fednet_cmd() + [runtime, "--plugin", "always_fails.py", "--algo",
                                       "always_fails", "--clients", "4", "--epochs", "1", "-q",
                                       "--out", str(out), *extra],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return r, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("runtime,where", [("local", "this command's log above"),
                                           ("launch", "logs/clients.log")])
def test_every_update_raising_fails_the_run_after_three_rounds(tmp_path, runtime, where):
    r, s = _run(tmp_path, runtime, "--rounds", "6")
    assert r.returncode == 4, r.stderr[-2000:]
    assert s["status"] == "failed" and s["rounds"] == 3
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fednet: error:")]
    assert len(lines) == 1 and "3 rounds in a row without a usable result" in lines[0]
    assert "RuntimeError: a bug in the plugin's update" in lines[0] and where in lines[0]
    assert s["error"] in lines[0]
    if runtime == "launch":
        assert "a bug in the plugin's update" in (tmp_path / "launch" / "logs" /
                                                  "clients.log").read_text()


def test_a_short_run_without_any_usable_result_fails_too(tmp_path):
    r, s = _run(tmp_path, "local", "--rounds", "2")
    assert r.returncode == 4 and s["status"] == "failed"
    assert "no round of the run had a usable result" in s["error"]


def test_max_failed_rounds_0_never_stops_early(tmp_path):
    r, s = _run(tmp_path, "local", "--rounds", "4", "--max-failed-rounds", "0")
    assert s["rounds"] == 4 and s["status"] == "failed" and r.returncode == 4


WRONG = '''
from fednet.algorithms.fedavg import FedAvgClient
from fednet.algorithms.registry import Spec, register


class WrongShapes(FedAvgClient):
    def run(self, ctx, task):
        arrays, body = super().run(ctx, task)
        if ctx.cid in (WHO):
            arrays = {n: a.reshape(-1) for n, a in arrays.items()}
        return arrays, body


register(Spec("wrong_shapes", "some clients send flattened arrays",
              "fednet.algorithms.fedavg:FedAvg", "wrong_shapes:WrongShapes"))
'''


@pytest.mark.parametrize("who,code", [("0,", 0), ("0, 1, 2, 3", 4)], ids=["one", "all"])
def test_wrong_shapes_over_the_wire_are_failures_not_a_crash(tmp_path, who, code):
    """Under fednet launch (real sockets): a client that sends flattened arrays fails its task
    with a one-line reason naming the array; the server runs on. When every client does, the
    run fails (exit 4) with that reason."""
    (tmp_path / "wrong_shapes.py").write_text(WRONG.replace("WHO", who))
    out = tmp_path / "run"
    r = subprocess.run(fednet_cmd() + ["launch", "--plugin", "wrong_shapes.py", "--algo",
                                       "wrong_shapes", "--clients", "4", "--epochs", "1",
                                       "--rounds", "3", "-q", "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == code, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    refused = [f for f in s["failures"] if f["reason"].startswith("result refused: array ")]
    assert refused and len(refused) == len(s["failures"])
    assert "expected float32 (" in refused[0]["reason"]
    if code == 0:
        assert s["status"] == "completed" and {f["client"] for f in refused} == {0}
    else:
        assert s["status"] == "failed" and "result refused" in r.stderr


FOREVER = '''
from fednet.algorithms.fedavg import FedAvg
from fednet.algorithms.registry import Spec, register


class Forever(FedAvg):
    def task_body(self, rnd, c):  # client 0: ASK epochs; the others one
        b = super().task_body(rnd, c)
        return {**b, "epochs": ASK if c.cid == 0 else 1}


register(Spec("forever", "client 0 trains for a long time", "forever:Forever",
              "fednet.algorithms.fedavg:FedAvgClient"))
'''


def _forever(tmp_path, ask: int, epochs: int):
    import time

    (tmp_path / "forever.py").write_text(FOREVER.replace("ASK", str(ask)))
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = subprocess.run(fednet_cmd() + ["launch", "--plugin", "forever.py", "--algo", "forever",
                                       "--clients", "2", "--rounds", "1", "--round-timeout", "5",
                                       "--epochs", str(epochs), "-q", "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert [f["client"] for f in s["failures"]] == [0]
    return s, time.monotonic() - t0, out


def test_a_task_asking_for_more_epochs_than_the_run_allows_fails_at_once(tmp_path):
    """Issue 23 item 6: the work a task may ask for is bounded by the run (--epochs, or the
    algorithm's *epochs parameters): client 0, asked for 1,000,000 epochs in a run of 1, fails
    that task at once with one line (was: it trained on past the run's end)."""
    s, took, _ = _forever(tmp_path, 1_000_000, 1)
    assert "asks for 1000000 epochs; this run allows at most 1" in s["failures"][0]["reason"]
    assert took < 60, took


def test_a_long_task_stops_at_the_runs_end(tmp_path):
    """Issue 23 item 6: client 0's task of 100,000 epochs (allowed: --epochs 100000) fails at
    --round-timeout, the run ends, and the client stops between two batches on SHUTDOWN (was:
    it trained on, and its processes were left behind)."""
    s, took, out = _forever(tmp_path, 100_000, 100_000)
    assert took < 60, took
    assert "no progress within --round-timeout" in s["failures"][0]["reason"]
    assert "client 0: stopped in the middle of a task" in (out / "logs" / "clients.log").read_text()


def test_a_plugin_named_random_py_runs_under_launch(tmp_path):
    """Issue 24: a plugin file named random.py (beside a copy.py) runs under fednet launch: it is
    imported under a private name, and the zygote puts no working directory on its path."""
    (tmp_path / "random.py").write_text(WRONG.replace("WHO", "-1,").replace(
        "wrong_shapes:WrongShapes", "random:WrongShapes").replace('"wrong_shapes"', '"mine"'))
    (tmp_path / "copy.py").write_text("raise SystemExit('the standard library was shadowed')\n")
    out = tmp_path / "run"
    r = subprocess.run(fednet_cmd() + ["launch", "--plugin", "random.py", "--algo", "mine",
                                       "--clients", "2", "--rounds", "1", "--epochs", "1", "-q",
                                       "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "completed" and not s["failures"]
