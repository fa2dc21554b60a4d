"""Real disk errors through the `fednet` command: a full tmpfs and a read-only bind mount (root
only; skipped where mounting is not allowed). Each is one line, exit 2, and keeps what was there."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import SMALL, error_line, jsonl, read_json

pytestmark = pytest.mark.slow


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture
def tiny_disk(tmp_path):
    """A 32 KiB tmpfs at ./disk: room for config.toml and metrics.jsonl, not for the model."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or not _mount("-t", "tmpfs", "-o", "size=32k", "tmpfs", str(disk)):
        pytest.skip("needs root and mount -t tmpfs")
    yield disk
    _umount(disk)


@pytest.fixture
def read_only(tmp_path):
    """./ro: a read-only bind mount of ./src."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    if os.geteuid() != 0 or not _mount("--bind", str(src), str(ro)):
        pytest.skip("needs root and bind mounts")
    if not _mount("-o", "remount,bind,ro", str(ro)):
        _umount(ro)
        pytest.skip("cannot remount read-only")
    yield src, ro
    _umount(ro)


def test_full_disk_is_one_line_and_keeps_the_files_written_before(fed, tiny_disk):
    res = fed.run("local", *SMALL, "--out", "disk/run")
    line = error_line(res)
    assert line == "cannot write disk/run/final_model.npz: No space left on device"
    run = tiny_disk / "run"
    assert sorted(os.listdir(run)) == ["clients.jsonl", "config.toml", "metrics.jsonl", "run.json"]
    assert [r["round"] for r in jsonl(run / "metrics.jsonl")] == [0, 1]


def test_full_disk_at_the_first_file_is_one_line(fed, tiny_disk):
    (tiny_disk / "filler").write_bytes(b"\0" * (32 * 1024 - 4096))  # one page left
    (tiny_disk / "filler2").write_bytes(b"\0" * 4096)
    res = fed.run("local", *SMALL, "--out", "disk/run")
    assert error_line(res) in ("cannot write disk/run: No space left on device",
                               "cannot write disk/run/config.toml: No space left on device")


def test_read_only_out_and_resume_are_one_line_and_nothing_changes(fed, tmp_path, read_only):
    src, ro = read_only
    res = fed.run("local", *SMALL, "--checkpoint-every", "1", "--out", "done")
    assert res.returncode == 0, res.stderr
    subprocess.run(["mount", "-o", "remount,bind,rw", str(ro)], check=True)
    shutil.copytree(tmp_path / "done", ro / "run")
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
    before = _snapshot(ro / "run")
    assert error_line(fed.run("local", *SMALL, "--out", "ro/new")) == \
        "cannot write ro/new: Read-only file system"
    assert error_line(fed.run("local", "--resume", "ro/run", "--rounds", "3", "-q")) == \
        "cannot write ro/run: Read-only file system"
    assert error_line(fed.run("launch", *SMALL, "--out", "ro/new")) == \
        "cannot write ro/new: Read-only file system"
    assert _snapshot(ro / "run") == before and not (src / "new").exists()
    assert read_json(ro / "run" / "summary.json")["status"] == "completed"


@pytest.mark.net
def test_launch_refuses_a_damaged_checkpoint_and_leaves_the_folder_as_it_was(fed, tmp_path):
    """The file checks come before any process starts; the array checks in the session, after
    the zygote started: either way one line, exit 2, no process left, the folder unchanged."""
    import json

    import numpy as np

    res = fed.run("local", *SMALL, "--checkpoint-every", "1", "--out", "run")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "run"
    state = run / "checkpoint" / "state.json"
    good = state.read_bytes()
    state.write_text(json.dumps({**json.loads(good), "rounds_done": -2}))
    before = _snapshot(run)
    assert error_line(fed.run("launch", "--resume", "run", "--rounds", "3", "-q")) == \
        "--resume run: run/checkpoint/state.json: rounds_done must be a whole number >= 0 (got -2)"
    assert _snapshot(run) == before
    state.write_bytes(good)
    npz = run / "checkpoint" / "state.npz"
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    key = sorted(k for k in arrays if k.startswith("model/"))[-1]
    arrays[key] = arrays[key].astype(np.float16)
    np.savez(npz, **arrays)
    before = _snapshot(run)
    line = error_line(fed.run("launch", "--resume", "run", "--rounds", "3", "-q"))
    assert line == (f"--resume run: run/checkpoint/state.npz: array '{key}' has dtype float16, "
                    "the model needs float32")
    assert _snapshot(run) == before and not (run / "logs").exists()
