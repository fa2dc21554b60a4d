"""The `fednet` command line: help, one-line errors, --config files, results files, report."""
from __future__ import annotations

import json
import re
import shutil
import socket
import time
from dataclasses import fields

import pytest
import torch

from fednet.config import PARTITIONS, TrainConfig, from_dict, load_toml
from fednet.algorithms.checks import algorithms as _algorithms
from tests.integration.conftest import SMALL, error_line, jsonl, read_json

ALGORITHMS = _algorithms()

SHARED = ("--clients", "--rounds", "--algo", "--dataset", "--partition", "--alpha", "--seed",
          "--gpus", "--latency", "--out", "--config")


@pytest.mark.slow
def test_help_lists_the_shared_options(fed):
    for args in (["--help"], ["launch", "--help"]):
        res = fed.run(*args)
        assert res.returncode == 0, res.stderr
        for opt in SHARED:
            assert re.search(rf"{opt}\b", res.stdout), (args, opt)
    assert "Commands:" in fed.run("--help").stdout


def _quoted(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{n}'" for n in names)


BAD_INPUT = [
    (["launch", "--algo", "nosuch"],
     f"Invalid value for '--algo': 'nosuch' is not an algorithm; choose one of "
     f"{', '.join(ALGORITHMS)} (`fednet local --help` describes them), or bring your own with "
     "--plugin FILE.py (see 'fednet launch --help')"),
    (["launch", "--algo", "fedavgg"],
     re.compile(r"Invalid value for '--algo': 'fedavgg' is not an algorithm; did you mean "
                r"'fedavg' or .*--plugin FILE\.py .*")),
    (["launch", "--partition", "bad"],
     f"Invalid value for '--partition': 'bad' is not one of {_quoted(PARTITIONS)}. "
     "(see 'fednet launch --help')"),
    (["launch", "--clients", "0"], "--clients must be at least 1 (got 0)"),
    (["launch", "--clients", "5000"],
     re.compile(r"--clients 5000 exceeds the 1437 training samples of [^;]+; use at most 1437")),
    (["launch", "--alpha", "-1"], "--alpha must be >= 0 (got -1.0)"),
    (["launch", "--gpus", "x"], "--gpus expects comma-separated device indices such as 0,1 (got 'x')"),
    (["launch", "--latency", "nosuchpreset"],
     "--latency 'nosuchpreset' is neither a preset (none, lan, wan, hetero) nor an existing "
     "CSV/JSON file"),
    (["launch", "--config", "missing.toml"], "--config: file 'missing.toml' does not exist"),
    (["report", "."], "'.' has no summary.json; give a run folder such as runs/<name>"),
    (["clients", "--connect", "tcp://127.0.0.1:1", "--ids", "5-1"],
     "--ids: the range '5-1' runs backwards; write it as 1-5"),
    (["server", "--bind", "tcp://127.0.0.1:x"],
     "--bind: port 'x' is not a number in 0..65535 (0 = any free port)"),
    (["clients", "--connect", "127.0.0.1:5596", "--ids", "0-3"],  # nothing forked (fed checks)
     "--connect expects tcp://HOST:PORT, e.g. tcp://10.0.0.1:5555 (got '127.0.0.1:5596')"),
    (["clients", "--connect", "tcp://127.0.0.1:5596", "--ids", "0-3", "--join-key", ""],
     "--join-key: a plaintext `fednet server` admits only clients holding its join key; give "
     "--join-key FILE (the server printed its path at start: RUN/join.key unless its own "
     "--join-key; copy it to this host), or run both with --secure DIR"),
    (["sweep", "--out", "run", "--lr", "0.1,x", "--", "--clients", "3"],
     "cell fedavg__lr=x: Invalid value for '--lr': 'x' is not a valid float."),
]


@pytest.mark.slow
@pytest.mark.parametrize("args,expected", BAD_INPUT, ids=[" ".join(a[:3]) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_no_processes(fed, tmp_path, args, expected):
    t0 = time.monotonic()
    res = fed.run(*args, *(["--out", str(tmp_path / "run"), "-q"] if args[0] == "launch" else []))
    line = error_line(res)
    if isinstance(expected, str):
        assert line == expected
    else:
        assert expected.fullmatch(line), line
    assert time.monotonic() - t0 < 20
    assert not (tmp_path / "run").exists()  # an invalid run leaves no results folder


@pytest.mark.slow
def test_valid_but_unbuilt_algorithm_is_not_available(fed, tmp_path, monkeypatch):
    """In-process (the build is simulated by dropping a name from the registry); the zygote
    that `launch` starts meanwhile carries the test's marker and must be stopped."""
    from click.testing import CliRunner

    from fednet import algorithms
    from fednet.cli import main
    from tests.integration.conftest import MARKER

    name = ALGORITHMS[-1]
    monkeypatch.delitem(algorithms.REGISTRY, name, raising=False)
    monkeypatch.setenv(MARKER, fed.marker)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["launch", "--algo", name, "--clients", "3", "--out", "run",
                                    "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr == (f"fednet: error: --algo '{name}' is not available in this build; "
                          f"available: {', '.join(algorithms.available())}\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_gpus_without_cuda_is_a_clear_error(fed):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = error_line(fed.run("launch", "--gpus", "0", "--clients", "3", "-q"))
    assert line == ("--gpus 0: no CUDA device is visible on this machine; run without --gpus to "
                    "use the CPU")


@pytest.mark.slow
def test_config_file_with_unknown_key_or_wrong_type_names_the_key(fed, tmp_path):
    (tmp_path / "a.toml").write_text("clients = 3\n[train]\nlrate = 0.1\n")
    line = error_line(fed.run("launch", "--config", "a.toml", "-q"))
    known = ", ".join(sorted(f.name for f in fields(TrainConfig)))
    assert line == (f"--config a.toml: unknown key 'train.lrate' in the configuration; "
                    f"known keys: {known}")
    (tmp_path / "b.toml").write_text('clients = "three"\n')
    line = error_line(fed.run("local", "--config", "b.toml", "-q"))
    assert line == "--config b.toml: 'clients' must be an integer (got 'three')"


@pytest.mark.slow
@pytest.mark.net
def test_port_in_use_names_bind(fed, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = fed.run("server", "--bind", f"tcp://127.0.0.1:{port}", *SMALL, "--out",
                      str(tmp_path / "run"))
    assert error_line(res) == (f"--bind port {port} is already in use on 127.0.0.1; choose "
                               "another port, or 0 for any free one")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.net
def test_clients_without_server_give_up_after_timeout(fed):
    with socket.socket() as s:  # a port that is free: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        t0 = time.monotonic()
        res = fed.run("clients", "--connect", f"tcp://127.0.0.1:{port}", "--ids", "0",
                      "--timeout", "1.5", timeout=30)
    took = time.monotonic() - t0
    assert error_line(res) == (f"--connect tcp://127.0.0.1:{port}: no server is listening there "
                               "(connection refused, tried for 1.5s); check the address and port, "
                               "start `fednet server` first, or raise --timeout")
    assert 1.5 <= took < 10


@pytest.mark.slow
def test_config_file_is_used_and_options_override_it(fed, tmp_path):
    (tmp_path / "run.toml").write_text(
        'clients = 3\nrounds = 3\nseed = 5\n[train]\nepochs = 1\nlr = 0.05\nbatch_size = 16\n'
        '[data]\npartition = "dirichlet"\nalpha = 0.3\n[algo]\nname = "fedprox"\n'
        '[algo.params]\nmu = 0.5\n')
    res = fed.run("local", "--config", "run.toml", "--rounds", "1", "--lr", "0.1", "--out", "out",
                  "-q")
    assert res.returncode == 0, res.stderr
    cfg = from_dict(load_toml(tmp_path / "out" / "config.toml"))
    assert (cfg.clients, cfg.rounds, cfg.seed) == (3, 1, 5)
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.batch_size) == (1, 0.1, 16)
    assert (cfg.data.partition, cfg.data.alpha) == ("dirichlet", 0.3)
    assert cfg.algo.name == "fedprox" and cfg.algo.params == {"mu": 0.5}
    assert len(jsonl(tmp_path / "out" / "metrics.jsonl")) == 1


@pytest.mark.slow
@pytest.mark.net
def test_launch_writes_every_result_file_and_report_compares_runs(fed, tmp_path):
    res = fed.run("launch", *SMALL, "--out", "a")
    assert res.returncode == 0, res.stderr
    out = tmp_path / "a"
    for name in ("config.toml", "metrics.jsonl", "summary.json", "clients.jsonl", "final_model.npz",
                 "accuracy_vs_round.png", "accuracy_vs_sim_time.png", "accuracy_vs_bytes.png",
                 "logs/clients.log"):
        assert (out / name).is_file(), name
    s = read_json(out / "summary.json")
    assert (s["algorithm"], s["clients"], s["rounds"], s["status"]) == ("fedavg", 3, 2, "completed")
    assert 0.0 < s["final_accuracy"] <= 1.0
    assert s["wall_clock_s"] > 0 and s["sim_time_s"] > 0
    b = s["bytes"]
    assert b["server_to_client"] > b["tensor_bytes"] / 2 > 0 and b["client_to_server"] > 0
    assert b["client_to_client"] == 0  # FedAvg: a star, no peer traffic
    assert s["devices"] == {"cpu": 3}
    assert s["failures"] == [] and s["client_exit_codes"] == {}
    assert s["client_phases"] == {"exited": 3}  # every client ended normally (server/phases.py)
    rows = jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[-1]["accuracy"] == s["final_accuracy"]
    assert [r["client"] for r in jsonl(out / "clients.jsonl")] == [0, 1, 2]
    assert res.stdout.count("fedavg") == 1  # the summary table

    shutil.copytree(out, tmp_path / "b")  # a second run: the same one, changed where it shows
    s.update(algorithm="fedprox", rounds=1, rounds_planned=1, final_accuracy=0.5)
    (tmp_path / "b" / "summary.json").write_text(json.dumps(s))
    rep = fed.run("report", "a", "b")
    assert rep.returncode == 0, rep.stderr
    lines = rep.stdout.splitlines()
    assert lines[0].split() == ["run", "a", "b"]
    by_label = {ln.split("  ")[0].strip(): ln.split() for ln in lines[2:]}
    assert by_label["rounds"][-2:] == ["2/2", "1/1"]
    assert by_label["algorithm"][-2:] == ["fedavg", "fedprox"]
    assert by_label["final accuracy"][-1] == "50.00%"
