"""docs/extending.md's defense plugin (geomed.py, written from the doc's own code block) under
fednet local, fednet launch and fednet server + fednet clients, with an attack: the same final
model, bit for bit, from the doc's commands at two rounds (issue 58: a new defense in one plugin
file, no file of fednet changed)."""
from __future__ import annotations

import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from tests.harness import final_model, same_arrays

pytestmark = [pytest.mark.net, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _doc() -> tuple[str, list[list[str]]]:
    """The plugin's code and the doc's two commands (local, launch), as written."""
    text = DOC.read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                if b.startswith('"""geomed.py'))
    cmds = [shlex.split(ln)[1:] for ln in re.findall(r"(?m)^fednet \w+ +--plugin geomed\.py.*$",
                                                     text)]
    return code, cmds


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_docs_defense_plugin_gives_one_model_under_every_runtime(fed):
    code, cmds = _doc()
    assert [c[0] for c in cmds] == ["local", "launch"], cmds
    (fed.cwd / "geomed.py").write_text(code)
    short = ["--rounds", "2", "-q"]
    for cmd in cmds:
        got = fed.run(*cmd, *short, timeout=180)
        assert got.returncode == 0, got.stderr[-2000:]
    run_args = cmds[0][1:cmds[0].index("--out")]
    port = _port()
    srv = subprocess.Popen([*_cmd(), "server", *run_args, *short, "--out", "runs/gm-server",
                            "--bind", f"tcp://127.0.0.1:{port}"], env=fed.env, cwd=fed.cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    fed.popens.append(srv)
    cl = fed.run("clients", "--connect", f"tcp://127.0.0.1:{port}", "--ids", "0-9",
                 "--timeout", "60", timeout=180)  # (the plugin comes named in WELCOME)
    out, err = srv.communicate(timeout=180)
    assert srv.returncode == 0 and cl.returncode == 0, (err[-2000:], cl.stderr[-2000:])
    models = [final_model(fed.cwd / "runs" / n) for n in ("gm-local", "gm-launch", "gm-server")]
    assert same_arrays(models[0], models[1]) and same_arrays(models[0], models[2])
    rows = (fed.cwd / "runs" / "gm-launch" / "metrics.jsonl").read_text()
    assert '"geomed_shift"' in rows and '"robust_f": 2.0' in rows  # f = ceil(0.2 x 10)


def _cmd() -> list[str]:
    from tests.integration.conftest import fednet_cmd

    return fednet_cmd()
