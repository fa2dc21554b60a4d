"""Process lifecycle of real runs: Ctrl-C, a client killed, the launcher killed, server + clients."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time

import psutil
import pytest

from tests.integration.conftest import (describe, jsonl, read_json, server_endpoint,
                                       wait_for_lines, wait_gone)

pytestmark = [pytest.mark.slow, pytest.mark.net]

RUN = ["--epochs", "1", "--batch-size", "16", "--latency", "none", "-q"]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _zygote_and_clients(launcher: int, n: int, timeout_s: float = 30.0
                        ) -> tuple[psutil.Process, list[psutil.Process]]:
    """The launcher's zygote and its n client children (waits until all are forked)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            zyg = [p for p in psutil.Process(launcher).children()
                   if "fednet.launch.zygote" in " ".join(p.cmdline())]
            if zyg and len(zyg[0].children()) == n:
                return zyg[0], zyg[0].children()
        except psutil.Error:  # a process that just exited (or a launcher that failed)
            pass
        time.sleep(0.05)
    pytest.fail(f"the launcher {launcher} did not fork {n} clients through a zygote")


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"),
                                           (signal.SIGTERM, 143, "terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_everything_and_keeps_partial_results(fed, tmp_path, sig, code, word):
    # rounds enough that no load can let the run end before the signal (200 rounds take ~10 s
    # here, and a loaded machine once let a run finish first: exit 0, nothing interrupted)
    p = fed.start("launch", "--clients", "4", "--rounds", "100000", *RUN, "--out", "run")
    wait_for_lines(tmp_path / "run" / "metrics.jsonl", 1, p)
    zyg, kids = _zygote_and_clients(p.pid, 4)
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)  # what a terminal sends to the foreground job on Ctrl-C
    else:
        p.send_signal(sig)  # `kill PID`, or a batch scheduler's time limit
    t0 = time.monotonic()
    rc = p.wait(timeout=30)
    took = time.monotonic() - t0
    err = p.stderr.read()
    assert rc == code, err
    assert took < 8, f"stopping took {took:.1f}s"
    # no --checkpoint-every: the interrupt itself checkpoints the last finished round
    assert err.strip().splitlines()[-1] == (f"fednet: {word}; partial results were kept in run; "
                                            "continue it with `fednet launch --resume run`")
    assert "Traceback" not in err
    assert not wait_gone(fed.marker, 1.0), describe(fed.processes())
    still = [q for q in [zyg, *kids] if _running(q)]
    assert not still, [(q.pid, q.status(), q.ppid(), q.cmdline()) for q in still]
    s = read_json(tmp_path / "run" / "summary.json")
    rows = jsonl(tmp_path / "run" / "metrics.jsonl")
    assert s["status"] == "interrupted"
    assert 1 <= s["rounds"] == len(rows) < 100000
    assert [r["round"] for r in rows] == list(range(len(rows)))
    assert s["final_accuracy"] == rows[-1]["accuracy"]
    assert read_json(tmp_path / "run" / "checkpoint" / "state.json")["rounds_done"] == len(rows)


def test_killed_client_is_a_failure_and_the_run_completes(fed, tmp_path):
    p = fed.start("launch", "--clients", "3", "--rounds", "6", *RUN, "--out", "run")
    _, kids = _zygote_and_clients(p.pid, 3)
    wait_for_lines(tmp_path / "run" / "metrics.jsonl", 1, p)
    victim = kids[1]
    victim.send_signal(signal.SIGKILL)
    rc = p.wait(timeout=120)
    err = p.stderr.read()
    assert rc == 0, err
    s = read_json(tmp_path / "run" / "summary.json")
    assert (s["status"], s["rounds"]) == ("completed", 6)
    assert len(s["client_exit_codes"]) == 1, s["client_exit_codes"]
    (dead, code), = s["client_exit_codes"].items()
    assert code == -9
    assert s["failures"], "the killed client is not recorded in failures"
    assert {f["client"] for f in s["failures"]} == {int(dead)}
    assert all("killed by signal 9" in f["reason"] for f in s["failures"])
    assert len(s["failures"]) == 1
    assert s["client_phases"] == {"exited": 2, "dead": 1}
    rows = jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 6
    assert (rows[-1]["results"], rows[-1]["failures"]) == (2, 0)  # survivors are aggregated
    assert rows[-1]["accuracy"] == s["final_accuracy"] > 0.1
    assert s["devices"] == {"cpu": 3}


def test_killed_process_of_several_clients_fails_each_of_them_and_the_run_completes(fed, tmp_path):
    """--clients-per-process 2: 5 clients in 3 processes; SIGKILL one process of two clients."""
    p = fed.start("launch", "--clients", "5", "--clients-per-process", "2", "--rounds", "6", *RUN,
                  "--out", "run")
    _, kids = _zygote_and_clients(p.pid, 3)
    wait_for_lines(tmp_path / "run" / "metrics.jsonl", 1, p)
    kids[0].send_signal(signal.SIGKILL)
    rc = p.wait(timeout=120)
    err = p.stderr.read()
    assert rc == 0, err
    s = read_json(tmp_path / "run" / "summary.json")
    assert (s["status"], s["rounds"]) == ("completed", 6)
    dead = {int(c) for c in s["client_exit_codes"]}
    assert dead in ({0, 1}, {2, 3}, {4}), s["client_exit_codes"]  # all clients of one process
    assert set(s["client_exit_codes"].values()) == {-9}
    assert {f["client"] for f in s["failures"]} == dead
    assert s["client_phases"] == {"exited": 5 - len(dead), "dead": len(dead)}
    rows = jsonl(tmp_path / "run" / "metrics.jsonl")
    assert (rows[-1]["results"], rows[-1]["failures"]) == (5 - len(dead), 0)  # the rest go on


