"""examples/slurm/fednet.sbatch on a real SLURM: a single-node cluster on this machine.

tests/slurm/start_slurm.sh starts munged, slurmctld and slurmd (Debian's slurm-wlm and munge) with
all their state in a temporary folder, and stop_slurm.sh stops them at the end. The job runs the
server as task 0 and the clients as tasks 1 and 2 (`--ids slurm:4`: ids 0-1 and 2-3), so FedSeq's
ring through all 4 clients hands models from one task's clients to the other's. Root only; skipped
where SLURM is not installed (.ci/run installs it when apt can).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import MARKER, describe, jsonl, read_json, wait_gone

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.net]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "slurm" / "fednet.sbatch"
TOOLS = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue",
         "sinfo", "scancel"]
FEDSEQ = ("--epochs 1 --batch-size 16 --latency none --min-samples 1400 --max-clients 4 "
          "--superclient-fraction 1.0 --pretrain-epochs 1")  # one ring through all 4 clients
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment of a running single-node SLURM (SLURM_CONF set); stopped at the end."""
    if os.geteuid() != 0:
        pytest.skip("the test SLURM cluster runs its daemons as root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"SLURM is not installed (missing {', '.join(missing)}); "
                    "apt-get install slurm-wlm munge")
    d = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(["bash", str(ROOT / "tests/slurm/start_slurm.sh"), str(d)],
                           capture_output=True, text=True, timeout=60)
    try:
        assert start.returncode == 0, f"start_slurm.sh failed: {start.stderr}"
        yield dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
    finally:
        subprocess.run(["bash", str(ROOT / "tests/slurm/stop_slurm.sh"), str(d)],
                       capture_output=True, timeout=60)


def job_state(env: dict[str, str], job: str) -> dict[str, str]:
    """`scontrol show job -o JOB` as a dict (JobState, ExitCode, ...)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def submit(env: dict[str, str], cwd: Path, marker: str, *opts: str, **run: str) -> str:
    """sbatch [opts] the example script with the run's variables; returns the job id."""
    fednet = shutil.which("fednet") or f"{sys.executable} -m fednet.cli"
    job_env = dict(env, **{MARKER: marker}, FEDNET=fednet, PYTHONUNBUFFERED="1", **run)
    job_env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run(["sbatch", "--parsable", f"--chdir={cwd}", f"--output={cwd}/job.out",
                          *opts, str(SCRIPT)], env=job_env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def wait_job(env: dict[str, str], job: str, timeout_s: float = 240) -> dict[str, str]:
    """Poll until the job has ended (sbatch --wait polls only every 2, 8, 32 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = job_state(env, job)
        if st.get("JobState") in ENDED:
            return st
        time.sleep(0.25)
    subprocess.run(["scancel", job], env=env, timeout=30)
    pytest.fail(f"job {job} did not end within {timeout_s}s: {job_state(env, job)}")


def test_fedseq_job_hands_models_across_tasks(slurm, tmp_path):
    marker = os.urandom(8).hex()
    t0 = time.monotonic()
    job = submit(slurm, tmp_path, marker, ALGO="fedseq", CLIENTS="4", ROUNDS="3",
                 OUT=str(tmp_path / "run"), SERVER_OPTS=FEDSEQ)
    st = wait_job(slurm, job)
    took = time.monotonic() - t0
    out = (tmp_path / "job.out").read_text()
    assert (st["JobState"], st["ExitCode"]) == ("COMPLETED", "0:0"), (st, out)
    assert "Traceback" not in out, out
    # task 0 is the server; tasks 1 and 2 each ran 2 clients, on the CPU (no GPU allocated)
    for task in (1, 2):
        assert f"{task}: fednet.sbatch: task {task} on localhost: clients --ids slurm:4 on CPUs" \
            in out, out
        assert f"{task}: started 2 clients (2 processes) connecting to tcp://localhost:" in out, out
    assert "0: server listening on tcp://0.0.0.0:" in out, out
    s = read_json(tmp_path / "run" / "summary.json")
    assert (s["status"], s["clients"], s["rounds"], s["failures"]) == ("completed", 4, 3, []), s
    assert s["runtime"] == "server"
    # one ring through all 4 clients spans both client tasks: some hand-off crossed between them
    assert s["bytes"]["client_to_client"] > 0, s["bytes"]
    assert [r["client"] for r in jsonl(tmp_path / "run" / "clients.jsonl")] == [0, 1, 2, 3]
    left = wait_gone(marker, 10.0)
    assert not left, f"processes left behind: {describe(left)}"
    print(f"\n[slurm fedseq] job {job}: submit to end {took:.1f}s, training wall_clock_s="
          f"{s['wall_clock_s']:.2f}, ready_s={s['ready_s']:.1f}, bytes {s['bytes']}")


def test_gpu_binding_follows_the_allocation(slurm, tmp_path):
    """sbatch --gpus-per-task=1 on the cluster's 4 fake GPUs: SLURM gives each task its own
    CUDA_VISIBLE_DEVICES, the script turns it into `--gpus 0`, and fednet then looks for CUDA
    (there is none behind the fake devices, so the clients stop with one line and the server,
    left without clients, ends the job)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a real CUDA device is visible; the fake GPUs of the test cluster would mix")
    marker = os.urandom(8).hex()
    job = submit(slurm, tmp_path, marker, "--gpus-per-task=1", CLIENTS="4", ROUNDS="1",
                 OUT=str(tmp_path / "run"), SERVER_OPTS="--register-timeout 3")
    st = wait_job(slurm, job)
    out = (tmp_path / "job.out").read_text()
    devices = {}
    for task in (1, 2):
        line = next((x for x in out.splitlines()
                     if x.startswith(f"{task}: fednet.sbatch: task {task} on localhost:")), "")
        assert line.endswith("(--gpus 0)"), out
        devices[task] = line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0]
        assert f"{task}: fednet: error: --gpus 0: no CUDA device is visible" in out, out
    assert len(set(devices.values())) == 2, devices  # each task its own device
    assert "fednet.sbatch: the server exited with code" in out, out
    assert st["JobState"] == "FAILED", (st, out)
    assert read_json(tmp_path / "run" / "summary.json")["status"] == "registration_timeout"
    left = wait_gone(marker, 10.0)
    assert not left, f"processes left behind: {describe(left)}"
