"""A real full disk (a small tmpfs as the results folder; root only): the clients' store falls
back to memory with one warning and marks the states it could not write; whatever cannot be
written leaves the last good files intact (summary.json among them), and the command ends with
one line and exit code 2. A resume then refuses a checkpoint that cannot restore
every client's state, and a run that did not outgrow its disk goes on exactly."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import fednet_cmd

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]
SCAFFOLD = ["--algo", "scaffold", "--clients", "20", "--epochs", "1", "--batch-size", "16",
            "--seed", "3"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A mount of `size` bytes (a fresh tmpfs), unmounted afterwards."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        d = tmp_path / f"disk{len(mounts)}"
        d.mkdir()
        got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                             capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
        mounts.append(d)
        return d
    yield mount
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*fednet_cmd(), "local", *args], capture_output=True, text=True,
                          timeout=600)


def _errors(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if "error" in x.lower() or "Traceback" in x]


def test_a_store_on_a_full_disk_falls_back_to_memory_and_the_run_ends_with_one_line(tiny_disk):
    out = tiny_disk("1m") / "run"
    got = _run(*SCAFFOLD, "--rounds", "4", "--out", str(out))
    assert got.returncode == 2, got.stderr
    errors = _errors(got.stderr)
    assert len(errors) == 1 and errors[0].startswith("fednet: error: cannot write ") and \
        "No space left on device" in errors[0], got.stderr
    assert got.stderr.count("cannot write its state into") == 1  # one warning, not per task
    assert not (out / "summary.json").exists()  # it would describe a model that is not there
    assert "failed" not in got.stderr  # no task failed for want of disk
    marks = sorted(p.name for p in (out / "checkpoint" / "clients").glob("*.unsaved*"))
    assert marks, "the clients whose state is only in memory are marked"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4


def test_a_resume_on_a_full_disk_keeps_the_last_good_checkpoint_and_goes_on_later(tiny_disk,
                                                                                  tmp_path):
    disk = tiny_disk("8m")
    out = disk / "run"
    first = _run(*SCAFFOLD, "--rounds", "2", "--checkpoint-every", "1", "--out", str(out))
    assert first.returncode == 0, first.stderr
    state = (out / "checkpoint" / "state.json").read_bytes()
    npz = (out / "checkpoint" / "state.npz").read_bytes()
    filler = disk / "filler"
    with open(filler, "wb") as f:  # fill the disk but a few KiB
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    os.truncate(filler, max(0, os.path.getsize(filler) - 24 * 1024))
    got = _run("--resume", str(out), "--rounds", "4")
    assert got.returncode == 2, got.stderr
    assert len(_errors(got.stderr)) == 1, got.stderr
    assert (out / "checkpoint" / "state.json").read_bytes() == state  # the last good one
    assert (out / "checkpoint" / "state.npz").read_bytes() == npz
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] in ("completed", "error")
    os.remove(filler)  # room again: the run goes on from its checkpoint, exactly
    again = _run("--resume", str(out), "--rounds", "4")
    assert again.returncode == 0, again.stderr
    ref = _run(*SCAFFOLD, "--rounds", "4", "--out", str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    with np.load(out / "final_model.npz") as a, np.load(tmp_path / "ref" / "final_model.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in b.files)
