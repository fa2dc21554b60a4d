"""synthetic-fedprox: Synthetic(alpha, beta) of FedProx (Li et al. 2020, "Federated Optimization in
Heterogeneous Networks", §5.1 and Appendix C.1), generated client by client.

60 features, 10 classes. Client k draws u_k ~ N(0, alpha), B_k ~ N(0, beta), W_k (10 x 60) and
b_k with entries ~ N(u_k, 1), v_k with entries ~ N(B_k, 1), then its samples x ~ N(v_k, Sigma)
with Sigma diagonal, Sigma_jj = j^-1.2 (j = 1..60), and y = argmax(softmax(W_k x + b_k)). As in
FedProx's generator (data/synthetic_*/generate_niid.py), the second argument of N is a standard
deviation (numpy's normal(mean, std)) and a client holds int(lognormal(4, 2)) + 50 samples, here
capped at MAX_SIZE; the first TRAIN_SHARE of them train, the rest are its own test split.

alpha changes no label, here as in FedProx: u_k is added to every entry of W_k and b_k, which
shifts every logit by the same u_k (1 + sum_j x_j), and argmax (softmax) ignores a common shift.
With the same seed and beta, every alpha gives the same data; the clients' models differ through
their own N(0, 1) draws of W_k and b_k (FedProx's datasets for different alpha differ only because
their random draws do). beta moves the clients' inputs apart.

A client's size is a hash of (run seed, client id) turned into a lognormal draw (size(): 2 us,
so a server can look up any client's size), and its data comes from a seeded stream of its own
(fednet.rng's generator(seed, purpose, client=cid)): a client's data exists only where that
client is built, costs O(its size) whatever the population, and is the same bit for bit in
every process. The server's test set is the
held-out part of clients 0..min(clients, TEST_CLIENTS)-1 (test_set): bounded, and for a run
of up to TEST_CLIENTS clients exactly FedProx's pooled test set of all of them.
"""
from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import numpy as np

from fednet.errors import ConfigError
from fednet.rng import generator

NAME = "synthetic-fedprox"
DIM, CLASSES = 60, 10
VERSION = 1
"""Part of the stream's name: bump it whenever the generator's output changes."""
LOG_MEAN, LOG_SIGMA, MIN_SIZE = 4.0, 2.0, 50  # FedProx: lognormal(4, 2).astype(int) + 50
MAX_SIZE = 10_000  # 0.5% of clients reach it; FedProx's 30 clients never did
TRAIN_SHARE = 0.9  # FedProx: int(0.9 * n) train samples per client, the rest test
TEST_CLIENTS = 100  # the server's test set: the held-out samples of the first 100 clients
_SCALE = np.arange(1, DIM + 1, dtype=np.float64) ** -0.6  # sqrt(Sigma_jj) = sqrt(j^-1.2)
_B = 2 + CLASSES * DIM  # a client's draws: u_k and B_k, W_k, then b_k from _B, v_k from _V,
_V = _B + CLASSES  # its samples from _HEAD on
_HEAD = _V + DIM


_M64 = (1 << 64) - 1
_SALT = zlib.crc32(f"data/{NAME}/sizes/v{VERSION}".encode())


