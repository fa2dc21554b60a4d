"""The clients' own state files (fednet launch --resume) and the checkpoint swap that carries them."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fednet.algorithms.contract import ServerState
from fednet.core import state_files as sf
from fednet.metrics.accounting import Ledger
from fednet.core import checkpoint
from tests.conftest import small_config


def _state(x: float) -> dict[str, np.ndarray]:
    return {"x": np.full(2, x)}


def test_the_newest_state_before_the_resumed_checkpoint_is_taken_back(tmp_path):
    files = sf.StateFiles(str(tmp_path), 7, "scaffold")
    got: list = []
    files.before(0, "run1", lambda a, m: got.append(a))       # the first task of a fresh run
    files.after(0, _state(0), {})
    files.before(0, "run1", got.append)
    files.after(1, _state(1), {})
    files.before(2, "run1", got.append)                       # the server checkpointed 2 rounds
    files.after(2, _state(2), {})
    files.before(2, "run1", got.append)
    files.after(3, _state(3), {})
    assert got == []                                          # one session: nothing re-read
    home = tmp_path / "checkpoint" / "clients"
    assert sorted(p.name for p in home.iterdir()) == ["c0007.npz", "c0007.prev.npz"]
    for ckpt, want in ((2, 1.0), (4, 3.0), (1, 0.0)):         # a restarted server resumes at ckpt
        again = sf.StateFiles(str(tmp_path), 7, "scaffold")
        seen: list = []
        again.before(ckpt, "run2", lambda a, m: seen.append((a, m)))
        if want == 0.0:  # round 0 was overwritten: only rounds 1 and 3 are kept
            assert seen == [(None, None)]
        else:
            assert seen[0][0]["x"][0] == want and seen[0][1]["round"] == want


def test_a_damaged_client_file_is_an_error_naming_it(tmp_path):
    files = sf.StateFiles(str(tmp_path), 3, "fedfomo")
    files.after(0, _state(0), {})
    p = tmp_path / "checkpoint" / "clients" / "c0003.npz"
    p.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="c0003.npz: damaged client state"):
        sf.StateFiles(str(tmp_path), 3, "fedfomo").before(1, "run2", lambda a, m: None)


def _save(out: Path, rounds_done: int) -> None:
    cfg = small_config()
    algo = SimpleNamespace(state=ServerState(model={"w": np.zeros(2, np.float32)}), cfg=cfg)
    driver = SimpleNamespace(rounds_done=rounds_done, sim_time=1.0, ledger=Ledger(), failures=[],
                             setup_stats={}, history=SimpleNamespace(rows=[]))
    checkpoint.save(out, algo, driver)


def test_the_server_checkpoint_swap_keeps_the_clients_files(tmp_path):
    sf.write(sf.home(tmp_path) / "c0001.npz", _state(1), {"round": 0})  # before any checkpoint
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    ck = tmp_path / "checkpoint"
    assert sorted(p.name for p in ck.iterdir()) == ["clients", "state.json", "state.npz"]
    assert (ck / "clients" / "c0001.npz").is_file()
    assert not (tmp_path / "checkpoint.old").exists() and not (tmp_path / "checkpoint.tmp").exists()
    # a crash between the swap's renames left a client's file in checkpoint.old: found, then gathered
    old = tmp_path / "checkpoint.old" / "clients"
    old.mkdir(parents=True)
    (ck / "clients" / "c0001.npz").rename(old / "c0001.npz")
    assert sf.find(tmp_path, "c0001.npz") == old / "c0001.npz"
    _save(tmp_path, 3)
    assert sf.find(tmp_path, "c0001.npz") == ck / "clients" / "c0001.npz"
    assert not (tmp_path / "checkpoint.old").exists()
