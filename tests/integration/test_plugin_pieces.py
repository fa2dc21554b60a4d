"""docs/extending.md's plugin pieces (geomed.py, a defense, and laplace.py, a DP mechanism, each
written from the doc's own code block) under fednet local, fednet launch and fednet server +
fednet clients: the same final model, bit for bit, from the doc's commands (geomed's at two
rounds; laplace's at one round of 4 clients), and the same epsilon (issue 58: a new defense or
DP mechanism in one plugin file, no file of fednet changed). The two plugins' runs of one
runtime run side by side, to keep the slow lane short."""
from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from tests.harness import final_model, same_arrays

pytestmark = [pytest.mark.net, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
SHORT = ["--rounds", "2", "-q"]
FEWER = {"geomed": [], "laplace": ["--clients", "4", "--rounds", "1"]}  # (the slow lane's time)


def _doc(stem: str) -> tuple[str, list[list[str]]]:
    """The plugin's code and the doc's two commands (local, launch), as written."""
    text = DOC.read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                if b.startswith(f'"""{stem}.py'))
    cmds = [shlex.split(ln)[1:] for ln in re.findall(
        rf"(?m)^fednet \w+ +--plugin {stem}\.py.*$", text)]
    assert [c[0] for c in cmds] == ["local", "launch"], cmds
    return code, cmds


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(fed, *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([*_cmd(), *args], env=fed.env, cwd=fed.cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    fed.popens.append(p)
    return p


def _finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]


def _server_and_clients(fed, cmd: list[str], stem: str) -> list[subprocess.Popen[str]]:
    """`fednet server` with the local command's run options, and `fednet clients` for its
    clients (the plugin comes named in WELCOME)."""
    port, last = _port(), 3 if FEWER[stem] else 9
    srv = _start(fed, "server", *cmd[1:cmd.index("--out")], *SHORT, *FEWER[stem], "--out",
                 f"runs/{stem}-server", "--bind", f"tcp://127.0.0.1:{port}")
    cl = _start(fed, "clients", "--connect", f"tcp://127.0.0.1:{port}", "--ids", f"0-{last}",
                "--timeout", "60")
    return [srv, cl]


def test_the_docs_plugin_pieces_give_one_model_under_every_runtime(fed):
    docs = {stem: _doc(stem) for stem in ("geomed", "laplace")}
    for stem, (code, _) in docs.items():
        (fed.cwd / f"{stem}.py").write_text(code)
    for i in (0, 1):  # fednet local, then fednet launch: both plugins' runs at once
        _finish([_start(fed, *cmds[i], *SHORT, *FEWER[stem]) for stem, (_, cmds) in docs.items()])
    _finish([p for stem, (_, cmds) in docs.items()
             for p in _server_and_clients(fed, cmds[0], stem)])
    runs = fed.cwd / "runs"
    for stem, short in (("geomed", "gm"), ("laplace", "lap")):
        models = [final_model(runs / n) for n in (f"{short}-local", f"{short}-launch",
                                                  f"{stem}-server")]
        assert same_arrays(models[0], models[1]) and same_arrays(models[0], models[2]), stem
    rows = (runs / "gm-launch" / "metrics.jsonl").read_text()
    assert '"geomed_shift"' in rows and '"robust_f": 2.0' in rows  # f = ceil(0.2 x 10)
    eps = [json.loads((runs / n / "summary.json").read_text())["dp"]["epsilon"]
           for n in ("lap-local", "lap-launch", "laplace-server")]
    assert eps[0] == eps[1] == eps[2] > 0


def _cmd() -> list[str]:
    from tests.integration.conftest import fednet_cmd

    return fednet_cmd()
