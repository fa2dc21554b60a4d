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
