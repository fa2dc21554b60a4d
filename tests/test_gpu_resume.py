"""Resume of a run whose client state is on CUDA (issue 27): SCAFFOLD's control variate c_k and
FedDyn's gradient state live on the client's device. A run stopped after a checkpoint and resumed
ends where an unbroken run on the same device ends, both in one process (`fednet local`: the
state goes into RUN/checkpoint) and through `fednet launch --gpus 0` killed without a word (the
client processes keep their state in RUN/checkpoint/clients/). Modelled on
tests/test_resume_algorithms.py and tests/integration/test_resume.py.

Only on CUDA (`pytest -m gpu`; benchmarks/gpu_check.py runs them on a lent device). Two runs on
one GPU may differ in the last bits (cuDNN's kernels are not all deterministic): models are
compared with a tolerance, byte totals and simulated time exactly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import small_config
from tests.harness import BYTE_KEYS as KEYS
from tests.harness import Stop, golden, stop_after

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

STOP = 2
RTOL, ATOL = 1e-3, 1e-4


def _config(algo: str, out: Path, gpus=(0,)):
    return small_config(rounds=4, gpus=list(gpus), algo={"name": algo},
                        net={"checkpoint_every": 1}, out=str(out))


def _state_tensors(obj, out: list) -> list:
    """Every torch tensor inside a client's state (dataclass fields, dicts, lists, tuples)."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _state_tensors(getattr(obj, f.name), out)
    elif isinstance(obj, dict):
        for v in obj.values():
            _state_tensors(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _state_tensors(v, out)
    return out


def _local(cfg, **kw):
    """(summary, final model, the clients' state tensors) of a fednet local run, or None when
    it was stopped."""
    from fednet.core.inproc import run_local

    with golden.capture_dispatcher() as seen:
        try:
            summary = run_local(cfg, quiet=True, **kw)
        except Stop:
            return None
    with np.load(Path(cfg.out) / "final_model.npz", allow_pickle=False) as z:
        model = {k: z[k] for k in z.files}
    state = {cid: _state_tensors(ex.ctx.state, []) for cid, ex in seen[0].executors.items()}
    return summary, model, state


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.allclose(a[k], b[k], rtol=RTOL, atol=ATOL) for k in a)


@pytest.mark.parametrize("algo", ["scaffold", "feddyn"])
def test_a_local_run_with_client_state_on_cuda_resumes(algo, tmp_path):
    ref, ref_model, ref_state = _local(_config(algo, tmp_path / "ref"))
    assert set(ref["devices"]) == {"cuda:0"}
    assert any(t.is_cuda for ts in ref_state.values() for t in ts), "client state on CUDA"
    cfg = _config(algo, tmp_path / "run")
    assert _local(cfg, prepare=stop_after(STOP)) is None
    saved = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())
    assert saved["rounds_done"] == STOP and saved["client_state"] == "checkpoint"
    got, model, state = _local(cfg, resume=True)
    assert got["status"] == "completed" and got["rounds"] == ref["rounds"] == 4
    assert set(got["devices"]) == {"cuda:0"}
    tensors = [t for ts in state.values() for t in ts]
    assert tensors and all(t.is_cuda for t in tensors), "resumed client state back on CUDA"
    assert state.keys() == ref_state.keys()
    for cid in state:
        assert len(state[cid]) == len(ref_state[cid])
        for a, b in zip(state[cid], ref_state[cid]):
            assert torch.allclose(a, b, rtol=RTOL, atol=ATOL), f"client {cid}'s state"
    assert _close(model, ref_model), "final model"
    assert {k: got["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}
    assert got["sim_time_s"] == pytest.approx(ref["sim_time_s"], rel=1e-12)
    assert got["final_accuracy"] == pytest.approx(ref["final_accuracy"], abs=0.02)


ARGS = ["--clients", "3", "--rounds", "6", "--epochs", "1", "--batch-size", "16", "--lr", "0.1",
        "--seed", "7", "--latency", "lan", "--gpus", "0", "-q"]


def _fednet(*args: str) -> list[str]:
    """This checkout's command line (not a `fednet` script another install may have put on
    PATH: the device machine runs a copy of the working tree)."""
    return [sys.executable, "-m", "fednet.cli", *args]


def _kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and every descendant (the zygote has its own
    session)."""
    import psutil

    try:
        kids = psutil.Process(p.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass
    p.wait(timeout=30)
    psutil.wait_procs(kids, timeout=30)


@pytest.mark.net
@pytest.mark.slow
def test_a_killed_gpu_launch_with_client_state_on_cuda_resumes(tmp_path):
    """SCAFFOLD through `fednet launch --gpus 0`: the launcher is SIGKILLed after a checkpoint;
    `--resume` starts new client processes, which take c_k back from their files onto CUDA."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    same = ["--algo", "scaffold", "--scaffold-option", "2", "--checkpoint-every", "2"]
    ref = subprocess.run(_fednet("launch", *ARGS, *same, "--out", str(tmp_path / "ref")),
                         env=env, capture_output=True, text=True, timeout=240)
    assert ref.returncode == 0, ref.stderr[-3000:]
    s_ref = json.loads((tmp_path / "ref" / "summary.json").read_text())
    assert set(s_ref["devices"]) == {"cuda:0"}
    run = tmp_path / "run"
    p = subprocess.Popen(_fednet("launch", *ARGS, *same, "--out", str(run)), env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    metrics = run / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # the round-2 checkpoint and one more round
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3 \
                    and (run / "checkpoint" / "state.json").exists():
                break
            if p.poll() is not None:
                break
            time.sleep(0.05)
    finally:
        _kill_tree(p)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    if state["rounds_done"] == 6:
        pytest.skip("the run finished before it could be killed")
    assert state["rounds_done"] in (2, 4)
    files = sorted(f.name for f in (run / "checkpoint" / "clients").glob("*.npz"))
    assert all(f"c000{i}.npz" in files or f"c000{i}.prev.npz" in files for i in range(3)), files
    res = subprocess.run(_fednet("launch", "--resume", str(run), "-q"), env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["rounds"] == 6
    assert set(s["devices"]) == {"cuda:0"}
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(6))
    with np.load(run / "final_model.npz") as a, np.load(tmp_path / "ref" / "final_model.npz") as b:
        assert _close({k: a[k] for k in a.files}, {k: b[k] for k in b.files}), "final model"
    assert {k: s["bytes"][k] for k in KEYS} == {k: s_ref["bytes"][k] for k in KEYS}
    assert s["sim_time_s"] == pytest.approx(s_ref["sim_time_s"], rel=1e-12)
    assert s["final_accuracy"] == pytest.approx(s_ref["final_accuracy"], abs=0.02)
