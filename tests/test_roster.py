"""The roster (fednet.types.Roster): the lazily built client list the dispatchers hand a round
behaves as the list of ClientInfo it replaced, and builds only what is read."""
from __future__ import annotations

import numpy as np

from fednet.algorithms import build
from tests.conftest import small_config
from fednet.platform.gpus import device_for, gpu_counts
from fednet.types import ClientInfo, Roster, cids, device_counts, lookup, ordered


def _roster(ids, built=None, gpus=(0, 1, 1)):
    def info(c):
        if built is not None:
            built.append(c)
        return ClientInfo(c, 10 + c % 7, device_for(c, gpus), "", 0, "h")
    return Roster(np.asarray(ids, np.int64), info, lambda a: gpu_counts(a, gpus))


def test_a_roster_is_the_list_it_replaces():
    ids = [0, 3, 4, 9, 12]
    r = _roster(ids)
    plain = [ClientInfo(c, 10 + c % 7, device_for(c, (0, 1, 1)), "", 0, "h") for c in ids]
    assert len(r) == 5 and list(r) == plain and r == plain
    assert r[1] == plain[1] and r[-1] == plain[-1] and list(r[1:3]) == plain[1:3]
    assert 4 in r and 5 not in r and plain[2] in r and 100 not in r and "x" not in r
    assert r.get(9) == plain[3] and r.get(10) is None
    assert cids(r) == ids == cids(list(reversed(plain)))
    assert list(ordered(list(reversed(plain)))) == plain and ordered(r) is r
    assert lookup(r)(12) == lookup(plain)(12) == plain[4] and lookup(r)(1) is None
    assert device_counts(r) == device_counts(plain) == {"cuda:0": 4, "cuda:1": 1}


def test_reading_a_roster_builds_only_what_is_read():
    built: list[int] = []
    r = _roster(np.arange(1_000_000), built)
    assert len(r) == 1_000_000 and r.devices() == {"cuda:0": 333_334, "cuda:1": 666_666}
    assert 999_999 in r and r[500_000].cid == 500_000 and built == [500_000]


def test_gpu_counts_are_each_clients_device_counted():
    a = np.array([0, 1, 2, 5, 7, 8, 11], np.int64)
    for gpus in ([], [0], [0, 1], [1, 0, 1], [0, 0]):
        want: dict[str, int] = {}
        for c in a.tolist():
            want[device_for(c, gpus)] = want.get(device_for(c, gpus), 0) + 1
        assert gpu_counts(a, gpus) == want


def test_a_strategy_picks_the_same_clients_from_a_roster_as_from_the_list():
    algo = build(small_config(clients=50, algo={"fraction": 0.2}))
    r = _roster(np.arange(50))
    for rnd in range(3):
        assert algo.select(rnd, r) == algo.select(rnd, list(reversed(list(r))))
    assert build(small_config(clients=50)).select(0, r) == list(r)  # fraction 1: a list of all
