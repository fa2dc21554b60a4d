"""--track against the real tools: a real MLflow tracking server started here on 127.0.0.1
(sqlite backend, served artifacts) read back through MLflow's client, and TensorBoard event files
read back with tensorboard's own reader; a resumed run continues its MLflow run and its
TensorBoard history; a server that cannot be reached is an error that leaves nothing behind."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import SMALL, fednet_cmd

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1 with a sqlite store; its URI once /health answers."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    exe = [sys.executable, "-m", "mlflow", "server"]
    proc = subprocess.Popen(exe + ["--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                                   "--backend-store-uri", f"sqlite:///{root}/store.db",
                                   "--artifacts-destination", str(root / "artifacts")],
                            stdout=open(root / "server.log", "wb"), stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(uri + "/health", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("mlflow server did not start: "
                            + (root / "server.log").read_text()[-2000:])
            time.sleep(0.5)
    yield uri
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _fednet(*args: str, env: dict | None = None, check: bool = True):
    r = subprocess.run(fednet_cmd() + list(args), capture_output=True, text=True, timeout=600,
                       env={**os.environ, **(env or {})})
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _run_of(uri: str, out: Path):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    run_id = json.loads((out / "mlflow.json").read_text())["run_id"]
    return c, c.get_run(run_id)


def test_launch_logs_params_metrics_artifacts_and_status_to_mlflow(mlflow_server, tmp_path):
    out = tmp_path / "run"
    _fednet("launch", *SMALL, "--rounds", "3", "--lr", "0.1", "--out", str(out),
            "--track", f"mlflow:{mlflow_server}", env={"MLFLOW_EXPERIMENT_NAME": "fednet-test"})
    c, run = _run_of(mlflow_server, out)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert c.get_experiment(run.info.experiment_id).name == "fednet-test"
    assert run.data.params["train.lr"] == "0.1" and run.data.params["algo.name"] == "fedavg"
    assert run.data.tags["fednet.status"] == "completed"
    rows = _rows(out)
    acc = c.get_metric_history(run.info.run_id, "accuracy")
    assert [(m.step, m.value) for m in sorted(acc, key=lambda m: m.step)] == [
        (r["round"] + 1, r["accuracy"]) for r in rows]
    up = c.get_metric_history(run.info.run_id, "bytes_round/client_to_server")
    assert sorted(m.value for m in up) == sorted(float(r["bytes_round"]["client_to_server"])
                                                 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert run.data.metrics["final_accuracy"] == summary["final_accuracy"]
    names = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"summary.json", "config.toml", "metrics.jsonl", "accuracy_vs_round.png"} <= names
    got = Path(c.download_artifacts(run.info.run_id, "summary.json", str(tmp_path)))
    assert got.read_bytes() == (out / "summary.json").read_bytes()


def test_a_resumed_run_continues_its_mlflow_run_and_its_tensorboard_history(mlflow_server,
                                                                           tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    track = ["--track", f"mlflow:{mlflow_server}", "--track", "tensorboard"]
    _fednet("local", *SMALL, "--checkpoint-every", "1", "--out", str(out), *track)
    first = json.loads((out / "mlflow.json").read_text())["run_id"]
    _fednet("local", "--resume", str(out), "--rounds", "4", "-q", *track)
    c, run = _run_of(mlflow_server, out)
    assert run.info.run_id == first and run.info.status == "FINISHED"
    rows = _rows(out)
    steps = sorted(m.step for m in c.get_metric_history(run.info.run_id, "accuracy"))
    assert steps == [1, 2, 3, 4] and len(rows) == 4
    ea = EventAccumulator(str(out / "tensorboard"))
    ea.Reload()
    acc = ea.Scalars("accuracy")
    assert [e.step for e in acc] == [1, 2, 3, 4]  # one history across the two segments
    assert [e.value for e in acc] == pytest.approx([r["accuracy"] for r in rows], rel=1e-6)
    sent = ea.Scalars("bytes_round/server_to_client")
    assert [e.value for e in sent] == [r["bytes_round"]["server_to_client"] for r in rows]
    assert "summary/text_summary" in ea.Tags()["tensors"]


def test_an_unreachable_tracking_server_is_an_error_that_leaves_nothing(tmp_path):
    out = tmp_path / "run"
    r = _fednet("local", *SMALL, "--out", str(out), "--track", f"mlflow:http://127.0.0.1:{_free_port()}",
                check=False)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("fednet: error: --track mlflow:http://127.0.0.1:") and \
        "is the tracking server running" in last
    assert not out.exists()
    bad = _fednet("local", *SMALL, "--out", str(out), "--track", "wandb", check=False)
    assert bad.returncode == 2 and "--track 'wandb': expected tensorboard[:DIR] or mlflow[:URI]" \
        in bad.stderr


def _all_metrics(c, run_id: str, names) -> dict[str, list[tuple[int, float]]]:
    return {k: sorted((m.step, m.value) for m in c.get_metric_history(run_id, k)) for k in names}


def test_track_upload_sends_a_finished_run_to_mlflow_once(mlflow_server, tmp_path):
    """A run made without --track, uploaded afterwards: every number of every row at step
    round + 1, the parameters, the files and the status; a second upload sends nothing and says
    so, --again makes a second MLflow run."""
    from mlflow.tracking import MlflowClient

    from fednet.metrics.tracking import scalars

    out = tmp_path / "run"
    _fednet("local", *SMALL, "--rounds", "3", "--lr", "0.1", "--out", str(out))
    env = {"MLFLOW_EXPERIMENT_NAME": "fednet-upload"}
    r = _fednet("track", "upload", str(out), "--mlflow", mlflow_server, env=env)
    c = MlflowClient(mlflow_server)
    run_id = json.loads((out / "mlflow.json").read_text())["run_id"]
    assert r.stdout.strip().splitlines()[-1] == (  # (after MLflow's own "View run" lines)
        f"mlflow:{mlflow_server}: 3 rows, the summary and 7 files sent to "
                                f"MLflow run {run_id} at {mlflow_server}")
    run = c.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.tags["fednet.status"] == "completed" and run.data.tags["fednet.uploaded"] == "true"
    assert run.data.params["train.lr"] == "0.1" and run.data.params["rounds"] == "3"
    rows = _rows(out)
    want: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for k, v in scalars(row).items():
            want.setdefault(k, []).append((row["round"] + 1, v))
    assert "accuracy" in want and "bytes_round/client_to_server" in want
    summary = json.loads((out / "summary.json").read_text())
    at_end = {k: [(summary["rounds"], float(v))] for k, v in summary.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}  # the summary's numbers
    assert _all_metrics(c, run_id, want) == {k: sorted(v + at_end.get(k, []))
                                             for k, v in want.items()}
    assert run.data.metrics["final_accuracy"] == summary["final_accuracy"]
    names = {a.path for a in c.list_artifacts(run_id)}
    assert {"summary.json", "config.toml", "metrics.jsonl", "clients.jsonl",
            "accuracy_vs_round.png"} <= names
    exp = run.info.experiment_id
    again = _fednet("track", "upload", str(out), "--mlflow", mlflow_server, env=env)
    assert "already there, as MLflow run " + run_id + " (FINISHED)" in again.stdout
    assert len(c.search_runs([exp])) == 1
    _fednet("track", "upload", str(out), "--mlflow", mlflow_server, "--again", env=env)
    second = json.loads((out / "mlflow.json").read_text())["run_id"]
    assert second != run_id and len(c.search_runs([exp])) == 2
    assert _all_metrics(c, second, ["accuracy"]) == _all_metrics(c, run_id, ["accuracy"])


def test_track_upload_replaces_the_mlflow_run_a_dropped_tracker_left_running(mlflow_server,
                                                                           tmp_path):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    _fednet("local", *SMALL, "--out", str(out), "--track", f"mlflow:{mlflow_server}")
    c = MlflowClient(mlflow_server)
    live = json.loads((out / "mlflow.json").read_text())["run_id"]
    c.update_run(live, status="RUNNING")  # as a tracker that dropped mid-run leaves it
    c.delete_tag(live, "fednet.status")
    r = _fednet("track", "upload", str(out))  # to the run's own --track
    new = json.loads((out / "mlflow.json").read_text())["run_id"]
    assert new != live and f"sent to MLflow run {new}" in r.stdout
    old = c.get_run(live)
    assert old.info.status == "FAILED" and old.data.tags["fednet.replaced_by"] == new
    assert c.get_run(new).info.status == "FINISHED"
    rows = _rows(out)
    assert _all_metrics(c, new, ["accuracy"])["accuracy"] == [(r["round"] + 1, r["accuracy"])
                                                              for r in rows]


def test_track_upload_writes_one_tensorboard_history_however_often_it_runs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    _fednet("local", *SMALL, "--rounds", "3", "--out", str(out))
    for _ in range(2):
        r = _fednet("track", "upload", str(out), "--track", "tensorboard")
        assert r.stdout.strip() == (f"tensorboard: 3 rows and the summary written to "
                                    f"{out / 'tensorboard'} (a second upload replaces this history)")
    ea = EventAccumulator(str(out / "tensorboard"))
    ea.Reload()
    rows = _rows(out)
    acc = ea.Scalars("accuracy")
    assert [e.step for e in acc] == [1, 2, 3]  # once each, after two uploads
    assert [e.value for e in acc] == pytest.approx([r["accuracy"] for r in rows], rel=1e-6)
    sent = ea.Scalars("bytes_round/server_to_client")
    assert [e.value for e in sent] == [r["bytes_round"]["server_to_client"] for r in rows]
    assert {"config/text_summary", "summary/text_summary"} <= set(ea.Tags()["tensors"])


def test_an_outage_mid_run_drops_the_tracker_and_its_return_catches_it_up(tmp_path, monkeypatch):
    """MLflow (a sqlite store) failing for two rounds mid-run: the tracker is dropped at the
    first failure, and at the end, its store answering again, it gets the rows it missed and
    ends its run as usual; one that stays away is named in the summary with the upload
    command and its run ended as FAILED."""
    from mlflow.tracking import MlflowClient

    from fednet.metrics.tracking import Tracking

    uri = f"sqlite:///{tmp_path}/m.db"
    rows = [{"round": r, "accuracy": 0.1 * r, "bytes_round": {"server_to_client": 10 * r}}
            for r in range(5)]
    summary = {"status": "completed", "rounds": 5, "final_accuracy": 0.4}
    for back in (True, False):
        out = tmp_path / f"run-{back}"
        out.mkdir()
        t = Tracking((f"mlflow:{uri}",), out, {"algo": {"name": "fedavg"}, "rounds": 5})
        t.start()
        mlf = t.trackers[0]
        real = mlf.c.log_batch

        def gone(*args, **kwargs):
            raise ConnectionError("gone")

        for r in rows:
            if r["round"] == 2:  # the outage
                monkeypatch.setattr(mlf.c, "log_batch", gone)
            t.row(r)
        assert t.trackers == [] and t.dropped == [mlf]
        if back:
            monkeypatch.setattr(mlf.c, "log_batch", real)
        else:
            monkeypatch.setattr(mlf, "reachable", lambda: False)
        t.recover(rows)
        notes = t.notes()
        if not back:
            monkeypatch.setattr(mlf, "reachable", lambda: True)  # it answers, but too late
        t.end({**summary, **notes}, out)
        c = MlflowClient(uri)
        run = c.get_run(mlf.run_id)
        acc = sorted((m.step, m.value) for m in c.get_metric_history(mlf.run_id, "accuracy"))
        if back:
            assert notes == {} and run.info.status == "FINISHED"
            assert acc == [(r["round"] + 1, r["accuracy"]) for r in rows]
            assert run.data.tags["fednet.status"] == "completed"
        else:
            assert notes == {"tracking": {"dropped": [f"mlflow:{uri}"], "upload":
                                          f"fednet track upload {out} --track mlflow:{uri}"}}
            assert run.info.status == "FAILED" and run.data.tags["fednet.tracking"] == "dropped"
            assert acc == [(1, 0.0), (2, 0.1)]  # what it had before the outage
