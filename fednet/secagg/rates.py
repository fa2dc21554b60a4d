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
  mask     crypto.add_mask of a one-value vector (the keystream's key setup and call)
  shamir   shamir.share's multiply-adds (parties x threshold x chunks)
  reply    secagg/server.Aggregation.take_unmask of a reply of one share, per reply, each
           reply timed cold (class Cold: the server takes each reply between its other work; a
           reply back to back with the last is ~3x faster, and a round's ~1.3-1.5x slower
           than that: the timing a round meets)
  taken    secagg/server.Aggregation.take_unmask of replies of UNMASK_ROWS shares (each cold),
           per share, less the replies' seconds at the reply rate
  secret   secagg/server.Aggregation.first_windows (the answered holders' shares picked, then
           shamir.reconstruct_many; each call cold) of secrets of SECRET_T shares (each its own
           set of holders),
  rebuilt  and of REBUILD_T shares (likewise): their seconds less the weights' at the
           lagrange rate, split into a part per secret (secret) and a part per share read
           (rebuilt) that fit both timings exactly
  held     the secret timing's secrets each held by HELD_EXTRA more holders (after its first
           t): their seconds less the secret timing's, per more holder
  lagrange shamir.lagrange_rows of REBUILD_S sets of REBUILD_T points, per element operation
           (secagg/cost.lagrange)
  noise    numpy's Generator.standard_normal draws (the mechanisms' noise)
  stream   element operations of a numpy sum streamed through memory (acc += x, 8 MB vectors)
  sort     compare-moves of numpy's stable argsort of rows of SORT_ROW values (n log2 n a row),
           as algorithms/robust.closest_mean sorts
  gemm     FLOPs of a float64 matrix product x @ x.T (Krum's Gram matrix: 2 n^2 d counted),
           numpy's BLAS on one thread (as algorithms/robust.py runs it)
  code     int8's 9 passes (compress/codecs.q8_encode: min, max, two repeats, subtract,
           divide, rint, clip, cast) over CODE_VALUES float32, per element a pass
  select   top-k's selection (codecs.topk_encode: |x|, argpartition at 1 % kept, the kept
           indices sorted) among CODE_VALUES float32, per element
  field    secagg/field.quantize of CODE_VALUES float64 (fewer at a scale below 1) onto --compress int8's common grid (L
           254, a 32-bit field, as a SecAgg+ client's input at 100 clients) and field.pack of
           the result in wire_bits(100, 254) bits: the passes they count (secagg/cost.quantized
           and packed, 42 + 70 a value) over their CPU seconds
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
from fednet.secagg import cost, crypto, field, shamir