def _mix(z: int) -> int:
    """splitmix64's finalizer: a 64-bit integer -> a well-mixed 64-bit integer."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _stream(seed: int, cid: int) -> np.random.Generator:
    return generator(seed, f"data/{NAME}/v{VERSION}", client=cid)


def check(alpha: float, beta: float) -> None:
    """ConfigError unless alpha and beta are finite and >= 0."""
    for opt, v in (("--synthetic-alpha", alpha), ("--synthetic-beta", beta)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ConfigError(f"{opt} must be a finite number >= 0 (got {v}); FedProx uses 0, "
                              "0.5 and 1")


@lru_cache(maxsize=1 << 16)  # a round looks each of its clients' size up several times
def size(seed: int, cid: int) -> int:
    """All samples of client cid (train and test), int(lognormal(4, 2)) + 50 capped at
    MAX_SIZE: two uniforms hashed from (seed, cid), Box-Muller, in O(1) (scalar libm)."""
    a = _mix(_mix((int(seed) << 32) ^ _SALT) ^ int(cid))
    b = _mix(a)
    u1, u2 = ((a >> 11) + 0.5) * 2.0 ** -53, (b >> 11) * 2.0 ** -53  # (0, 1) and [0, 1)
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return min(int(math.exp(LOG_MEAN + LOG_SIGMA * z)) + MIN_SIZE, MAX_SIZE)


def train_size(seed: int, cid: int) -> int:
    """The training samples of client cid."""
    return int(TRAIN_SHARE * size(seed, cid))


def sizes(seed: int, cids: np.ndarray) -> np.ndarray:
    """size(seed, c) for every c of `cids` (int64), equal to it for each: the same splitmix64
    in uint64 arithmetic, the same Box-Muller in numpy, and the scalar function again wherever
    numpy's log, cos or exp (within an ulp of libm's) could round to another integer (a value
    within 1e-6 of one: about one client in 10^5). A million clients in ~0.1 s, not ~1.5 s."""
    with np.errstate(over="ignore"):
        a = _mix_u64(np.full(cids.shape, _mix((int(seed) << 32) ^ _SALT), np.uint64)
                     ^ cids.astype(np.uint64))
        b = _mix_u64(a)
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    u2 = (b >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    v = np.exp(LOG_MEAN + LOG_SIGMA * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2))
    out = np.minimum(v.astype(np.int64) + MIN_SIZE, MAX_SIZE)
    frac = v - np.floor(v)
    near = np.flatnonzero(((frac < 1e-6) | (frac > 1 - 1e-6)) & (v < MAX_SIZE))
    for i in near.tolist():
        out[i] = size(seed, int(cids[i]))
    return out


def train_sizes(seed: int, cids: np.ndarray) -> np.ndarray:
    """train_size(seed, c) for every c of `cids`."""
    return (TRAIN_SHARE * sizes(seed, cids)).astype(np.int64)


def _mix_u64(z: np.ndarray) -> np.ndarray:
    """_mix on a uint64 array (wrapping arithmetic, as _mix's masks)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def client_arrays(seed: int, cid: int, alpha: float = 1.0, beta: float = 1.0
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train x, train y, test x, test y) of client cid: float32 n x 60 features, int64 labels."""
    n = size(seed, cid)
    # every draw in one call (the stream's values in its order, as one call per piece drew
    # them: u and B_k, W_k, b_k, v_k, then the samples), at a third of a small client's cost
    r = _stream(seed, cid).standard_normal(_HEAD + n * DIM)
    u, b_mean = r[0] * float(alpha), r[1] * float(beta)
    w = u + r[2:_B].reshape(CLASSES, DIM)
    b = u + r[_B:_V]
    v = b_mean + r[_V:_HEAD]
    z = r[_HEAD:].reshape(n, DIM)
    z *= _SCALE
    x = np.empty((n, DIM), np.float32)
    np.add(z, v, out=x, casting="same_kind")  # float32(v + _SCALE * z): summed in float64,
    np.copyto(z, x)  # rounded once; then z holds x in float64 (exact), no other temporaries
    if n * CLASSES * DIM <= _ONE_THREAD_PRODUCT:  # OpenBLAS runs it on one thread anyway
        logits = z @ w.T
    else:
        with _one_blas_thread():
            logits = z @ w.T
    logits += b
    y = logits.argmax(axis=1).astype(np.int64, copy=False)  # softmax keeps argmax
    k = int(TRAIN_SHARE * n)
    return x[:k], y[:k], x[k:], y[k:]


_ONE_THREAD_PRODUCT = 4 * 65536
"""A product of at most this many multiply-adds (m n k) OpenBLAS runs on one thread (its gemm's
SMP_THRESHOLD_MIN x GEMM_MULTITHREAD_THRESHOLD): _one_blas_thread (~20 us) is not needed for a
client of up to 436 samples, most of them (measured with OpenBLAS 0.3.31: no slower up to 800)."""


@lru_cache(maxsize=1)
def _blas() -> tuple[Any, ...]:
    """threadpoolctl's controllers of this process's BLAS libraries (found once: that takes
    milliseconds); none without threadpoolctl (scikit-learn's dependency, which fednet needs)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover
        return ()
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """numpy's BLAS on one thread within (a few microseconds to enter and leave): a client's
    n x 60 by 60 x 10 product took ~0.7 ms with OpenBLAS's threads waking on a loaded 2-core
    machine against ~0.05 ms on one, most of a client's generation (issue 56). OpenBLAS splits
    a product's rows and columns among its threads, never a sum: the labels are the same
    (checked on 20,200 clients; tests/test_natural_data.py pins a digest)."""
    libs = _blas()
    before = [c.num_threads for c in libs]
    for c in libs:
        c.set_num_threads(1)
    try:
        yield
    finally:
        for c, n in zip(libs, before):
            c.set_num_threads(n)
            release = getattr(c, "clear_controlling_thread", None)
            if release is not None:  # OpenBLAS's: let another thread set it next (as
                release()            # threadpool_limits does on leaving)


@lru_cache(maxsize=4)
def sample(seed: int, clients: int, alpha: float, beta: float
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What clients 0..min(clients, TEST_CLIENTS)-1 tell the server (built once per process):
    (their training sizes, their K x 10 training label histograms, the pooled test x, test y)."""
    k = min(int(clients), TEST_CLIENTS)
    sizes, hists, xs, ys = [], [], [], []
    for cid in range(k):
        x, y, tx, ty = client_arrays(seed, cid, alpha, beta)
        sizes.append(len(y))
        hists.append(np.bincount(y, minlength=CLASSES))
        xs.append(tx)
        ys.append(ty)
    out = (np.array(sizes, np.int64), np.array(hists, np.int64).reshape(k, CLASSES),
           np.concatenate(xs), np.concatenate(ys))
    for a in out[:2]:
        a.setflags(write=False)
    return out


class Source:
    """The clients of synthetic-fedprox (natural.Natural): generated, as many as the run asks."""

    users = 0  # no limit
    described = TEST_CLIENTS

    @staticmethod
    def _ab(d) -> tuple[float, float]:
        a, b = float(getattr(d, "synthetic_alpha", 1.0)), float(getattr(d, "synthetic_beta", 1.0))
        check(a, b)
        return a, b

    def check(self, d) -> None:
        self._ab(d)

    def train_size(self, ds, d, seed: int, cid: int) -> int:
        return train_size(seed, cid)

    def train_sizes(self, ds, d, seed: int, cids: np.ndarray) -> np.ndarray:
        return train_sizes(seed, cids)

    def rows(self, ds, d, seed: int, cid: int) -> np.ndarray:
        return np.arange(train_size(seed, cid), dtype=np.int64)

    def client(self, ds, d, seed: int, cid: int) -> tuple[np.ndarray, ...]:
        x, y, tx, ty = client_arrays(seed, cid, *self._ab(d))
        return x, np.arange(len(y), dtype=np.int64), y, tx, np.arange(len(ty), dtype=np.int64), ty

    def test(self, ds, d, clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        s = sample(int(seed), int(clients), *self._ab(d))
        return s[2], s[3]

    def without_tests(self, clients: int) -> int:
        return 0  # every client holds at least 5 test samples

    def histograms(self, ds, d, clients: int, seed: int) -> np.ndarray:
        """Training label histograms of the described clients (the first `described`)."""
        return sample(int(seed), int(clients), *self._ab(d))[1]


def dataset():
    """The Dataset of synthetic-fedprox: shapes only (no pooled arrays), its clients in .natural."""
    from fednet.data.base import Dataset

    empty = np.empty((0, DIM), np.float32)
    return Dataset(name=NAME, train_x=empty, train_y=np.empty(0, np.int64), test_x=empty,
                   test_y=np.empty(0, np.int64), num_classes=CLASSES, input_shape=(DIM,),
                   class_names=tuple(str(i) for i in range(CLASSES)), natural=Source())
