"""--resume checks the values of the privacy and robust state, not only their shapes (issue 53,
item 5): differential privacy's events add up to the rounds done and are of the run's mechanism
and noise, the tasks per client are those the checkpoint's participants record, the clip norm is
the run's (or what adaptive clipping's last row gives), every floating state array of every
algorithm is finite, and FedOpt's second moment is positive. A damaged state is one line, exit
2, and the folder is left as it was; the epsilon a resumed run reports is never below the
truth."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fednet.core import state_files
from fednet.core.inproc import run_local
from tests.conftest import small_config
from tests.harness import cli, one_line, snapshot

CENTRAL = {"mode": "central", "noise": 1.0, "clip": 0.5}
BASES: dict[str, dict] = {
    "central": {"dp": CENTRAL},
    "fixed": {"dp": {**CENTRAL, "sampling": "fixed"}, "algo": {"fraction": 0.5}},
    "adaptive": {"dp": {**CENTRAL, "adaptive": True, "count_noise": 1.0},
                 "algo": {"name": "fedadam"}},
    "local": {"dp": {"mode": "local", "noise": 0.05, "sgd_noise": 1.0}},
    "clip": {"defense": {"name": "centered_clip"}, "algo": {"name": "fedavgm"}},
    "scaffold": {"algo": {"name": "scaffold"}},
    "feddyn": {"algo": {"name": "feddyn"}},
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Callable[[str], Path]:
    """Each base run (6 clients, 3 rounds, a checkpoint every round), made when first asked."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            out = tmp_path_factory.mktemp(name) / "run"
            cfg = small_config(clients=6, rounds=3, net={"checkpoint_every": 1}, out=str(out),
                               **BASES[name])
            assert run_local(cfg, quiet=True)["status"] == "completed"
            made[name] = out
        return made[name]
    return get


def _json(run: Path, edit: Callable[[dict], None]) -> None:
    p = run / "checkpoint" / "state.json"
    s = json.loads(p.read_text())
    edit(s)
    p.write_text(json.dumps(s))


def _npz(run: Path, edit: Callable[[dict], None]) -> None:
    p = run / "checkpoint" / "state.npz"
    with np.load(p) as z:
        a = {k: z[k] for k in z.files}
    edit(a)
    np.savez(p, **a)


