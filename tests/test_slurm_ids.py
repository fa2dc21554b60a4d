"""`fednet clients --ids slurm:N`: this SLURM task's share of the client ids (task 0 is the server)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fednet.errors import ConfigError
from fednet.launch.local_clients import parse_ids


def share(n: int, task: int, tasks: int) -> list[int]:
    return parse_ids(f"slurm:{n}", {"SLURM_PROCID": str(task), "SLURM_NTASKS": str(tasks)})


@pytest.mark.parametrize("n,tasks", [(4, 3), (100, 3), (7, 4), (5, 6), (1, 2), (1000, 9)])
def test_tasks_split_every_id_once_in_contiguous_blocks(n, tasks):
    parts = [share(n, t, tasks) for t in range(1, tasks)]
    assert [i for p in parts for i in p] == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert all(p == list(range(p[0], p[-1] + 1)) for p in parts)


def test_examples():
    assert share(4, 1, 3) == [0, 1] and share(4, 2, 3) == [2, 3]
    assert share(100, 1, 3) == list(range(50)) and share(100, 2, 3) == list(range(50, 100))
    assert parse_ids(" SLURM:3 ", {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) == [0, 1, 2]


@pytest.mark.parametrize("text,env,says", [
    ("slurm", {"SLURM_PROCID": "1", "SLURM_NTASKS": "3"}, "write slurm:N"),
    ("slurm:x", {"SLURM_PROCID": "1", "SLURM_NTASKS": "3"}, "write slurm:N"),
    ("slurm:0", {"SLURM_PROCID": "1", "SLURM_NTASKS": "3"}, "write slurm:N"),
    ("slurm:4", {}, "SLURM_PROCID and SLURM_NTASKS are not set"),
    ("slurm:4", {"SLURM_PROCID": "0", "SLURM_NTASKS": "3"}, "task 0, which runs `fednet server`"),
    ("slurm:4", {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, "needs at least 2 tasks"),
    ("slurm:4", {"SLURM_PROCID": "3", "SLURM_NTASKS": "3"}, "needs at least 2 tasks"),
    ("slurm:2", {"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, "ask for at most 3 tasks"),
])
def test_errors_are_one_line_naming_the_option(text, env, says):
    with pytest.raises(ConfigError) as e:
        parse_ids(text, env)
    msg = str(e.value)
    assert msg.startswith(f"--ids {text.strip()}") and says in msg and "\n" not in msg, msg


def test_cli_outside_slurm_fails_with_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run([sys.executable, "-m", "fednet.cli", "clients", "--connect",
                          "tcp://127.0.0.1:9", "--ids", "slurm:4"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == [
        "fednet: error: --ids slurm:4: SLURM_PROCID and SLURM_NTASKS are not set; run it as a "
        "task of srun (or give the ids, e.g. --ids 0-49)"], res.stderr
