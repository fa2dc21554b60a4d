"""Naturally federated datasets (datasets.NATURAL): each client is one user with data of its own,
so the data's own split replaces --partition (`natural`, the only partition they take).

A dataset's `natural` attribute (synthetic_fedprox.Source, leaf.Source) says how many users it
has (`users`, 0: as many as a run asks for) and builds one client's rows, its data and a run's
test set. What the server needs stays bounded by the run's cohort, not by its population:
`Parts` (the session's `parts`) builds a client's row indices only when asked for that client,
and the statistics (`summary`) describe the first `described` clients (synthetic-fedprox: 100,
whose held-out samples are also the server's test set; LEAF: every user of the run).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fednet.errors import ConfigError
from fednet.data.stats import population

if TYPE_CHECKING:
    from fednet.data.base import Dataset


class DataOptions(Protocol):
    """What the natural datasets read of the run's data settings (config.DataConfig)."""

    @property
    def partition(self) -> str: ...
    @property
    def synthetic_alpha(self) -> float: ...
    @property
    def synthetic_beta(self) -> float: ...


class Natural(Protocol):
    """The clients of a naturally federated dataset."""

    users: int      # how many clients it can have (0: no limit)
    described: int  # the clients its statistics describe (0: all)

    def check(self, d: DataOptions) -> None: ...
    def train_size(self, ds: Dataset, d: DataOptions, seed: int, cid: int) -> int: ...
    def rows(self, ds: Dataset, d: DataOptions, seed: int, cid: int) -> np.ndarray: ...
    def client(self, ds: Dataset, d: DataOptions, seed: int, cid: int) -> tuple[np.ndarray, ...]: ...
    def test(self, ds: Dataset, d: DataOptions, clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]: ...
    def histograms(self, ds: Dataset, d: DataOptions, clients: int, seed: int) -> np.ndarray: ...
    def without_tests(self, clients: int) -> int: ...


def check(ds: Dataset, d: DataOptions, num_clients: int) -> None:
    """ConfigError unless the run's partition and clients fit the dataset (for every dataset:
    `natural` belongs to the naturally federated ones only)."""
    src = getattr(ds, "natural", None)
    if src is None:
        if d.partition == "natural":
            from fednet.data.base import NATURAL

            raise ConfigError(f"--partition natural is for the naturally federated datasets "
                              f"({', '.join(NATURAL)}); split {ds.name} with --partition iid, "
                              "dirichlet, shards or domain")
        return
    if d.partition != "natural":
        raise ConfigError(f"--partition {d.partition} does not apply to --dataset {ds.name}: its "
                          "clients' data is naturally federated (one user per client); drop "
                          "--partition (or give --partition natural)")
    if num_clients < 1:
        raise ConfigError(f"--clients must be at least 1 (got {num_clients})")
    if src.users and num_clients > src.users:
        raise ConfigError(f"--clients {num_clients} exceeds the {src.users} users of {ds.name} "
                          f"(one user per client); use at most --clients {src.users}")
    src.check(d)


def check_own_tests(ds: Dataset, num_clients: int) -> None:
    """ConfigError when some of the run's clients have no test samples of their own (LEAF's
    user split), which --eval clients needs."""
    src = getattr(ds, "natural", None)
    missing = src.without_tests(int(num_clients)) if src is not None else 0
    if missing:
        raise ConfigError(f"--eval clients tests each client on its own held-out samples, and "
                          f"{missing} of the {num_clients} users of {ds.name} have none (LEAF's "
                          "user split, -t user); use LEAF's sample split (-t sample) or --eval "
                          "global")


def _cid(num_clients: int, cid: int) -> int:
    if not 0 <= int(cid) < int(num_clients):
        raise ConfigError(f"client id {cid} is outside 0..{int(num_clients) - 1} for --clients "
                          f"{num_clients}")
    return int(cid)


def _index(n: int, cid: Any) -> int:
    """A sequence index: negative from the end, IndexError outside (so iteration stops)."""
    i = int(cid)
    i = i + n if i < 0 else i
    if not 0 <= i < n:
        raise IndexError(f"client {cid} of {n}")
    return i


class Parts(Sequence):
    """The clients' training rows, one client at a time: parts[cid] is built when asked for
    (O(that client's size)); len() is the number of clients. Iterating builds them all."""

    def __init__(self, ds: Dataset, d: DataOptions, num_clients: int, seed: int) -> None:
        self.ds, self.d, self.n, self.seed = ds, d, int(num_clients), int(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, cid: Any) -> Any:
        if isinstance(cid, slice):
            return [self[i] for i in range(*cid.indices(self.n))]
        rows = self.ds.natural.rows(self.ds, self.d, self.seed, _index(self.n, cid))
        rows.setflags(write=False)
        return rows

    def size(self, cid: int) -> int:
        """len(self[cid]) without building the rows."""
        return self.ds.natural.train_size(self.ds, self.d, self.seed, _cid(self.n, cid))

    def sizes(self, cids: np.ndarray) -> np.ndarray:
        """size(c) of every c of `cids` (int64): in one call where the source has one."""
        src = self.ds.natural
        many = getattr(src, "train_sizes", None)
        if cids.size and (int(cids.min()) < 0 or int(cids.max()) >= self.n):
            bad = int(cids.min()) if int(cids.min()) < 0 else int(cids.max())
            _cid(self.n, bad)  # the ConfigError naming it
        if many is not None:
            return np.asarray(many(self.ds, self.d, self.seed, cids), np.int64)
        return np.fromiter((src.train_size(self.ds, self.d, self.seed, c) for c in cids.tolist()),
                           np.int64, cids.size)