def _dp(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    return lambda run: _json(run, lambda s: edit(s["algo"]["dp"]))


def _set(key: str, value) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


def _first(prefix: str, change: Callable[[np.ndarray], None]) -> Callable[[Path], None]:
    """The first array under prefix changed in place."""
    def edit(a: dict) -> None:
        change(a[sorted(k for k in a if k.startswith(prefix))[0]])
    return lambda run: _npz(run, edit)


def _flat0(v: float) -> Callable[[np.ndarray], None]:
    return lambda x: x.flat.__setitem__(0, v)


def _row_epsilon(run: Path) -> None:
    """The last row says a larger epsilon than the checkpoint's events give."""
    p = run / "metrics.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    rows[-1]["epsilon"] *= 2
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _store_nan(run: Path) -> None:
    """A SCAFFOLD client's control variate in the clients' store made NaN."""
    path = sorted((run / "checkpoint" / "clients").glob("*.npz"))[0]
    arrays, meta = state_files.read(path)
    key = sorted(k for k in arrays if arrays[k].dtype.kind == "f")[0]
    arrays[key] = np.full_like(arrays[key], np.nan)
    state_files.write(path, arrays, meta)


JS, NPZ = "checkpoint/state.json: ", "checkpoint/state.npz: "
POISSON = ["poisson", 1.0, 1.0]
DAMAGE = [
    # central DP's events: as many as the rounds done, of this run's mechanism and noise
    ("fewer events", "central", _dp(_set("events", [[POISSON, 1]])),
     JS + "algo.dp.events account for 1 rounds, the checkpoint has done 3"),
    ("more events", "central", _dp(_set("events", [[POISSON, 5]])),
     JS + "algo.dp.events account for 5 rounds, the checkpoint has done 3"),
    ("no events", "central", _dp(_set("events", [])),
     JS + "algo.dp.events account for 0 rounds"),
    ("recorded noise", "central", _dp(_set("events", [[["poisson", 1.0, 2.0], 3]])),
     JS + "algo.dp.events holds ['poisson', 1.0, 2.0], not an event of this run's mechanism "
     "and noise (['poisson', 1.0, 1.0])"),
    ("recorded rate", "central", _dp(_set("events", [[["poisson", 0.5, 1.0], 3]])),
     JS + "algo.dp.events holds ['poisson', 0.5, 1.0], not an event"),
    ("local DP's event", "central", _dp(_set("events", [[["gaussian", 0.5], 3]])),
     JS + "algo.dp.events holds ['gaussian', 0.5], not an event"),
    ("fixed-size event", "central", _dp(_set("events", [[["fixed", 6, 6, 0.5], 3]])),
     JS + "algo.dp.events holds ['fixed', 6, 6, 0.5], not an event"),
    ("split events", "central", _dp(_set("events", [[POISSON, 2], [["poisson", 1.0, 9.0], 1]])),
     JS + "algo.dp.events holds ['poisson', 1.0, 9.0]"),
    ("event count 0", "central", _dp(_set("events", [[POISSON, 3], [POISSON, 0]])),
     JS + "algo.dp.events must be a list of [event, count >= 1] pairs"),
    ("fixed cohort", "fixed", _dp(_set("events", [[["fixed", 6, 2, 0.5], 3]])),
     JS + "algo.dp.events holds ['fixed', 6, 2, 0.5], not an event"),
    ("fixed population", "fixed", _dp(_set("events", [[["fixed", 7, 3, 0.5], 3]])),
     JS + "algo.dp.events holds ['fixed', 7, 3, 0.5], not an event"),
    ("row's epsilon above the events'", "central", _row_epsilon,
     JS + "the accountant's record gives epsilon "),
    ("counts under central DP", "central",
     lambda r: _npz(r, lambda a: a.__setitem__("state/dp_counts", np.zeros(6, np.int64))),
     NPZ + "array 'state/dp_counts': only --dp local and DP-SGD count tasks per client"),
    # clip norms
    ("clip not --dp-clip", "central", _dp(_set("clip", 2.0)),
     JS + "algo.dp.clip is 2, the run's clip norm is 0.5: --dp-clip 0.5"),
    ("clip NaN", "central", _dp(_set("clip", float("nan"))),
     JS + "algo.dp.clip must be a finite clip norm above 0 (got nan)"),
    ("adaptive clip 1e9", "adaptive", _dp(_set("clip", 1e9)),
     JS + "algo.dp.clip is 1e+09, the run's clip norm is "),
    ("adaptive clip -1", "adaptive", _dp(_set("clip", -1.0)),
     JS + "algo.dp.clip must be a finite clip norm above 0 (got -1.0)"),
    ("adaptive clip 0", "adaptive", _dp(_set("clip", 0)),
     JS + "algo.dp.clip must be a finite clip norm above 0 (got 0)"),
    ("adaptive clip string", "adaptive", _dp(_set("clip", "1")),
     JS + "algo.dp.clip must be a finite clip norm above 0 (got '1')"),
    ("sgd epsilon -1", "central", _dp(_set("sgd_epsilon", -1.0)),
     JS + "algo.dp.sgd_epsilon must be a finite number >= 0 (got -1.0)"),
    # local DP and DP-SGD: the tasks per client
    ("zeroed counts", "local", _first("state/dp_counts", lambda x: x.fill(0)),
     NPZ + "array 'state/dp_counts' gives client 0 0 tasks, the checkpoint's participants 3 "
     "(6 clients differ)"),
    ("one count lower", "local", _first("state/dp_counts", _flat0(2)),
     NPZ + "array 'state/dp_counts' gives client 0 2 tasks, the checkpoint's participants 3 "
     "(1 clients differ)"),
    ("count past the rounds", "local", _first("state/dp_counts", _flat0(4)),
     NPZ + "array 'state/dp_counts' holds a count outside 0..3"),
    ("negative count", "local", _first("state/dp_counts", _flat0(-1)),
     NPZ + "array 'state/dp_counts' holds a count outside 0..3"),
    ("counts and participants zeroed", "local",
     lambda r: _npz(r, lambda a: (a["state/dp_counts"].fill(0), a.pop("participants/clients"),
                                  a.pop("participants/tasks"))),
     NPZ + "the accountant's record gives epsilon 0 after round 3, below the "),
    ("events under local DP", "local", _dp(_set("events", [[["gaussian", 0.025], 3]])),
     JS + "algo.dp.events: --dp local records no central events (got 1)"),
    ("DP-SGD's epsilon lowered", "local", _dp(_set("sgd_epsilon", 0.0)),
     JS + "algo.dp.sgd_epsilon is 0, the clients' task counts give "),
    # robust and server-optimizer state: finite, and the moments in their range
    ("center NaN", "clip", _first("state/center", _flat0(np.nan)),
     NPZ + "array 'state/center' holds 1 NaN or inf value"),
    ("center short", "clip",
     lambda r: _npz(r, lambda a: a.__setitem__("state/center", a["state/center"][:10])),
     NPZ + "the centered-clipping center has shape (10,) and dtype float64"),
    ("FedAvgM momentum inf", "clip", _first("state/m/", _flat0(np.inf)),
     NPZ + "array 'state/m/conv1.bias' holds 1 NaN or inf value"),
    ("FedAdam m NaN", "adaptive", _first("state/m/", _flat0(np.nan)),
     NPZ + "array 'state/m/conv1.bias' holds 1 NaN or inf value"),
    ("FedAdam v negative", "adaptive", _first("state/v/", _flat0(-1.0)),
     NPZ + "array 'state/v/conv1.bias': the second moment must be above 0 everywhere"),
    ("FedAdam v zero", "adaptive", _first("state/v/", lambda x: x.fill(0.0)),
     NPZ + "array 'state/v/conv1.bias': the second moment must be above 0 everywhere"),
    ("FedAdam v missing", "adaptive",
     lambda r: _npz(r, lambda a: a.pop(sorted(k for k in a if k.startswith("state/v/"))[0])),
     NPZ + "the server optimizer's v must hold every trainable floating entry of the model "
     "('state/v/conv1.bias' is missing)"),
    ("model NaN", "central", _first("model/", _flat0(np.nan)),
     NPZ + "array 'model/conv1.bias' holds 1 NaN or inf value"),
    ("SCAFFOLD control NaN", "scaffold", _first("state/c/", _flat0(np.nan)),
     NPZ + "array 'state/c/conv1.bias' holds 1 NaN or inf value"),
    ("SCAFFOLD client control NaN", "scaffold", _store_nan, "NaN or inf value"),
    ("FedDyn h inf", "feddyn", _first("state/h/", _flat0(-np.inf)),
     NPZ + "array 'state/h/conv1.bias' holds 1 NaN or inf value"),
]


@pytest.mark.parametrize("what, base, damage, says", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_state_is_one_line_and_the_folder_stays(bases, tmp_path, monkeypatch, what,
                                                          base, damage, says):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(bases(base), "run")
    damage(Path("run"))
    before = snapshot(Path("run"))
    line = one_line(cli("local", "--resume", "run", "--rounds", "5", "-q"))
    assert line.startswith("--resume run: run/") and says in line, line
    assert snapshot(Path("run")) == before


@pytest.mark.parametrize("base", sorted(BASES))
def test_an_undamaged_state_resumes(bases, tmp_path, monkeypatch, base):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(bases(base), "run")
    res = cli("local", "--resume", "run", "--rounds", "4", "-q")
    assert res.exit_code == 0, res.stderr
    assert json.loads(Path("run/summary.json").read_text())["rounds"] == 4


def test_an_interrupted_local_dp_round_is_counted_once(tmp_path):
    """Ctrl-C in round 2 of a local-DP run: the checkpoint counts the one round done (as its
    participants do), and the resumed run ends at the unbroken run's epsilon, not above it."""
    from tests.harness import interrupt_in

    dp = {"mode": "local", "noise": 0.5}
    ref = run_local(small_config(clients=4, rounds=3, dp=dp, out=str(tmp_path / "ref")),
                    quiet=True)
    cfg = small_config(clients=4, rounds=3, dp=dp, out=str(tmp_path / "run"))
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(1))
    with np.load(tmp_path / "run" / "checkpoint" / "state.npz") as z:
        assert z["state/dp_counts"].tolist() == [1] * 4 == z["participants/tasks"].tolist()
    got = run_local(cfg, quiet=True, resume=True)
    assert got["dp"]["epsilon"] == ref["dp"]["epsilon"] and got["dp"]["most_tasks"] == 3