def test_killed_launcher_takes_zygote_and_clients_with_it(fed, tmp_path):
    p = fed.start("launch", "--clients", "3", "--rounds", "200", *RUN, "--out", "run")
    zyg, kids = _zygote_and_clients(p.pid, 3)
    wait_for_lines(tmp_path / "run" / "metrics.jsonl", 1, p)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and ([q for q in [zyg, *kids] if _running(q)]
                                           or fed.processes()):
        time.sleep(0.1)
    left = [q for q in [zyg, *kids] if _running(q)] + fed.processes()
    assert not left, f"still running 5 s after the launcher was killed: {describe(left)}"


def _lines(stream, q: queue.Queue[str]) -> None:
    for line in stream:
        q.put(line)


def _start_server(fed, *args: str) -> tuple[subprocess.Popen[str], str, queue.Queue[str]]:
    """`fednet server --bind tcp://127.0.0.1:0 ...` and the endpoint it prints on stderr."""
    srv = fed.start("server", "--bind", "tcp://127.0.0.1:0", *args)
    q: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(srv.stderr, q), daemon=True).start()
    return srv, server_endpoint(q, srv, "127.0.0.1"), q


def test_server_and_clients_on_a_port_chosen_at_bind_time(fed, tmp_path):
    srv, endpoint, _ = _start_server(fed, "--clients", "3", "--rounds", "2", "--register-timeout",
                                     "60", *RUN, "--out", "srv")
    cl = fed.run("clients", "--connect", endpoint, "--ids", "0-2", "--timeout", "60", timeout=120)
    assert cl.returncode == 0, cl.stderr
    assert srv.wait(timeout=60) == 0
    s = read_json(tmp_path / "srv" / "summary.json")
    assert (s["status"], s["clients"], s["rounds"], s["runtime"]) == ("completed", 3, 2, "server")
    assert s["endpoint"] == endpoint
    assert s["devices"] == {"cpu": 3}
    assert s["failures"] == []
    assert [r["results"] for r in jsonl(tmp_path / "srv" / "metrics.jsonl")] == [3, 3]
    assert not (tmp_path / "srv" / "logs").exists()  # no local clients, no client log
    assert not wait_gone(fed.marker, 5.0), describe(fed.processes())


def test_a_process_of_several_remote_clients_runs_even_if_one_is_refused(fed, tmp_path):
    """fednet clients --ids 0-2 --clients-per-process 3 against a 2-client server: client 2 is
    refused (id out of range), clients 0 and 1 of the same process run the whole experiment."""
    srv, endpoint, _ = _start_server(fed, "--clients", "2", "--rounds", "2", "--register-timeout",
                                     "60", *RUN, "--out", "srv")
    cl = fed.run("clients", "--connect", endpoint, "--ids", "0-2", "--clients-per-process", "3",
                 "--timeout", "60", timeout=120)
    assert "started 3 clients (1 process)" in cl.stderr
    assert "client 2: the server refused it: client id out of range" in cl.stderr
    assert cl.returncode == 1, cl.stderr  # the process exits 2 (a refused client): reported
    assert srv.wait(timeout=60) == 0
    s = read_json(tmp_path / "srv" / "summary.json")
    assert (s["status"], s["rounds"], s["failures"]) == ("completed", 2, [])
    assert [r["results"] for r in jsonl(tmp_path / "srv" / "metrics.jsonl")] == [2, 2]


def test_killed_server_stops_remote_clients_after_timeout(fed, tmp_path):
    srv, endpoint, _ = _start_server(fed, "--clients", "2", "--rounds", "300", *RUN, "--out", "srv")
    cl = fed.start("clients", "--connect", endpoint, "--ids", "0-1", "--timeout", "4")
    wait_for_lines(tmp_path / "srv" / "metrics.jsonl", 1, cl)  # fails early if the clients end
    srv.send_signal(signal.SIGKILL)
    srv.wait(timeout=10)
    t0 = time.monotonic()
    rc = cl.wait(timeout=30)
    took = time.monotonic() - t0
    err = cl.stderr.read()
    assert rc == 1, err
    assert 4 <= took < 20, took
    assert err.count("lost the server at " + endpoint + " (no connection for 4s); stopping") == 2
    assert err.strip().splitlines()[-1] == ("2 of 2 clients exited with errors (client: exit code "
                                            "{0: 1, 1: 1}); see their log lines above")


def test_a_launch_that_fails_during_its_setup_stops_the_zygote_and_writes_no_summary(tmp_path):
    """The zygote starts before the session exists: an error in between (here in prepare) stops
    it and its clients (core.run.Run owns it from the moment it starts)."""
    from fednet.server.main import run_zmq
    from tests.conftest import small_config

    def prepare(session):
        raise RuntimeError("broken prepare")

    with pytest.raises(RuntimeError, match="broken prepare"):
        run_zmq(small_config(clients=2, rounds=1).replace(out=str(tmp_path / "run")), quiet=True,
                prepare=prepare)
    left = [p for p in psutil.Process().children(recursive=True)
            if _running(p) and "fednet.launch.zygote" in " ".join(p.cmdline())]
    assert not left, describe(left)
    assert not (tmp_path / "run" / "summary.json").exists()