Work = tuple[Callable[[], Any], str]
"""A workload: a call doing a fixed amount (returned; or (amount, seconds): it timed itself,
cold) and what it is."""
PLAIN_BYTES = 8 + 8 + 2 * shamir.SHARE_BYTES  # a sealed share's plaintext (secagg/client.py)
REBUILD_T, REBUILD_S = 64, 128  # threshold and count of the reconstructions timed per share
SECRET_T, SECRET_S = 2, 2048  # and per secret
HELD_EXTRA = 62  # the more holders of each secret timed per share held (the secrets' above)
EVICT_BYTES = 8 << 20  # the caches' eviction before each cold timing (class Cold)
UNMASK_ROWS = 512  # the shares in each measured unmask reply (full SecAgg's order)
SORT_ROW = 256  # the length of the rows of the measured argsort
CODE_VALUES = 3 << 22  # the float32 vector of the measured codec passes and selections: 48 MB,
# above glibc's largest mmap threshold (32 MB), so that each pass's new array is fresh pages, as
# a large model's (ResNet-18's 45 MB) are; a smaller one reuses the heap's, ~1.4x faster here


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
    got = {op: _timed(op, *WORK[op](scale)) for op in ops}
    if "taken" in got:  # its replies' own work: counted apart (reply)
        rep = got.get("reply") or _timed("reply", *WORK["reply"](scale))
        r = got["taken"]
        replies = r.amount / UNMASK_ROWS / rep.per_s
        got["taken"] = Rate("taken", r.amount, max(r.seconds - replies, 0.1 * r.seconds),
                            f"{r.what}, less the replies' {replies:.3g} s at the reply rate")
    if "held" in got:  # the same secrets' timing without the more holders taken away
        few = got.get("secret") or _timed("secret", *WORK["secret"](scale))
        h = got["held"]
        less = few.seconds * h.amount / HELD_EXTRA / few.amount
        got["held"] = Rate("held", h.amount, max(h.seconds - less, 0.1 * h.seconds),
                           f"{h.what}, less the same secrets' {less:.3g} s without them")
    if "rebuilt" in got or "secret" in got:  # reconstruct_many's parts, split (see above)
        for op in ("rebuilt", "secret", "lagrange"):
            if op not in got:
                got[op] = _timed(op, *WORK[op](scale))
        got.update(_split(got["rebuilt"], got["secret"], got["lagrange"]))
        got = {op: got[op] for op in ops}
    bad = [f"{r.op} {r.seconds:.3g} s" for r in got.values() if not r.seconds > 0]
    if bad:  # a part left after taking another away: the timings disagree (a loaded machine)
        raise RuntimeError(f"the protocol rates' timings do not fit ({', '.join(bad)}): measure "
                           "again on a quieter machine")
    return got


def _timed(op: str, run: Callable[[], Any], what: str, tries: int = 3) -> Rate:
    """The fastest of `tries` CPU timings of `run` (after a warm-up): on a shared machine the
    others' load only ever slows a timing down (caches, memory bandwidth). A run that times
    itself (cold: `Cold`) returns (amount, seconds)."""
    run()  # warm-up: imports, allocations, caches
    best, amount = math.inf, 0.0
    for _ in range(tries):
        t0 = time.process_time()
        got = run()
        took = time.process_time() - t0
        amount, took = got if isinstance(got, tuple) else (got, took)
        best = min(best, took)
    return Rate(op, amount, max(best, 1e-9), what)