def parts(ds: Dataset, d: DataOptions, num_clients: int, seed: int) -> Parts:
    """The run's clients (checked: partition natural, no more clients than users)."""
    check(ds, d, num_clients)
    return Parts(ds, d, num_clients, seed)


def client_arrays(ds: Dataset, d: DataOptions, num_clients: int, seed: int, cid: int,
                  indices: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """(images, rows, y, test images, test rows, test y) of client cid; `indices` (the server's
    rows for it, from WELCOME) must be the rows it builds here."""
    check(ds, d, num_clients)
    out = ds.natural.client(ds, d, int(seed), _cid(num_clients, cid))
    if indices is not None:
        got = np.asarray(indices)
        if got.shape != out[1].shape or not np.array_equal(got, out[1]):
            raise ConfigError(f"client {cid}: the server's rows ({got.size}) are not this "
                              f"client's {out[1].size} rows of {ds.name}: the server and this "
                              "client load different data (check --data-root and the version)")
    return out


_MEMO: dict[tuple, tuple[Any, Any]] = {}


def _memo(ds: Dataset, d: DataOptions, num_clients: int, seed: int, what: str, make: Any) -> Any:
    """make(), computed once per process and (dataset, data options, clients, seed)."""
    key = (id(ds), what, tuple(sorted(vars(d).items())) if hasattr(d, "__dict__") else d,
           int(num_clients), int(seed))
    hit = _MEMO.get(key)
    if hit is None or hit[0] is not ds:
        if len(_MEMO) > 16:
            _MEMO.clear()
        hit = _MEMO[key] = (ds, make())
    return hit[1]


def test_dataset(ds: Dataset, d: DataOptions, num_clients: int, seed: int) -> Any:
    """ds with the run's held-out test set as its test arrays (ds itself when not natural)."""
    if getattr(ds, "natural", None) is None:
        return ds

    def make() -> Any:
        check(ds, d, num_clients)
        x, y = ds.natural.test(ds, d, int(num_clients), int(seed))
        return replace(ds, test_x=np.ascontiguousarray(x), test_y=np.ascontiguousarray(y))

    return _memo(ds, d, num_clients, seed, "test", make)


class Histograms(Sequence):
    """Training label histograms per client: a list for each described client, None beyond."""

    def __init__(self, hists: np.ndarray, num_clients: int) -> None:
        self.hists, self.n = hists, int(num_clients)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, cid: Any) -> Any:
        if isinstance(cid, slice):
            return [self[i] for i in range(*cid.indices(self.n))]
        cid = _index(self.n, cid)
        return [int(v) for v in self.hists[cid]] if cid < len(self.hists) else None


def summary(ds: Dataset, d: DataOptions, num_clients: int, seed: int
            ) -> tuple[dict, Histograms, np.ndarray | None]:
    """(statistics, per-client histograms, the clients x classes histogram matrix or None) of
    the described clients: the session's `stats`, `histograms` and ServerInfo.label_hist."""

    def make() -> tuple[dict, Histograms, np.ndarray | None]:
        check(ds, d, num_clients)
        hists = np.asarray(ds.natural.histograms(ds, d, int(num_clients), int(seed)), np.int64)
        sizes = hists.sum(axis=1)
        top, low = hists.max(axis=1, initial=0), hists.min(axis=1, initial=0)
        balance = np.where(top > 0, low / np.maximum(top, 1), 0.0)
        k = len(sizes)
        stats = {"clients": int(num_clients), "described_clients": k,
                 "samples": int(sizes.sum()), "unique_samples": int(sizes.sum()),
                 "min_size": int(sizes.min()) if k else 0,
                 "mean_size": float(sizes.mean()) if k else 0.0,
                 "max_size": int(sizes.max()) if k else 0,
                 "std_size": float(sizes.std()) if k else 0.0,
                 "mean_classes": float((hists > 0).sum(axis=1).mean()) if k else 0.0,
                 "mean_balance": float(balance.mean()) if k else 0.0, **population(hists)}
        return stats, Histograms(hists, num_clients), hists if k == num_clients else None

    return _memo(ds, d, num_clients, seed, "summary", make)


def describe(ds: Dataset, d: DataOptions, stats: dict) -> str:
    """The start-up line's partition part, e.g. 'synthetic-fedprox(1,1) natural split: ...'."""
    name = ds.name + (f"({d.synthetic_alpha:g},{d.synthetic_beta:g})"
                      if ds.name == "synthetic-fedprox" else "")
    some = ("" if stats["described_clients"] == stats["clients"]
            else f" (the first {stats['described_clients']} clients)")
    return (f"{stats['clients']} clients, {name} natural split: {stats['min_size']}-"
            f"{stats['max_size']} training samples each, {stats['mean_classes']:.1f} classes per "
            f"client on average{some}")
