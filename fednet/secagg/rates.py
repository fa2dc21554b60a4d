"""This host's rates of the operations fednet/opcount.py counts, measured with the primitives
fednet really runs (`fednet calibrate`: the client rates go into its --latency profile, all of
them into its --server-out profile).

Each operation is timed on a fixed amount of its real work, after one warm-up call, in this
process's CPU seconds (`time.process_time`, the fastest of three timings: on a shared machine,
the time the work took, not the time others' work kept it waiting; as training/calibrate.py
times training); its rate is amount / seconds, in opcount's units:
  x25519   crypto.keypair: one X25519 multiplication each (a public key)
  kdf      HKDF-SHA256 of a 32-byte shared secret, as crypto.agree derives a key
  aead     crypto.seal and crypto.unseal of a share as secagg/client.py seals it (one each)
  prg      crypto.mask's AES-256-CTR keystream, in bytes
  shamir   shamir.share's multiply-adds (parties x threshold x chunks)
  taken    secagg/server.Aggregation.take_unmask of a survivor's reply, per share in it
  rebuilt  shamir.reconstruct of a 32-byte secret from REBUILD_T shares (its weights ready), per
           share read
  lagrange shamir.lagrange_at_zero of LAGRANGE_T points, per point (its 2 t multiply-adds a
           point, counted apart as shamir, are ~2 % of it at this size)
  noise    numpy's Generator.standard_normal draws (the mechanisms' noise)
  stream   element operations of a numpy sum streamed through memory (acc += x, 8 MB vectors)
  sort     compare-moves of numpy's stable argsort of rows of SORT_ROW values (n log2 n a row),
           as algorithms/robust.closest_mean sorts
  gemm     FLOPs of a float64 matrix product x @ x.T (Krum's Gram matrix: 2 n^2 d counted),
           numpy's BLAS on one thread (as algorithms/robust.py runs it)
The measurement is noisy (a shared machine, frequency scaling); the profile it writes is not.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fednet.opcount import OPS
from fednet.secagg import crypto, shamir

PLAIN_BYTES = 8 + 8 + 2 * shamir.SHARE_BYTES  # a sealed share's plaintext (secagg/client.py)
REBUILD_T = 32  # the threshold of the measured reconstructions (between SecAgg+'s ~20 and
# full SecAgg's n / 2: the fixed part of a reconstruction, ~8 us, is ~15 % of it at this size)
LAGRANGE_T = 16  # the points of the measured Lagrange weights
UNMASK_ROWS = 64  # the shares in each measured unmask reply
SORT_ROW = 256  # the length of the rows of the measured argsort


@dataclass(frozen=True)
class Rate:
    """One operation's measurement: `amount` of it in `seconds`."""

    op: str
    amount: float
    seconds: float
    what: str

    @property
    def per_s(self) -> float:
        """The rate (amount a second)."""
        return self.amount / self.seconds


def measure(ops: tuple[str, ...] = OPS, scale: float = 1.0) -> dict[str, Rate]:
    """The rates of `ops` on this host; `scale` multiplies each workload's amount (1: about
    0.1 s a timing here, four timings each; tests use less)."""
    unknown = sorted(set(ops) - set(WORK))
    if unknown:
        raise ValueError(f"no measurement for {', '.join(unknown)}; one of {', '.join(OPS)}")
    if not scale > 0:
        raise ValueError("scale must be > 0")
    return {op: _timed(op, *WORK[op](scale)) for op in ops}


def _timed(op: str, run: Callable[[], float], what: str, tries: int = 3) -> Rate:
    """The fastest of `tries` CPU timings of `run` (after a warm-up): on a shared machine the
    others' load only ever slows a timing down (caches, memory bandwidth)."""
    run()  # warm-up: imports, allocations, caches
    best, amount = math.inf, 0.0
    for _ in range(tries):
        t0 = time.process_time()
        amount = run()
        best = min(best, time.process_time() - t0)
    return Rate(op, amount, max(best, 1e-9), what)


def _n(base: int, scale: float) -> int:
    return max(1, int(base * scale))


def _x25519(scale: float) -> tuple[Callable[[], float], str]:
    n = _n(3000, scale)
    seeds = [bytes([i % 256]) * 32 for i in range(n)]

    def run() -> float:
        for s in seeds:
            crypto.keypair(s)
        return n
    return run, f"{n} X25519 key pairs"


def _kdf(scale: float) -> tuple[Callable[[], float], str]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    n = _n(20000, scale)
    secret = bytes(range(32))

    def run() -> float:
        for i in range(n):
            HKDF(algorithm=hashes.SHA256(), length=crypto.KEY_BYTES, salt=None,
                 info=b"mask" + i.to_bytes(4, "big")).derive(secret)
        return n
    return run, f"{n} HKDF-SHA256 derivations"


def _aead(scale: float) -> tuple[Callable[[], float], str]:
    n = _n(20000, scale)
    key, plain, aad = bytes(32), bytes(PLAIN_BYTES), b"share"

    def run() -> float:
        for i in range(n):
            nonce = i.to_bytes(12, "big")
            crypto.unseal(key, nonce, crypto.seal(key, nonce, plain, aad), aad)
        return 2 * n
    return run, f"{n} seals and opens of {PLAIN_BYTES} bytes"