class Cold:
    """CPU seconds of calls each made with the caches cold, as the server makes the unmask
    stage's: it takes each reply as it arrives, between its other work (and, in fednet local,
    the clients' own), and rebuilds the secrets from shares taken over the whole stage. Before
    each timed call a pass over EVICT_BYTES (more than a core's L2 cache) evicts what the last
    call left there; the seconds of the timer's own calls are taken away."""

    def __init__(self) -> None:
        self.scratch = np.ones(EVICT_BYTES // 8)
        t0 = time.process_time()
        for _ in range(1000):
            a = time.process_time()
            time.process_time() - a
        self.tick = (time.process_time() - t0) / 1000  # (a timing's own cost)
        self.seconds = 0.0

    def __call__(self, f: Callable[[], Any]) -> Any:
        """f(), timed cold (added to `seconds`)."""
        self.scratch.sum()
        t0 = time.process_time()
        out = f()
        self.seconds += max(time.process_time() - t0 - self.tick, 0.0)
        return out


def _n(base: int, scale: float) -> int:
    return max(1, int(base * scale))


def _x25519(scale: float) -> Work:
    n = _n(3000, scale)
    seeds = [bytes([i % 256]) * 32 for i in range(n)]

    def run() -> float:
        for s in seeds:
            crypto.keypair(s)
        return n
    return run, f"{n} X25519 key pairs"


def _kdf(scale: float) -> Work:
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


def _aead(scale: float) -> Work:
    n = _n(20000, scale)
    key, plain, aad = bytes(32), bytes(PLAIN_BYTES), b"share"

    def run() -> float:
        for i in range(n):
            nonce = i.to_bytes(12, "big")
            crypto.unseal(key, nonce, crypto.seal(key, nonce, plain, aad), aad)
        return 2 * n
    return run, f"{n} seals and opens of {PLAIN_BYTES} bytes"


def _prg(scale: float) -> Work:
    n, d = _n(8, scale), 1 << 20

    def run() -> float:
        for i in range(n):
            crypto.mask(bytes([i]) * 32, d, np.dtype(np.uint64))
        return n * d * 8
    return run, f"{n} masks of {d} uint64"


def _mask(scale: float) -> Work:
    n = _n(12000, scale)
    y = np.zeros(1, np.uint32)

    def run() -> float:
        for i in range(n):
            crypto.add_mask(y, bytes([i % 256]) * 32, -1)
        return n
    return run, f"{n} masks of one value"


def _shamir(scale: float) -> Work:
    n, k, t = _n(50, scale), 200, 100
    rng = np.random.default_rng(0)
    secret = bytes(range(32))

    def run() -> float:
        for _ in range(n):
            shamir.share(secret, range(k), t, rng)
        return n * k * t * shamir.chunks()
    return run, f"{n} shares among {k} at threshold {t}"


def _replies(k: int, n: int) -> Work:
    """n unmask replies of k shares each taken (Aggregation.take_unmask), each from its own
    client into a round's fresh tables, as a round takes them; amount n."""
    from fednet.secagg import server  # (a leaf of fednet.secagg: no cycle)

    m = max(n, k + 1)
    agg = server.Aggregation(0, list(range(m)), {u: 1 for u in range(m)}, 2, 0.5, 32,
                             np.random.default_rng(0))
    rng = np.random.default_rng(0)
    rows = np.stack([np.frombuffer(shamir.encode_share(rng.integers(0, shamir.P, shamir.chunks())),
                                   np.uint8) for _ in range(k)])
    none, no_rows = np.zeros(0, np.int64), np.zeros((0, shamir.SHARE_BYTES), np.uint8)
    replies: list[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]] = []
    for cid in range(n):
        ids = np.sort((cid + 1 + np.arange(k)) % m).astype(np.int64)
        replies.append((cid, {"b_of": ids, "b_share": rows.copy(), "s_of": none,
                              "s_share": no_rows}, {"survivors": ids, "dropped": none}))

    def run() -> tuple[float, float]:
        agg.b_shares, agg.answered = {}, set()
        cold = Cold()
        for cid, got, asked in replies:
            if cold(lambda: agg.take_unmask(cid, got, asked)):  # noqa: B023 (called at once)
                raise AssertionError("the measured reply is refused")
        return n, cold.seconds
    return run, f"{n} unmask replies of {k} shares taken, each cold"


def _reply(scale: float) -> Work:
    return _replies(1, _n(2000, scale))  # (each cold: ~0.4 ms of eviction a reply)


def _taken(scale: float) -> Work:
    n = _n(500, scale)
    run, what = _replies(UNMASK_ROWS, n)
    return (lambda: _times(run(), UNMASK_ROWS)), what


def _times(got: Any, k: int) -> tuple[float, float]:
    """A cold timing's (amount, seconds) with the amount k times as many."""
    return got[0] * k, got[1]


def _split(many: Rate, few: Rate, lag: Rate) -> dict[str, Rate]:
    """The reconstructions' seconds less their weights' (lagrange), as a seconds per secret a
    and per share read b fitting both timings: few (SECRET_T shares a secret) and many
    (REBUILD_T)."""
    from fednet.secagg import cost

    s1, s2 = few.amount, many.amount / REBUILD_T
    t1 = (few.seconds - s1 * cost.lagrange(SECRET_T) / lag.per_s) / s1
    t2 = (many.seconds - s2 * cost.lagrange(REBUILD_T) / lag.per_s) / s2
    b = max((t2 - t1) / (REBUILD_T - SECRET_T), 0.1 * t2 / REBUILD_T)
    a = max(t1 - SECRET_T * b, 0.1 * t1)
    how = "less its weights' seconds at the lagrange rate, split per secret and per share"
    return {"secret": Rate("secret", s1, s1 * a, f"{few.what}, {how}"),
            "rebuilt": Rate("rebuilt", many.amount, many.amount * b, f"{many.what}, {how}")}


