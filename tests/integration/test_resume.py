"""A server killed mid-run resumes from its last checkpoint and ends where an unbroken run ends."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from fednet.core.inproc import run_local
from tests.conftest import small_config
from tests.harness import BYTE_KEYS as KEYS

pytestmark = [pytest.mark.net, pytest.mark.slow]
ARGS = ["--clients", "3", "--rounds", "6", "--epochs", "1", "--batch-size", "16", "--lr", "0.1",
        "--seed", "7", "--latency", "lan", "-q"]


@pytest.mark.parametrize("algo", ["fedavg", "fedfomo", "scaffold"])
def test_killed_launcher_resumes_from_its_checkpoint(tmp_path, fed, algo):
    """FedFOMO: personal models, each client's split, the server's affinities and uploads;
    SCAFFOLD: the clients' control variates. The client processes keep their state in
    RUN/checkpoint/clients/ and take it back when the resumed server sends them tasks."""
    cfg = small_config(rounds=6, algo={"name": algo}, net={"checkpoint_every": 2})
    ref = run_local(cfg.replace(out=str(tmp_path / "ref")), quiet=True)
    run = tmp_path / "run"
    same = ["--scaffold-option", "2"] if algo == "scaffold" else []  # ref's (not the tuned 1)
    p = fed.start("launch", *ARGS, "--algo", algo, *same, "--checkpoint-every", "2",
                  "--out", str(run))
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # wait for the round-2 checkpoint and one more round
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3 \
                and (run / "checkpoint" / "state.json").exists():
            break
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)  # the server dies without a word
    p.wait()
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    assert state["rounds_done"] in (2, 4)
    files = sorted(f.name for f in (run / "checkpoint" / "clients").glob("*.npz")) \
        if algo != "fedavg" else []
    # each client's state is on disk: its latest, or (killed between keeping the latest as
    # .prev and writing the next one) its kept one, which is what a resume takes back then
    assert algo == "fedavg" or all(f"c000{i}.npz" in files or f"c000{i}.prev.npz" in files
                                   for i in range(3)), files
    res = fed.run("launch", "--resume", str(run), "-q", timeout=120)
    assert res.returncode == 0, res.stderr
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["rounds"] == 6
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(6))
    with np.load(run / "final_model.npz") as a, np.load(tmp_path / "ref" / "final_model.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in b.files)
    assert {k: s["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}
    assert s["sim_time_s"] == pytest.approx(ref["sim_time_s"], rel=1e-12)
    assert s["final_accuracy"] == ref["final_accuracy"]  # fedfomo: the clients' own models


def test_resume_without_a_checkpoint_is_one_clear_error(tmp_path, fed):
    res = fed.run("local", "--resume", str(tmp_path), "-q")
    assert res.returncode == 2
    assert "config.toml" in res.stderr or "checkpoint" in res.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_clients_reregister_with_a_restarted_server(tmp_path, fed):
    """`fednet server` dies; restarted with --resume on the same address, the running
    `fednet clients` register again by themselves and the run finishes. Results the clients
    computed for the dead server (still queued, or sent late) are refused, not counted again:
    the byte totals are an unbroken run's."""
    ref = run_local(small_config(rounds=6).replace(out=str(tmp_path / "ref")), quiet=True)
    run = tmp_path / "run"
    bind = f"tcp://127.0.0.1:{_free_port()}"
    srv = fed.start("server", "--bind", bind, *ARGS, "--checkpoint-every", "1", "--out", str(run))
    cl = fed.start("clients", "--connect", bind, "--ids", "0-2", "--timeout", "60")
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (
            metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    os.killpg(srv.pid, signal.SIGKILL)
    srv.wait()
    time.sleep(1.0)  # the clients notice the lost connection and keep trying
    res = fed.run("server", "--bind", bind, "--resume", str(run), "-q", timeout=120)
    assert res.returncode == 0, res.stderr
    assert cl.wait(timeout=60) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["rounds"] == 6
    assert [json.loads(x)["round"] for x in metrics.read_text().splitlines()] == list(range(6))
    assert {k: s["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}


def test_an_interrupted_server_prints_the_exact_resume_command_and_its_clients_rejoin(
        tmp_path, fed):
    """docs/cluster.md's recipe keeps the join key outside RUN. Interrupted, the server prints
    the exact `--resume` command (its --bind, its --join-key): that command, with no
    FEDNET_JOIN_KEY, brings the same key back (never a new one drawn in RUN). Killed, a plain
    `fednet server --resume RUN` listens where it did with the key its live clients hold, and
    they rejoin and finish the run."""
    fed.env.pop("FEDNET_JOIN_KEY", None)
    key = tmp_path / "shared" / "run1.key"
    run = tmp_path / "run"
    bind = f"tcp://127.0.0.1:{_free_port()}"
    metrics = run / "metrics.jsonl"

    def clients() -> subprocess.Popen:
        return fed.start("clients", "--connect", bind, "--ids", "0-2", "--timeout", "60",
                         "--join-key", str(key))

    def rows(n: int, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None and not (
                metrics.exists() and len(metrics.read_text().splitlines()) >= n):
            time.sleep(0.05)

    srv = fed.start("server", "--bind", bind, *ARGS, "--rounds", "9", "--join-key", str(key),
                    "--out", str(run))
    deadline = time.monotonic() + 60
    while not key.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    cl = clients()
    rows(2, srv)
    os.killpg(srv.pid, signal.SIGTERM)
    err = srv.communicate(timeout=60)[1]
    assert srv.returncode == 143, err
    assert cl.wait(timeout=60) == 0  # a stopping server shuts its clients down
    line = err.strip().splitlines()[-1]
    assert f"--resume {run} --bind {bind} --join-key {key}`" in line, line
    command = line.split("`fednet ")[1].rstrip("`").split()
    srv = fed.start(*command, "--checkpoint-every", "1")
    cl = clients()
    rows(5, srv)
    os.killpg(srv.pid, signal.SIGKILL)  # its clients live on, holding the run's key
    srv.wait()
    time.sleep(1.0)
    res = fed.run("server", "--resume", str(run), "-q", timeout=120)
    assert res.returncode == 0, res.stderr
    assert not (run / "join.key").exists(), "a resumed server never draws a key of its own"
    assert cl.wait(timeout=60) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["rounds"] == 9
    # a --join-key that holds another key would lock the clients out: refused, one line
    other = tmp_path / "other.key"
    other.write_text("ab" * 32)
    other.chmod(0o600)
    bad = fed.run("server", "--resume", str(run), "--rounds", "10", "--join-key", str(other))
    assert bad.returncode == 2 and "does not hold that key" in bad.stderr, bad.stderr
