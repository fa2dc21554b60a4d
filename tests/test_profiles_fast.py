"""The profile table's fast paths give what the plain forms gave: Profiles.subset of consecutive
ids (column views), latency.to_array (column by column), Profiles[i] (kept once built), and
synthetic_fedprox.size (cached)."""
from __future__ import annotations

import numpy as np

from fednet.data import synthetic_fedprox as sf
from fednet.network import latency
from fednet.network.profiles import BUILT_KEPT, COLUMNS, Profile, Profiles


def _table(n: int) -> Profiles:
    rng = np.random.default_rng(3)
    t = rng.uniform(0.5, 2.0, (n, len(COLUMNS)))
    t[::3, 2] = np.inf  # unlimited links, which to_array writes as 0
    t[1::4, 3] = np.inf
    return Profiles(t)


def _old_to_array(p: Profiles) -> np.ndarray:
    a = p.table
    a[:, 2:4][np.isinf(a[:, 2:4])] = 0.0
    return a


def test_to_array_is_the_stacked_table_with_unlimited_links_at_zero() -> None:
    p = _table(50)
    got = latency.to_array(p)
    assert got.dtype == np.float64 and got.flags["C_CONTIGUOUS"]
    assert np.array_equal(got, _old_to_array(p))
    assert np.array_equal(latency.to_array(list(p)), got)  # Profile objects
    assert (got[::3, 2] == 0).all() and not np.isinf(got).any()
    back = Profiles.from_array(got)
    assert list(back) == list(p)


def test_subset_of_consecutive_ids_equals_the_gathered_one() -> None:
    p = _table(40)
    for ids in (np.arange(40), np.arange(7, 19), [3, 4, 5], [5, 4, 3], [0, 2, 3], [9], [],
                np.array([38, 39])):
        at = np.asarray(ids, np.int64)
        want = Profiles(cols=tuple(c[at] for c in p.cols))
        got = p.subset(ids)
        assert len(got) == len(at) and got == want
        assert np.array_equal(latency.to_array(got), _old_to_array(want))


def test_a_profile_read_twice_is_the_same_and_the_kept_ones_are_bounded() -> None:
    p = _table(10)
    assert p[4] is p[4] and p[4] == Profile(*(float(c[4]) for c in p.cols))
    assert p[-1] == p[9]
    big = Profiles(cols=tuple(np.zeros(BUILT_KEPT + 5) for _ in COLUMNS))
    for i in range(BUILT_KEPT + 5):
        assert big[i].rtt_s == 0.0
    assert len(big._built) <= BUILT_KEPT


def test_cached_size_matches_the_vectorised_sizes() -> None:
    cids = np.arange(0, 200_000, 997, dtype=np.int64)
    assert [sf.size(0, int(c)) for c in cids] == sf.sizes(0, cids).tolist()
    assert [sf.size(0, int(c)) for c in cids] == sf.sizes(0, cids).tolist()  # from the cache
    assert sf.size(7, 3) == sf.size.__wrapped__(7, 3)
