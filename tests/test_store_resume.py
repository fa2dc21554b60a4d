"""The clients' store is part of the checkpoint, and --resume checks all of it before anything
runs: every file the checkpoint's manifest names is there, a plain archive (no link followed,
bounded before it is read), of its client, this algorithm and this run, of the round the
manifest names, with the arrays of the algorithm's client state. Anything else is one line
naming the file, and the run folder is left as it was."""
from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fednet.core import state_files as sf
from fednet.core.inproc import run_local
from fednet.errors import ConfigError
from tests.harness import interrupt_in, resume_config, final_model


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A SCAFFOLD run interrupted in round 2 (its checkpoint and store), another run's store,
    and the unbroken run's final model."""
    base = tmp_path_factory.mktemp("store")
    cfg = resume_config("scaffold", base / "run")
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(2))
    run_local(resume_config("scaffold", base / "other"), quiet=True)
    run_local(resume_config("scaffold", base / "ref"), quiet=True)
    return base, cfg


def _copy(broken, tmp_path) -> tuple[Path, object]:
    base, cfg = broken
    out = tmp_path / "run"
    shutil.copytree(base / "run", out, symlinks=True)
    return out, cfg.replace(out=str(out))


def _snapshot(out: Path) -> dict[str, bytes | str]:
    got: dict[str, bytes | str] = {}
    for p in sorted(out.rglob("*")):
        key = str(p.relative_to(out))
        got[key] = (f"-> {os.readlink(p)}" if p.is_symlink() else b"" if p.is_dir()
                    else p.read_bytes())
    return got


def _store(out: Path) -> Path:
    return out / "checkpoint" / "clients"


def test_the_checkpoint_names_every_clients_file_and_an_intact_store_resumes_exactly(broken,
                                                                                       tmp_path):
    out, cfg = _copy(broken, tmp_path)
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["store"] == "manifest" and len(state["lineage"]) == sf.LINEAGE
    with np.load(out / "checkpoint" / "state.npz") as z:
        assert z["store/cids"].tolist() == list(range(cfg.clients)) and set(z["store/rounds"]) == {1}
    run_local(cfg, quiet=True, resume=True)
    a, b = final_model(out), final_model(broken[0] / "ref")
    assert all(np.array_equal(a[k], b[k]) for k in b)


def _bomb(path: Path) -> None:
    """A 1 MiB-ish deflated archive holding a 1 GiB array, tagged as client 1's."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("big.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                     "shape": (1 << 28,)})
            chunk = bytes(1 << 20)
            for _ in range(1 << 10):
                f.write(chunk)
    path.write_bytes(buf.getvalue())


def _retag(path: Path, **tags) -> None:
    arrays, meta = sf.read(path)
    sf.write(path, arrays, {**meta, **tags})


DAMAGE = {
    "another run's file": (lambda s, o: shutil.copy(o / "c0001.npz", s / "c0001.npz"),
                           "the state of another run"),
    "client 2's file": (lambda s, o: shutil.copy(s / "c0002.npz", s / "c0001.npz"),
                        "the state of client 2, not of client 1"),
    "a link to client 2's file": (lambda s, o: (os.remove(s / "c0001.npz"),
                                                os.symlink(s / "c0002.npz", s / "c0001.npz")),
                                  "a symbolic link"),
    "deleted, its older state kept": (lambda s, o: os.remove(s / "c0001.npz"),
                                      "needs client 1's state of round 1, and its files hold "
                                      "round 0 instead"),
    "deleted": (lambda s, o: (os.remove(s / "c0001.npz"), os.remove(s / "c0001.prev.npz")),
                "needs client 1's state of round 1, and its files hold no such state"),
    "a dangling link": (lambda s, o: (os.remove(s / "c0001.npz"),
                                      os.symlink(s / "gone.npz", s / "c0001.npz")),
                        "a symbolic link"),
    "a round tag of 10^9": (lambda s, o: _retag(s / "c0001.npz", round=10**9),
                            "its files hold round 0 instead"),
    "truncated": (lambda s, o: (s / "c0001.npz").write_bytes((s / "c0001.npz").read_bytes()[:500]),
                  "damaged client state"),
    "random bytes": (lambda s, o: (s / "c0001.npz").write_bytes(os.urandom(4000)),
                     "damaged client state"),
    "wrong shapes": (lambda s, o: sf.write(s / "c0001.npz",
                                           {k: np.zeros(3, np.float32) for k in
                                            sf.read(s / "c0001.npz")[0]},
                                           sf.read(s / "c0001.npz")[1]),
                     "has shape (3,)"),
    "float64 values": (lambda s, o: sf.write(s / "c0001.npz",
                                             {k: a.astype(np.float64) if a.dtype.kind == "f"
                                              else a for k, a in
                                              sf.read(s / "c0001.npz")[0].items()},
                                             sf.read(s / "c0001.npz")[1]),
                       "and dtype float64; trainable parameter"),
    "a folder": (lambda s, o: (os.remove(s / "c0001.npz"), os.mkdir(s / "c0001.npz")),
                 "not a regular file"),
    "a compressed 1 GiB array": (lambda s, o: _bomb(s / "c0001.npz"),
                                 "not a stored .npy array"),
    "another algorithm's": (lambda s, o: _retag(s / "c0001.npz", algorithm="feddyn"),
                            "a state of algorithm 'feddyn'"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_store_is_one_line_naming_the_file_and_nothing_changes(case, broken, tmp_path):
    out, cfg = _copy(broken, tmp_path)
    damage, says = DAMAGE[case]
    damage(_store(out), _store(broken[0] / "other"))
    before = _snapshot(out)
    with pytest.raises(ConfigError) as e:
        run_local(cfg, quiet=True, resume=True)
    msg = str(e.value)
    assert "\n" not in msg and "c0001.npz" in msg and says in msg, msg
    assert _snapshot(out) == before


def test_a_file_the_checkpoint_does_not_know_is_refused(broken, tmp_path):
    out, cfg = _copy(broken, tmp_path)
    with np.load(out / "checkpoint" / "state.npz") as z:
        arrays = {k: z[k] for k in z.files}
    keep = arrays["store/cids"] != 1  # as if client 1 had no state at the checkpoint
    arrays["store/cids"], arrays["store/rounds"] = (arrays["store/cids"][keep],
                                                   arrays["store/rounds"][keep])
    np.savez(out / "checkpoint" / "state.npz", **arrays)
    with pytest.raises(ConfigError, match="client 1 has a state of round 1 that the checkpoint "
                                          "does not know"):
        run_local(cfg, quiet=True, resume=True)


def test_a_file_that_goes_bad_during_a_run_is_its_clients_failure_once(tmp_path):
    """Damage found when a client takes its state: its task fails once, naming the file, which
    is moved aside; the client goes on from an earlier state, and the run completes."""

    out = tmp_path / "run"
    cfg = resume_config("scaffold", out).replace(rounds=4)

    def prepare(session) -> None:
        absorb = session.algo.absorb

        def hit(done) -> None:
            absorb(done)
            if done.round == 1 and done.cid == 3:
                (_store(out) / "c0003.npz").write_bytes(b"junk")
        session.algo.absorb = hit
    got = run_local(cfg, quiet=True, prepare=prepare)
    assert got["status"] == "completed" and got["rounds"] == 4
    failures = [f for f in got["failures"] if f["client"] == 3]
    assert len(failures) == 1 and failures[0]["round"] == 2, got["failures"]
    assert "c0003.npz" in failures[0]["reason"] and "moved to c0003.npz.refused" in \
        failures[0]["reason"]
    assert (_store(out) / "c0003.npz.refused").read_bytes() == b"junk"