def _prg(scale: float) -> tuple[Callable[[], float], str]:
    n, d = _n(8, scale), 1 << 20

    def run() -> float:
        for i in range(n):
            crypto.mask(bytes([i]) * 32, d, np.dtype(np.uint64))
        return n * d * 8
    return run, f"{n} masks of {d} uint64"


def _shamir(scale: float) -> tuple[Callable[[], float], str]:
    n, k, t = _n(50, scale), 200, 100
    rng = np.random.default_rng(0)
    secret = bytes(range(32))

    def run() -> float:
        for _ in range(n):
            shamir.share(secret, range(k), t, rng)
        return n * k * t * shamir.chunks()
    return run, f"{n} shares among {k} at threshold {t}"


def _taken(scale: float) -> tuple[Callable[[], float], str]:
    from fednet.secagg import server  # (a leaf of fednet.secagg: no cycle)

    n, k = _n(400, scale), UNMASK_ROWS
    agg = server.Aggregation(0, list(range(k + 1)), {u: 1 for u in range(k + 1)}, None, 0.5,
                             32, np.random.default_rng(0))
    rng = np.random.default_rng(0)
    ids, none = np.arange(1, k + 1, dtype=np.int64), np.zeros(0, np.int64)
    rows = np.stack([np.frombuffer(shamir.encode_share(rng.integers(0, shamir.P, shamir.chunks())),
                                   np.uint8) for _ in range(k)])
    got: dict[str, np.ndarray] = {"b_of": ids, "b_share": rows, "s_of": none,
           "s_share": np.zeros((0, shamir.SHARE_BYTES), np.uint8)}
    asked = {"survivors": ids, "dropped": none}

    def run() -> float:
        for _ in range(n):
            if agg.take_unmask(0, got, asked):
                raise AssertionError("the measured reply is refused")
        return n * k
    return run, f"{n} unmask replies of {k} shares taken"


def _rebuilt(scale: float) -> tuple[Callable[[], float], str]:
    n = _n(2000, scale)
    rng = np.random.default_rng(0)
    held = [shamir.share(bytes([i % 256]) * 32, range(REBUILD_T), REBUILD_T, rng)
            for i in range(min(n, 64))]

    def run() -> float:
        for i in range(n):
            shamir.reconstruct(held[i % len(held)], REBUILD_T)
        return n * REBUILD_T
    return run, f"{n} reconstructions from {REBUILD_T} shares"


def _lagrange(scale: float) -> tuple[Callable[[], float], str]:
    n = _n(600, scale)
    xs = np.arange(1, LAGRANGE_T + 1, dtype=np.int64)

    def run() -> float:
        for _ in range(n):
            shamir.lagrange_at_zero(xs)
        return n * LAGRANGE_T
    return run, f"{n} sets of Lagrange weights of {LAGRANGE_T} points"


def _noise(scale: float) -> tuple[Callable[[], float], str]:
    n, d = _n(6, scale), 1 << 20
    g = np.random.default_rng(0)

    def run() -> float:
        for _ in range(n):
            g.standard_normal(d)
        return n * d
    return run, f"{n} x {d} normal draws"


def _stream(scale: float) -> tuple[Callable[[], float], str]:
    n, d = _n(96, scale), 1 << 20
    acc, x = np.zeros(d), np.ones(d)

    def run() -> float:
        for _ in range(n):
            np.add(acc, x, out=acc)
        return n * d
    return run, f"{n} sums of {d} float64"


def _sort(scale: float) -> tuple[Callable[[], float], str]:
    rows = _n(1 << 14, scale)
    x = np.abs(np.random.default_rng(0).standard_normal((rows, SORT_ROW)))

    def run() -> float:
        np.argsort(x, axis=1, kind="stable")
        return rows * SORT_ROW * math.log2(SORT_ROW)
    return run, f"a stable argsort of {rows} rows of {SORT_ROW} float64"


def _gemm(scale: float) -> tuple[Callable[[], float], str]:
    n, rows, cols = _n(1, scale), 1024, 8192
    x = np.random.default_rng(0).standard_normal((rows, cols))

    def run() -> float:
        with _one_blas_thread():  # as algorithms/robust.py runs it
            for _ in range(n):
                x @ x.T
        return n * 2.0 * rows * rows * cols
    return run, f"{n} products ({rows} x {cols}) @ its transpose, float64, 1 BLAS thread"


def _one_blas_thread() -> Any:
    """numpy's BLAS on one thread (threadpoolctl, scikit-learn's dependency), as
    algorithms/robust.one_blas_thread (this layer cannot import it)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


WORK: dict[str, Callable[[float], tuple[Callable[[], float], str]]] = {
    "x25519": _x25519, "kdf": _kdf, "aead": _aead, "prg": _prg, "shamir": _shamir,
    "taken": _taken, "rebuilt": _rebuilt, "lagrange": _lagrange, "noise": _noise,
    "stream": _stream, "sort": _sort, "gemm": _gemm}
"""Each operation's workload: scale -> (a call doing a fixed amount and returning it, what)."""
