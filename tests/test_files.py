"""The results folder as a trust boundary: damaged checkpoints are refused before anything is
written, every output file is replaced atomically, disk errors are one line, --out does not
overwrite a finished run by accident, and the exit code follows the run's status."""
from __future__ import annotations

import errno
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fednet.errors import ConfigError, FednetError
from fednet.core.inproc import run_local
from fednet.metrics.files import OutputError, write_json, write_text
from tests.conftest import small_config
from tests.harness import cli, one_line, snapshot

RUN = ["--clients", "3", "--epochs", "1", "--batch-size", "16", "--seed", "7", "-q"]
ENOSPC = os.strerror(errno.ENOSPC)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round FedAvg run that checkpointed every round."""
    out = tmp_path_factory.mktemp("base") / "run"
    cfg = small_config(rounds=2, net={"checkpoint_every": 1}).replace(out=str(out))
    s = run_local(cfg, quiet=True)
    assert s["status"] == "completed"
    return out


@pytest.fixture
def run(finished, tmp_path, monkeypatch) -> Path:
    """A copy of the finished run in ./run (the test's working directory)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(finished, tmp_path / "run")
    return Path("run")


# ---- damaged checkpoints ------------------------------------------------------------------------
CK = "run/checkpoint"


def _state(run: Path, **change) -> None:
    p = run / "checkpoint" / "state.json"
    s = json.loads(p.read_text())
    for k, v in change.items():
        if v is KeyError:
            s.pop(k)
        else:
            s[k] = v
    p.write_text(json.dumps(s))


def _arrays(run: Path, edit) -> None:
    p = run / "checkpoint" / "state.npz"
    with np.load(p) as z:
        a = {k: z[k] for k in z.files}
    edit(a)
    np.savez(p, **a)


def _first(a: dict) -> str:
    return sorted(k for k in a if k.startswith("model/"))[0]


DAMAGE = [
    ("npz truncated", lambda r: (r / "checkpoint/state.npz").write_bytes(
        (r / "checkpoint/state.npz").read_bytes()[:5000]),
     f"--resume run: {CK}/state.npz: damaged or not an .npz file ("),
    ("npz garbage", lambda r: (r / "checkpoint/state.npz").write_bytes(os.urandom(4096)),
     f"--resume run: {CK}/state.npz: damaged or not an .npz file ("),
    ("npz pickled object", lambda r: _arrays(r, lambda a: a.update(
        {"model/x": np.array([{"a": 1}], dtype=object)})),
     f"--resume run: {CK}/state.npz: damaged or not an .npz file (ValueError: Object arrays "
     "cannot be loaded when allow_pickle=False)"),
    ("npz missing", lambda r: (r / "checkpoint/state.npz").unlink(),
     f"--resume run: {CK}/state.npz: missing"),
    ("json missing", lambda r: (r / "checkpoint/state.json").unlink(),
     f"--resume run: {CK}/state.json: missing"),
    ("json garbage", lambda r: (r / "checkpoint/state.json").write_bytes(b"\xff\xfe{rounds"),
     f"--resume run: {CK}/state.json: not valid JSON ("),
    ("json truncated", lambda r: (r / "checkpoint/state.json").write_text('{"rounds_done": 2, '),
     f"--resume run: {CK}/state.json: not valid JSON ("),
    ("json a list", lambda r: (r / "checkpoint/state.json").write_text("[1, 2]"),
     f"--resume run: {CK}/state.json: not a JSON object"),
    ("no checkpoint", lambda r: shutil.rmtree(r / "checkpoint"),
     "--resume run: no checkpoint there (runs write one with --checkpoint-every N)"),
    ("rounds_done negative", lambda r: _state(r, rounds_done=-1),
     f"--resume run: {CK}/state.json: rounds_done must be a whole number >= 0 (got -1)"),
    ("rounds_done a string", lambda r: _state(r, rounds_done="2"),
     f"--resume run: {CK}/state.json: rounds_done must be a whole number >= 0 (got '2')"),
    ("rounds_done past --rounds", lambda r: _state(r, rounds_done=9),
     f"--resume run: {CK}/state.json: rounds_done is 9, more than --rounds 3 (resume with "
     "--rounds 9 or more)"),
    ("sim_time nan", lambda r: _state(r, sim_time=float("nan")),
     f"--resume run: {CK}/state.json: sim_time must be a finite number >= 0 (got nan)"),
    ("sim_time negative", lambda r: _state(r, sim_time=-1.5),
     f"--resume run: {CK}/state.json: sim_time must be a finite number >= 0 (got -1.5)"),
    ("ledger missing", lambda r: _state(r, ledger=KeyError),
     f"--resume run: {CK}/state.json: the byte ledger is missing"),
    ("ledger value a string", lambda r: _state(r, ledger={**json.loads(
        (r / "checkpoint/state.json").read_text())["ledger"], "control": "12"}),
     f"--resume run: {CK}/state.json: ledger 'control' must be a whole number >= 0"),
    ("ledger key missing", lambda r: _state(r, ledger={"server_to_client": 1}),
     f"--resume run: {CK}/state.json: the byte ledger lacks client_to_client, client_to_server, "
     "control, header_bytes, tensor_bytes"),
    ("ledger key unknown", lambda r: _state(r, ledger={**json.loads(
        (r / "checkpoint/state.json").read_text())["ledger"], "bogus": 1}),
     f"--resume run: {CK}/state.json: the byte ledger has an unknown key 'bogus'"),
    ("other algorithm", lambda r: _state(r, algorithm="scaffold"),
     f"--resume run: {CK}/state.json: a checkpoint of algorithm 'scaffold', this run is 'fedavg'"),
    ("rows negative", lambda r: _state(r, rows=-3),
     f"--resume run: {CK}/state.json: rows must be a whole number >= 0 (got -3)"),
    ("algo state missing", lambda r: _state(r, algo=KeyError),
     f"--resume run: {CK}/state.json: the algorithm's state ('algo') is missing"),
    ("metrics cut short", lambda r: (r / "metrics.jsonl").write_text(
        (r / "metrics.jsonl").read_text().splitlines()[0] + "\n"),
     "--resume run: run/metrics.jsonl: 1 rows, the checkpoint needs its first 2"),
    ("metrics garbage", lambda r: (r / "metrics.jsonl").write_bytes(b"\x00garbage\n" * 3),
     "--resume run: run/metrics.jsonl: its first 2 rows are not all JSON objects"),
    ("metrics missing", lambda r: (r / "metrics.jsonl").unlink(),
     "--resume run: run/metrics.jsonl: missing (the checkpoint keeps its first 2 rows)"),
    # the arrays against what FedAvg's own checkpoint() has (checked in the session)
    ("array wrong shape", lambda r: _arrays(r, lambda a: a.update({_first(a): np.zeros(
        (3,), a[_first(a)].dtype)})),
     f"--resume run: {CK}/state.npz: array 'model/"),
    ("array wrong dtype", lambda r: _arrays(r, lambda a: a.update({_first(a): a[_first(a)].astype(
        np.float64)})), f"--resume run: {CK}/state.npz: array 'model/"),
    ("array missing", lambda r: _arrays(r, lambda a: a.pop(_first(a))),
     f"--resume run: {CK}/state.npz: array 'model/"),
    ("array foreign", lambda r: _arrays(r, lambda a: a.update({"model/bogus": np.zeros(2)})),
     f"--resume run: {CK}/state.npz: array 'model/bogus' does not belong to this model"),
    ("state array foreign", lambda r: _arrays(r, lambda a: a.update({"state/h/x": np.zeros(2)})),
     f"--resume run: {CK}/state.npz: array 'state/h/x' does not belong to this model"),
]


@pytest.mark.parametrize("damage,expected", [(d, e) for _, d, e in DAMAGE],
                         ids=[n for n, _, _ in DAMAGE])
def test_damaged_checkpoint_is_one_line_and_the_folder_stays_byte_identical(run, damage, expected):
    damage(run)
    before = snapshot(run)
    line = one_line(cli("local", "--resume", "run", "--rounds", "3", "-q"))
    assert line == expected or (expected.endswith(("(", "'model/")) and line.startswith(expected)), line
    assert snapshot(run) == before


def test_wrong_shape_names_both_shapes(run):
    with np.load(run / "checkpoint" / "state.npz") as z:
        key = sorted(k for k in z.files if k.startswith("model/"))[0]
        shape = z[key].shape
    _arrays(run, lambda a: a.update({key: np.zeros((3,), np.float32)}))
    line = one_line(cli("local", "--resume", "run", "--rounds", "3", "-q"))
    assert line == f"--resume run: {CK}/state.npz: array '{key}' has shape (3,), the model needs {shape}"


def test_damaged_checkpoint_is_refused_by_the_session_before_it_writes(run):
    """run_local(resume=True) without the CLI: the same checks, nothing written."""
    _arrays(run, lambda a: a.update({_first(a): a[_first(a)][:1]}))
    before = snapshot(run)
    cfg = small_config(rounds=3, net={"checkpoint_every": 1}).replace(out=str(run))
    with pytest.raises(ConfigError, match=r"^--resume run: run/checkpoint/state\.npz: array "):
        run_local(cfg, quiet=True, resume=True)
    assert snapshot(run) == before


def test_crc_damage_inside_the_npz_is_found(run):
    """A flipped byte inside an array member: the zip still opens, the CRC check refuses it."""
    p = run / "checkpoint" / "state.npz"
    with zipfile.ZipFile(p) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    data = bytearray(p.read_bytes())
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2
    data[at] ^= 0xFF
    p.write_bytes(bytes(data))
    before = snapshot(run)
    line = one_line(cli("local", "--resume", "run", "--rounds", "3", "-q"))
    assert line.startswith(f"--resume run: {CK}/state.npz: damaged or not an .npz file (BadZipFile")
    assert snapshot(run) == before


def test_intact_checkpoint_resumes_and_keeps_the_first_rows(run):
    rows = (run / "metrics.jsonl").read_text().splitlines()
    res = cli("local", "--resume", "run", "--rounds", "3", "-q")
    assert res.exit_code == 0, res.stderr
    after = (run / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == rows and len(after) == 3
    assert json.loads((run / "summary.json").read_text())["rounds"] == 3


def test_checkpoint_of_an_older_version_with_fewer_ledger_totals_resumes(run):
    from fednet.core.checkpoint import LEDGER_KEYS

    ledger = json.loads((run / "checkpoint" / "state.json").read_text())["ledger"]
    _state(run, ledger={k: v for k, v in ledger.items() if k in LEDGER_KEYS})
    res = cli("local", "--resume", "run", "--rounds", "3", "-q")
    assert res.exit_code == 0, res.stderr


def test_checkpoint_old_is_used_when_the_writer_died_between_its_renames(run):
    os.replace(run / "checkpoint", run / "checkpoint.old")
    res = cli("local", "--resume", "run", "--rounds", "3", "-q")
    assert res.exit_code == 0, res.stderr
    assert (run / "checkpoint").is_dir() and not (run / "checkpoint.old").exists()


# ---- atomic writes and disk errors --------------------------------------------------------------
def _fail_replace(monkeypatch, name: str, code: int = errno.ENOSPC) -> None:
    real = os.replace

    def fake(src, dst, *a, **kw):
        if Path(dst).name == name:
            raise OSError(code, os.strerror(code))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", fake)


def test_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "summary.json"
    write_json(p, {"status": "completed"})
    good = p.read_bytes()
    _fail_replace(monkeypatch, "summary.json")
    with pytest.raises(OutputError) as e:
        write_json(p, {"status": "other"})
    assert str(e.value) == f"cannot write {p}: {ENOSPC}"
    assert isinstance(e.value, FednetError)
    assert p.read_bytes() == good and sorted(os.listdir(tmp_path)) == ["summary.json"]


def test_atomic_write_error_while_writing(tmp_path, monkeypatch):
    p = tmp_path / "config.toml"
    write_text(p, "a = 1\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match=f"^cannot write {p}: {ENOSPC}$"):
        write_text(p, "a = 2\n")
    assert p.read_text() == "a = 1\n" and os.listdir(tmp_path) == ["config.toml"]


def test_full_disk_at_the_summary_keeps_the_files_written_before(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fail_replace(monkeypatch, "summary.json")
    line = one_line(cli("local", *RUN, "--rounds", "2", "--out", "out"))
    assert line == f"cannot write out/summary.json: {ENOSPC}"
    names = sorted(os.listdir("out"))
    assert names == ["accuracy_vs_bytes.png", "accuracy_vs_round.png", "accuracy_vs_sim_time.png",
                     "clients.jsonl", "config.toml", "final_model.npz", "metrics.jsonl", "run.json"]
    assert len(Path("out/metrics.jsonl").read_text().splitlines()) == 2
    with np.load("out/final_model.npz", allow_pickle=False) as z:
        assert z.files


def test_full_disk_at_the_end_of_a_resume_keeps_the_previous_results(run, monkeypatch):
    before = snapshot(run)
    _fail_replace(monkeypatch, "final_model.npz")
    line = one_line(cli("local", "--resume", "run", "--rounds", "3", "-q"))
    assert line == f"cannot write run/final_model.npz: {ENOSPC}"
    after = snapshot(run)
    for name in ("final_model.npz", "summary.json", "accuracy_vs_round.png"):
        assert after[name] == before[name], name
    assert len(after["metrics.jsonl"].splitlines()) == 3
    assert not [n for n in after if n.endswith(".tmp")]


def test_failed_checkpoint_write_keeps_the_previous_checkpoint(run, monkeypatch):
    before = snapshot(run)
    _fail_replace(monkeypatch, "state.npz", errno.EROFS)
    line = one_line(cli("local", "--resume", "run", "--rounds", "3", "-q"))
    assert line == f"cannot write run/checkpoint.tmp/state.npz: {os.strerror(errno.EROFS)}"
    after = snapshot(run)
    assert {k: v for k, v in after.items() if k.startswith("checkpoint")} == \
        {k: v for k, v in before.items() if k.startswith("checkpoint")}
    assert json.loads(after["summary.json"])["status"] == "error"  # not "running", not "completed"


def test_unwritable_out_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: False if str(p) == "." else real(p, m))
    line = one_line(cli("local", *RUN, "--out", "new/run"))
    assert line in (f"cannot write new/run: {os.strerror(errno.EACCES)}",
                    f"cannot write new/run: {os.strerror(errno.EROFS)}")
    assert not Path("new").exists()


# ---- --out, --overwrite, config.toml ------------------------------------------------------------
def test_out_refuses_a_folder_that_holds_files(run):
    before = snapshot(run)
    line = one_line(cli("local", *RUN, "--rounds", "1", "--out", "run"))
    assert line == ("--out run already holds files; give a new folder, --resume run to continue "
                    "that run, or --overwrite to replace it")
    assert snapshot(run) == before


def test_out_accepts_an_empty_folder_and_overwrite_replaces_a_run(run):
    Path("empty").mkdir()
    assert cli("local", *RUN, "--rounds", "1", "--out", "empty").exit_code == 0
    res = cli("local", *RUN, "--rounds", "1", "--out", "run", "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert not (run / "checkpoint").exists()  # the previous run's checkpoint is gone
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
    assert json.loads((run / "summary.json").read_text())["rounds"] == 1


def test_resume_refuses_overwrite_and_another_out(run):
    assert one_line(cli("local", "--resume", "run", "--overwrite", "-q")) == (
        "--resume and --overwrite do not go together: --resume continues the run in its folder, "
        "--overwrite starts a new one there")
    assert one_line(cli("local", "--resume", "run", "--out", "other", "-q")) == (
        "--resume run continues the run in its own folder; drop --out other")
    Path("plain").mkdir()
    assert one_line(cli("local", "--resume", "plain", "-q")) == (
        "--resume plain: no config.toml there; give the folder of a run that was started with "
        "--checkpoint-every N")


def test_config_of_a_run_does_not_write_back_into_it(run):
    assert "out" not in (run / "config.toml").read_text().split("[")[0]
    before = snapshot(run)
    res = cli("local", "--config", "run/config.toml", "--rounds", "1", "-q")
    assert res.exit_code == 0, res.stderr
    assert snapshot(run) == before
    made = list(Path("runs").iterdir())
    assert len(made) == 1 and made[0].name.endswith("-fedavg")


def test_old_config_with_out_is_read_and_out_comes_only_from_the_command_line(run):
    Path("old.toml").write_text('out = "elsewhere"\n' + (run / "config.toml").read_text())
    res = cli("local", "--config", "old.toml", "--rounds", "1", "--out", "mine", "-q")
    assert res.exit_code == 0, res.stderr
    assert Path("mine/summary.json").is_file() and not Path("elsewhere").exists()
    res = cli("local", "--config", "old.toml", "--rounds", "1", "-q")
    assert res.exit_code == 0, res.stderr
    assert not Path("elsewhere").exists() and len(list(Path("runs").iterdir())) == 1


# ---- exit code follows the status ---------------------------------------------------------------
def test_no_live_clients_is_exit_3_with_one_line(tmp_path, monkeypatch):
    from fednet.core.inproc import InprocDispatcher

    monkeypatch.chdir(tmp_path)
    real = InprocDispatcher.alive_clients
    calls = []

    def dwindling(self):
        calls.append(1)
        return real(self) if len(calls) <= 2 else []  # the setup stage and round 0 see clients

    monkeypatch.setattr(InprocDispatcher, "alive_clients", dwindling)
    res = cli("local", *RUN, "--rounds", "3", "--out", "r")
    assert res.exit_code == 3, res.stderr
    assert res.stderr.splitlines()[-1] == ("fednet: error: no live clients left after round 1; "
                                           "see r/summary.json")
    assert res.stderr.count("fednet: error:") == 1 and "Traceback" not in res.stderr
    assert "no_clients" in res.stdout  # the table is still printed
    assert json.loads(Path("r/summary.json").read_text())["status"] == "no_clients"


def test_a_diverged_run_exits_5_with_one_line(tmp_path, monkeypatch):
    """Issue 23: an aggregate that is not finite stops the run as diverged, exit code 5, one
    line naming the round and what was not finite (summary.json's error)."""
    import fednet.core.verdict as verdict

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(verdict, "finite", lambda arrays: False)
    res = cli("local", *RUN, "--rounds", "3", "--out", "r")
    assert res.exit_code == 5, res.stderr
    s = json.loads(Path("r/summary.json").read_text())
    assert s["status"] == "diverged" and s["rounds"] == 1
    assert s["error"].startswith("round 1: the global model has NaN/inf parameters")
    assert res.stderr.splitlines()[-1] == f"fednet: error: the run diverged: {s['error']}"


def test_report_refuses_a_summary_that_is_not_an_object(run):
    (run / "summary.json").write_text("[1, 2]")
    assert one_line(cli("report", "run")) == "'run/summary.json' is not a run summary (a JSON object)"
    (run / "summary.json").write_bytes(b"\xff\x00")
    assert one_line(cli("report", "run")).startswith("'run/summary.json' is not valid JSON (")


def test_a_resume_that_would_change_the_runs_settings_is_refused(run):
    """Issue 24: `--resume run --lr 0.3` was accepted, trained nothing new, and rewrote
    config.toml; now it is one line naming the setting, and the folder stays as it was. More
    --rounds (and where the processes run) may still be given."""
    before = snapshot(run)
    line = one_line(cli("local", "--resume", "run", "--lr", "0.3", "--seed", "99", "-q"))
    assert line.startswith("--resume continues a run with its own settings, and these options "
                           "would change them (config.toml keys): ")
    assert "train.lr 0.3 (the run has " in line and "seed 99 (the run has " in line
    assert snapshot(run) == before
    for opt, key in (("--compress", "net.compress"), ("--secagg", "net.secagg")):
        value = "int8" if opt == "--compress" else "plus"  # what travels changes the results
        line = one_line(cli("local", "--resume", "run", opt, value, "-q"))
        assert f"{key} '{value}' (the run has " in line, line
        assert snapshot(run) == before