def _reconstructions(n: int, k: int, t: int, extra: int = 0) -> Work:
    """n times k secrets of threshold t rebuilt at once as the server rebuilds a round's
    (Aggregation.first_windows: the answered holders' shares picked, then
    shamir.reconstruct_many); amount n k. Each secret has its own set of t holders (the t - 1
    first clients and one of its own), so that reconstruct_many computes k sets of weights a
    call, as _split takes away (it computes a set's weights once for all the secrets that share
    it, as cost.unmasking counts them)."""
    from fednet.secagg import server  # (a leaf of fednet.secagg: no cycle)

    rng = np.random.default_rng(0)
    pool = list(range(t - 1 + k))
    agg = server.Aggregation(0, pool, {u: 1 for u in pool}, 2, 0.5, 32, rng)
    late = range(t - 1 + k, t - 1 + k + extra)  # (ids after every secret's first t holders)
    agg.answered = set(pool) | set(late)
    agg.b_shares = {v: shamir.share(bytes([v % 256]) * 32, [*range(t - 1), t - 1 + v, *late], t,
                                    rng) for v in range(k)}
    agg.t = {v: t for v in range(k)}
    which = [(v, agg.b_shares) for v in range(k)]

    def run() -> tuple[float, float]:
        cold = Cold()
        for _ in range(n):
            if len(cold(lambda: agg.first_windows(which))) != k:
                raise AssertionError("a measured secret did not rebuild")
        return n * k, cold.seconds
    return run, (f"{n} x {k} secrets rebuilt at once from {t} shares, each its own set of "
                 f"holders" + (f" and {extra} more holders" if extra else ""))


def _rebuilt(scale: float) -> Work:
    run, what = _reconstructions(_n(16, scale), _n(REBUILD_S, min(scale, 1.0)), REBUILD_T)
    return (lambda: _times(run(), REBUILD_T)), what


def _secret(scale: float) -> Work:
    return _reconstructions(_n(4, scale), _n(SECRET_S, min(scale, 1.0)), SECRET_T)


def _held(scale: float) -> Work:
    n, k = _n(4, scale), _n(SECRET_S, min(scale, 1.0))
    run, what = _reconstructions(n, k, SECRET_T, HELD_EXTRA)
    return (lambda: _times(run(), HELD_EXTRA)), what


def _lagrange(scale: float) -> Work:
    from fednet.secagg import cost  # (cost imports shamir only)

    n, k = _n(24, scale), _n(REBUILD_S, min(scale, 1.0))
    rng = np.random.default_rng(0)
    xs = np.array([np.sort(rng.permutation(2 * REBUILD_T)[:REBUILD_T]) for _ in range(k)],
                  np.int64) + 1

    def run() -> float:
        for _ in range(n):
            shamir.lagrange_rows(xs)
        return n * k * cost.lagrange(REBUILD_T)
    return run, f"{n} x the Lagrange weights of {k} sets of {REBUILD_T} points"


def _noise(scale: float) -> Work:
    n, d = _n(6, scale), 1 << 20
    g = np.random.default_rng(0)

    def run() -> float:
        for _ in range(n):
            g.standard_normal(d)
        return n * d
    return run, f"{n} x {d} normal draws"


def _stream(scale: float) -> Work:
    n, d = _n(96, scale), 1 << 20
    acc, x = np.zeros(d), np.ones(d)

    def run() -> float:
        for _ in range(n):
            np.add(acc, x, out=acc)
        return n * d
    return run, f"{n} sums of {d} float64"


def _sort(scale: float) -> Work:
    rows = _n(1 << 14, scale)
    x = np.abs(np.random.default_rng(0).standard_normal((rows, SORT_ROW)))

    def run() -> float:
        np.argsort(x, axis=1, kind="stable")
        return rows * SORT_ROW * math.log2(SORT_ROW)
    return run, f"a stable argsort of {rows} rows of {SORT_ROW} float64"


