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
from fednet.core.boundary import Clock
from fednet.core.participants import Participants
from tests.conftest import small_config


R1, R2, OTHER = "a" * 16 + "1" * 16, "a" * 16 + "2" * 16, "b" * 16 + "1" * 16
"""Two sessions of one run (their ids share the lineage, state_files.lineage) and another run."""


def _state(x: float) -> dict[str, np.ndarray]:
    return {"x": np.full(2, x)}


def _x(got) -> float | None:
    return None if got is None else float(got[0]["x"][0])


def test_a_session_takes_its_own_latest_state_and_a_resumed_one_the_newest_before_ckpt(tmp_path):
    store = sf.StateStore(str(tmp_path), "scaffold")
    assert store.take(7, R1, 0) is None                   # the first task of a fresh run
    store.put(7, 0, R1, 0, _state(0), {})
    assert _x(store.take(7, R1, 0)) == 0.0                # this session's own file
    store.put(7, 1, R1, 0, _state(1), {})
    store.put(7, 2, R1, 2, _state(2), {})                 # the server checkpointed 2 rounds
    store.put(7, 3, R1, 2, _state(3), {})
    assert _x(store.take(7, R1, 2)) == 3.0
    home = tmp_path / "checkpoint" / "clients"
    assert sorted(p.name for p in home.iterdir()) == ["c0007.npz", "c0007.prev.npz"]
    for ckpt, want in ((2, 1.0), (4, 3.0), (1, None)):        # a restarted server resumes at ckpt
        got = sf.StateStore(str(tmp_path), "scaffold").take(7, R2, ckpt)
        assert _x(got) == want                                # round 0 was overwritten: initial
        if got is not None:
            assert got[1]["round"] == want and got[1]["run"] == R1


def test_files_of_another_run_in_the_folder_are_never_taken_without_a_checkpoint(tmp_path):
    store = sf.StateStore(str(tmp_path), "scaffold")
    store.put(4, 5, OTHER, None, _state(5), {})
    assert store.take(4, R1, None) is None and store.take(4, R1, 0) is None
    store.put(4, 0, R1, None, _state(9), {})               # no checkpoints: no prev file kept
    assert _x(store.take(4, R1, None)) == 9.0
    assert not (tmp_path / "checkpoint" / "clients" / "c0004.prev.npz").exists()


def test_a_damaged_client_file_is_an_error_naming_it(tmp_path):
    store = sf.StateStore(str(tmp_path), "fedfomo")
    store.put(3, 0, R1, None, _state(0), {})
    p = tmp_path / "checkpoint" / "clients" / "c0003.npz"
    p.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="c0003.npz: damaged client state"):
        sf.StateStore(str(tmp_path), "fedfomo").take(3, R2, 1)
    store.put(3, 1, R1, 1, _state(1), {})                 # a damaged file is overwritten
    assert _x(store.take(3, R1, 1)) == 1.0


def _save(out: Path, rounds_done: int) -> None:
    cfg = small_config()
    algo = SimpleNamespace(state=ServerState(model={"w": np.zeros(2, np.float32)}), cfg=cfg)
    driver = SimpleNamespace(rounds_done=rounds_done, sim_time=1.0, ledger=Ledger(), failures=[],
                             setup_stats={}, history=SimpleNamespace(rows=[]),
                             participants=Participants(), clock=Clock(planned=rounds_done))
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


def _local(algo: str, out: Path, **kw):
    from fednet.core.inproc import run_local
    from tests.harness import golden

    with golden.capture_dispatcher() as seen:
        summary = run_local(small_config(clients=4, rounds=3, algo={"name": algo},
                                         out=str(out), **kw), quiet=True)
    with np.load(out / "final_model.npz") as z:
        return summary, {k: z[k] for k in z.files}, seen[0].executors


@pytest.mark.parametrize("algo", ["scaffold", "factorized"])
def test_stateful_clients_live_in_the_store_and_a_store_that_cannot_be_written_loses_nothing(
        algo, tmp_path, monkeypatch):
    """Between tasks a stateful client is its file in RUN/checkpoint/clients, not an object;
    when the store cannot be written (a full disk) the clients keep their objects instead, with
    one warning, and the run ends exactly where it ends with the store."""
    s1, m1, exs = _local(algo, tmp_path / "store")
    assert exs.built == {}  # no client object survived its task
    files = sorted(p.name for p in (tmp_path / "store" / "checkpoint" / "clients").iterdir())
    # each client's latest state, and the one from before the last round (where a Ctrl-C would
    # checkpoint: every task carries ckpt, the step's start)
    assert files == sorted([f"c000{i}.npz" for i in range(4)]
                           + [f"c000{i}.prev.npz" for i in range(4)])
    _, prev = sf.read(tmp_path / "store" / "checkpoint" / "clients" / "c0002.prev.npz")
    assert prev["round"] == 1
    _, meta = sf.read(tmp_path / "store" / "checkpoint" / "clients" / "c0002.npz")
    assert meta["round"] == 2 and meta["run"] == s1["run_id"] and meta["algorithm"] == algo

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(sf.StateStore, "put", full)
    monkeypatch.setattr("fednet.core.executor._STORE_WARNED", False)
    s2, m2, exs = _local(algo, tmp_path / "full")
    assert sorted(exs.built) == [0, 1, 2, 3]  # the objects hold the state now
    assert m1.keys() == m2.keys() and all(np.array_equal(m1[k], m2[k]) for k in m1)
    assert s1["final_accuracy"] == s2["final_accuracy"]
