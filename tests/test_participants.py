"""A run's outputs grow with the clients that took part, not with its population: clients.jsonl
holds the participants (with their task counts, kept across --resume), summary.json counts the
clients per device and describes the population in quantiles, population.npz (asked for) holds
every client in columns."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fednet.core.inproc import run_local
from fednet.core.participants import KEYS, Participants
from fednet.errors import ConfigError
from fednet.metrics.report import device_counts
from fednet.opcount import CLIENT_RATES
from tests.conftest import small_config
from tests.harness import interrupt_in, resume_config


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _task(*route: int) -> SimpleNamespace:
    return SimpleNamespace(route=list(route))


def test_tasks_count_once_their_step_is_committed_and_round_trip_a_checkpoint():
    p = Participants()
    p.note([_task(3), _task(5, 1, 3)])  # a ring: every client on the route takes part
    assert p.tasks == {} and p.clients() == []
    p.commit()
    p.note([_task(9)])  # an interrupted step: not counted
    assert p.tasks == {3: 2, 5: 1, 1: 1}
    arrays = p.arrays()
    assert arrays[KEYS[0]].tolist() == [1, 3, 5] and arrays[KEYS[1]].tolist() == [1, 2, 1]

    def need(ok: bool, problem: str) -> None:  # as the checkpoint's reader: it refuses
        if not ok:
            raise ValueError(problem)

    assert Participants.of(arrays, 6, need).tasks == p.tasks
    assert Participants.of({}, 6, need).tasks == {}  # an older checkpoint: none kept
    bad = [(arrays, 5, "distinct clients in 0..4"),
           ({KEYS[0]: np.array([1, 1]), KEYS[1]: np.array([1, 1])}, 6, "distinct clients"),
           ({KEYS[0]: np.array([1]), KEYS[1]: np.array([0])}, 6, "must be 1 or more"),
           ({KEYS[0]: np.array([1.0]), KEYS[1]: np.array([1])}, 6, "two integer vectors"),
           ({KEYS[0]: np.array([1])}, 6, "incomplete")]
    for a, n, why in bad:
        with pytest.raises(ValueError, match=why):
            Participants.of(a, n, need)


def test_clients_jsonl_holds_the_participants_and_the_summary_counts_devices(tmp_path):
    out = tmp_path / "run"
    cfg = small_config(clients=20, rounds=3, out=str(out), population_file=True,
                       algo={"fraction": 0.1})
    s = run_local(cfg, quiet=True)
    rows = _jsonl(out / "clients.jsonl")
    assert sum(r["tasks"] for r in rows) == 3 * 2  # two clients a round
    assert 2 <= len(rows) <= 6 and [r["client"] for r in rows] == sorted(r["client"] for r in rows)
    assert s["devices"] == {"cpu": 20} and device_counts(s) == {"cpu": 20}
    part = s["partition"]
    assert sum(part["label_counts"]) == part["samples"]
    assert part["size_quantiles"]["p0"] == part["min_size"]
    assert part["size_quantiles"]["p100"] == part["max_size"]
    with np.load(out / "population.npz", allow_pickle=False) as z:
        cols = {k: z[k] for k in z.files}
    assert cols["samples"].sum() == part["samples"] and cols["labels"].shape == (20, 10)
    assert cols["labels"].sum(axis=1).tolist() == cols["samples"].tolist()
    assert {int(c): int(cols["tasks"][c]) for c in np.flatnonzero(cols["tasks"])} == {
        r["client"]: r["tasks"] for r in rows}
    assert [cols["samples"][r["client"]] for r in rows] == [r["samples"] for r in rows]
    assert set(cols) == {"samples", "tasks", "labels", "compute_s_per_sample", "rtt_s", "up_bps",
                         "down_bps", "train_flops_per_s", *CLIENT_RATES, "s_per_op",
                         "s_per_conv"}  # every profile field


def test_an_older_summary_s_device_map_is_still_counted():
    assert device_counts({"devices": {"0": "cuda:0", "1": "cuda:1", "2": "cuda:0"}}) == {
        "cuda:0": 2, "cuda:1": 1}
    assert device_counts({}) == {}


@pytest.mark.parametrize("algo", ["fedseq", "scaffold"])
def test_the_participants_survive_an_interrupt_and_resume(algo, tmp_path):
    """The resumed run's clients.jsonl is the unbroken run's, setup stages included (FedSeq's
    pre-training gives every client a task)."""
    out, ref = tmp_path / "run", tmp_path / "ref"
    run_local(resume_config(algo, ref), quiet=True)
    cfg = resume_config(algo, out)
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(2))
    assert len(_jsonl(out / "clients.jsonl")) >= 1
    run_local(cfg, quiet=True, resume=True)
    assert _jsonl(out / "clients.jsonl") == _jsonl(ref / "clients.jsonl")


def test_a_checkpoint_with_damaged_participants_is_refused(tmp_path):
    out = tmp_path / "run"
    cfg = resume_config("fedavg", out)
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(2))
    npz = out / "checkpoint" / "state.npz"
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[KEYS[0]] = arrays[KEYS[0]] + 1000
    with npz.open("wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(ConfigError, match=r"state\.npz.*participants must be distinct clients"):
        run_local(cfg, quiet=True, resume=True)
