"""The example plugin package (examples/fednet-example-plugin: FedNova, tiny_mlp, blobs), installed
with pip, under fednet local, fednet launch (real processes) and fednet server + fednet clients:
the same final model. A client host without the plugin, or with another version, refuses in one
line.

The package is installed with `pip install --no-deps --no-build-isolation --target DIR` (a real
install: wheel built by setuptools, entry points in its dist-info) into a folder that only this
test's processes see (PYTHONPATH). Installed into the interpreter itself, its fednova would join
every other test's list of algorithms (the golden tests pin the built-in ones).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.net, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fednet-example-plugin"
RUN = ["--algo", "fednova", "--dataset", "blobs", "--clients", "6", "--rounds", "3",
       "--partition", "dirichlet", "--momentum", "0.5", "-q"]


def _install(tmp: Path, version: str | None = None) -> Path:
    """pip-install (a copy of) the example into tmp/site; returns that folder."""
    src, site = tmp / "src", tmp / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    if version:
        meta = src / "pyproject.toml"
        meta.write_text(meta.read_text().replace('version = "0.1.0"', f'version = "{version}"'))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
                    str(src)], check=True, capture_output=True, text=True)
    return site


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    import importlib.util

    if importlib.util.find_spec("setuptools") is None:  # .ci/run installs it ([test] extras)
        pytest.fail("the example plugin is built with this interpreter's setuptools "
                    "(pip install -e '.[test]' installs it)")
    return {"0.1.0": _install(tmp_path_factory.mktemp("plugin")),
            "0.2.0": _install(tmp_path_factory.mktemp("plugin2"), "0.2.0")}


def _env(fed, site: Path | None) -> dict[str, str]:
    path = [str(site)] if site else []
    path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(fed.env, PYTHONPATH=os.pathsep.join(path))


def _run(fed, env, *args, timeout=180) -> subprocess.CompletedProcess[str]:
    from tests.integration.conftest import fednet_cmd

    return subprocess.run(fednet_cmd() + list(args), env=env, cwd=fed.cwd, capture_output=True,
                          text=True, timeout=timeout)


def _model(run: Path) -> dict[str, np.ndarray]:
    with np.load(run / "final_model.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_and_clients(fed, server_env, client_env, out: str, extra=()):
    """fednet server and fednet clients (another 'host': its own environment); (server result,
    clients result)."""
    from tests.integration.conftest import fednet_cmd

    port = _port()
    srv = subprocess.Popen(fednet_cmd() + ["server", *RUN, *extra, "--out", out, "--bind",
                                           f"tcp://127.0.0.1:{port}"],
                           env=server_env, cwd=fed.cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    fed.popens.append(srv)
    cl = _run(fed, client_env, "clients", "--connect", f"tcp://127.0.0.1:{port}", "--ids", "0-5",
              "--timeout", "60")
    out_, err = srv.communicate(timeout=120)
    return subprocess.CompletedProcess(srv.args, srv.returncode, out_, err), cl


def test_the_example_plugin_gives_one_model_under_every_runtime(fed, sites):
    env = _env(fed, sites["0.1.0"])
    listed = _run(fed, env, "plugins")
    assert listed.returncode == 0, listed.stderr
    assert ("fednet-example-plugin  0.1.0         algorithm fednova, dataset blobs, "
            "model tiny_mlp") in listed.stdout
    for cmd in ("local", "launch"):
        res = _run(fed, env, cmd, *RUN, "--out", cmd)
        assert res.returncode == 0, res.stderr
    srv, cl = _server_and_clients(fed, env, env, "server")
    assert srv.returncode == 0 and cl.returncode == 0, (srv.stderr, cl.stderr)
    models = [_model(fed.cwd / d) for d in ("local", "launch", "server")]
    assert list(models[0]) == ["1.weight", "1.bias", "3.weight", "3.bias"]  # tiny_mlp
    for m in models[1:]:
        assert all(m[k].tobytes() == models[0][k].tobytes() for k in models[0])
    summaries = [json.loads((fed.cwd / d / "summary.json").read_text())
                 for d in ("local", "launch", "server")]
    assert len({s["final_accuracy"] for s in summaries}) == 1
    assert summaries[0]["final_accuracy"] > 0.3  # 10 classes: it learns
    cfg = (fed.cwd / "launch" / "config.toml").read_text()
    assert 'name = "fednova"' in cfg and 'dataset = "blobs"' in cfg


def test_a_client_host_without_the_plugin_refuses_in_one_line(fed, sites):
    srv, cl = _server_and_clients(fed, _env(fed, sites["0.1.0"]), _env(fed, None), "missing",
                                  ("--register-timeout", "10"))
    assert cl.returncode != 0
    lines = [ln for ln in cl.stderr.splitlines() if ln.startswith("fednet: error:")]
    host = socket.gethostname()
    assert lines == [f"fednet: error: the server's run needs plugin fednet-example-plugin 0.1.0, "
                     f"which {host} does not have; pip install "
                     "'fednet-example-plugin==0.1.0'"], cl.stderr
    assert "Traceback" not in cl.stderr


def test_a_client_host_with_another_version_refuses_in_one_line(fed, sites):
    srv, cl = _server_and_clients(fed, _env(fed, sites["0.1.0"]), _env(fed, sites["0.2.0"]),
                                  "other", ("--register-timeout", "10"))
    lines = [ln for ln in cl.stderr.splitlines() if ln.startswith("fednet: error:")]
    assert lines == [f"fednet: error: plugin fednet-example-plugin is 0.2.0 on "
                     f"{socket.gethostname()} but 0.1.0 on the server; install the same version "
                     "on every host"], cl.stderr


def test_a_plugin_module_reaches_the_zygote(fed, tmp_path):
    """--plugin FILE under fednet launch: the zygote imports it (its algorithm and model are
    there in every forked client) and --config of the run's config.toml imports it again."""
    (tmp_path / "my_plugin.py").write_text(
        "from torch import nn\n"
        "from fednet.algorithms.registry import Spec, register\n"
        "from fednet.models.nets import register_model\n"
        "register(Spec('fedavg_again', 'FedAvg', 'fednet.algorithms.fedavg:FedAvg',\n"
        "              'fednet.algorithms.fedavg:FedAvgClient'))\n"
        "register_model('wide_mlp', lambda k, s: nn.Sequential(nn.Flatten(), nn.Linear(64, 48),\n"
        "                                                      nn.ReLU(), nn.Linear(48, k)))\n")
    small = ["--clients", "3", "--rounds", "2", "--epochs", "1", "-q"]
    env = _env(fed, None)
    a = _run(fed, env, "launch", "--plugin", "my_plugin.py", "--algo", "fedavg_again",
             "--model", "wide_mlp", *small, "--out", "a")
    assert a.returncode == 0, a.stderr
    b = _run(fed, env, "local", "--config", "a/config.toml", "--out", "b", "-q")
    assert b.returncode == 0, b.stderr
    ma, mb = _model(fed.cwd / "a"), _model(fed.cwd / "b")
    assert ma["1.weight"].shape == (48, 64)
    assert all(ma[k].tobytes() == mb[k].tobytes() for k in ma)