def _gemm(scale: float) -> Work:
    n, rows, cols = _n(1, scale), 1024, 8192
    x = np.random.default_rng(0).standard_normal((rows, cols))

    def run() -> float:
        with _one_blas_thread():  # as algorithms/robust.py runs it
            for _ in range(n):
                x @ x.T
        return n * 2.0 * rows * rows * cols
    return run, f"{n} products ({rows} x {cols}) @ its transpose, float64, 1 BLAS thread"


def _code(scale: float) -> Work:
    n, d = _n(1, scale), CODE_VALUES
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    sizes = [d // 2, d - d // 2]  # (two tensors, as compress/codecs.q8_encode takes them)

    def run() -> float:
        for _ in range(n):  # int8's passes (compress/codecs.q8_encode, which this layer
            b = [0, sizes[0], d]  # cannot import)
            lo = np.array([x[b[i]:b[i + 1]].min() for i in range(2)], np.float32)
            hi = np.array([x[b[i]:b[i + 1]].max() for i in range(2)], np.float32)
            step = ((hi - lo) / 255).astype(np.float32)
            q = np.rint((x - np.repeat(lo, sizes)) / np.repeat(step, sizes))
            np.clip(q, 0, 255).astype(np.uint8)
        return n * 9 * d
    return run, (f"{n} x int8's 9 passes over {d} float32 (min, max, two repeats, subtract, "
                 "divide, rint, clip, cast)")


def _select(scale: float) -> Work:
    n, d = _n(1, scale), CODE_VALUES
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    k = d // 100

    def run() -> float:
        for _ in range(n):  # (top-k's: compress/codecs.topk_encode)
            np.sort(np.argpartition(np.abs(x), d - k)[d - k:])
        return n * d
    return run, f"{n} top-1 % selections among {d} float32"


FIELD_GRID, FIELD_COHORT = 254, 100  # the field timing's grid (int8's L) and its wire bits' cohort


def _field(scale: float) -> Work:
    # a ResNet-18-sized update (CODE_VALUES): the work's per-value seconds grow with the vector,
    # 36 -> 47 quantize passes and 55 -> 82-96 pack passes from 1 M to 11.2 M values
    # (secagg/cost.py); a scale below 1 (tests, a quick --ops-scale) times a smaller one, whose
    # rate comes out high (each timing here is ~0.55 s at scale 1)
    n = _n(1, scale)
    d = CODE_VALUES if scale >= 1 else max(1 << 16, int(CODE_VALUES * scale))
    x = np.random.default_rng(0).standard_normal(d)
    wbits = field.wire_bits(FIELD_COHORT, FIELD_GRID)
    fbits = field.field_bits(FIELD_COHORT, 0, levels=FIELD_GRID)
    per_value = sum(cost.quantized(1).values()) + sum(cost.packed(1).values())

    def run() -> float:
        g = np.random.default_rng(1)
        for _ in range(n):
            field.pack(field.quantize(x, 8.0, 16, 1, fbits, g, FIELD_GRID), wbits)
        return n * per_value * d
    return run, (f"{n} x field.quantize of {d} float64 (L {FIELD_GRID}, {fbits}-bit field) and "
                 f"field.pack in {wbits} bits")


def _one_blas_thread() -> Any:
    """numpy's BLAS on one thread (threadpoolctl, scikit-learn's dependency), as
    algorithms/robust.one_blas_thread (this layer cannot import it)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


WORK: dict[str, Callable[[float], Work]] = {
    "x25519": _x25519, "kdf": _kdf, "aead": _aead, "prg": _prg, "mask": _mask,
    "shamir": _shamir, "reply": _reply, "taken": _taken, "secret": _secret,
    "rebuilt": _rebuilt, "held": _held, "lagrange": _lagrange, "noise": _noise,
    "stream": _stream, "sort": _sort, "gemm": _gemm, "code": _code, "select": _select,
    "field": _field}
"""Each operation's workload: scale -> (a call doing a fixed amount and returning it, what)."""
