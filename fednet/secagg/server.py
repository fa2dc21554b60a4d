"""The server's half of secure aggregation for one round: it routes what the clients send each
other (public keys, sealed shares: opaque to it), sums the masked inputs modulo 2^f, and at the
end removes the masks with the shares the survivors give back: each survivor's self mask
(its b rebuilt from t of its neighbours' shares) and, for each client that dropped after sharing,
its pairwise masks with the survivors (its s key rebuilt, checked against its public key). It
never sees a client's update: only masked vectors and their sum.

The round goes on while at least `need` clients survive each stage and every share it needs has
t holders left; otherwise SecAggFailed names the stage and the count."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fednet.secagg import client as C
from fednet.secagg import crypto, shamir
from fednet.secagg.field import dtype_of
from fednet.secagg.graph import neighbours

STAGES = ("keys", "shares", "input", "unmask")


def parse_drops(text: str) -> dict[str, float]:
    """--secagg-drop's STAGE:RATE[,STAGE:RATE...] as {stage: rate}; ValueError naming what is
    wrong (a stage of STAGES, a rate in [0, 1), each stage once)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        stage, colon, rate = part.partition(":")
        stage = stage.strip()
        try:
            r = float(rate) if colon else math.nan
        except ValueError:
            r = math.nan
        if stage not in STAGES or not 0 <= r < 1:
            raise ValueError(f"'{part}' is not STAGE:RATE with a stage of {', '.join(STAGES)} and "
                             "a rate in [0, 1) (e.g. input:0.1)")
        if stage in out:
            raise ValueError(f"stage {stage} is given twice")
        out[stage] = r
    return out


class SecAggFailed(Exception):
    """A round that cannot be unmasked: which stage, how many clients were left, how many it
    needed."""

    def __init__(self, stage: str, survivors: int, needed: int, why: str = "") -> None:
        super().__init__(f"secure aggregation failed at stage {stage}: {survivors} clients left, "
                         f"{needed} needed{'; ' + why if why else ''}")
        self.stage, self.survivors, self.needed = stage, survivors, needed


def threshold(k: int, fraction: float) -> int:
    """Shares needed to rebuild a secret shared among k neighbours: floor(fraction * k) + 1."""
    return min(k, int(math.floor(fraction * k)) + 1)


@dataclass
class Aggregation:
    """One round of the protocol, server side."""

    rnd: int
    cohort: list[int]
    weights: dict[int, int]          # the server's own partition sizes
    degree: int | None               # SecAgg+'s k (None: SecAgg, every other client)
    fraction: float                  # the share threshold, as a fraction of a client's neighbours
    fbits: int
    rng: np.random.Generator
    least: int = 2  # the fewest survivors a stage may leave (at least 2)
    graph: dict[int, list[int]] = field(default_factory=dict)
    pks: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    nbrs: dict[int, list[int]] = field(default_factory=dict)   # u -> its neighbours in U1
    t: dict[int, int] = field(default_factory=dict)
    routed: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # to -> from -> row
    total: np.ndarray | None = None
    inputs: set[int] = field(default_factory=set)               # U3
    b_shares: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # v -> holder -> share
    s_shares: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)             # U4
    used: set[bytes] = field(default_factory=set)               # the public keys taken
    liars: dict[int, str] = field(default_factory=dict)         # holders whose shares lied
    complaints: dict[int, set[int]] = field(default_factory=dict)  # sender -> who could not open
    excluded: dict[int, list[int]] = field(default_factory=dict)  # sender left out -> complainers
    remasked: bool = False  # the input stage was asked again, without the excluded
    windows: dict[tuple[int, str], tuple[int, ...]] = field(default_factory=dict)  # the first t
    # holders each secret was rebuilt from at once (first_windows; read by cost.unmasking)
    _u2: list[int] | None = field(default=None, repr=False, compare=False)  # shared()'s, kept

    def __post_init__(self) -> None:
        self.graph = neighbours(self.cohort, self.degree, self.rng)
        # at least 2: a sum of one input would be that client's update, in the clear (more
        # under distributed DP: the clients whose noise shares the sum must hold, `least`)
        self.need = max(2, self.least, int(math.floor(self.fraction * len(self.cohort))) + 1)

    def k(self) -> int:
        """The most neighbours a client of the round has (SecAgg: the cohort less one)."""
        return max((len(v) for v in self.graph.values()), default=0)

    def summed(self) -> int:
        """The masked inputs taken so far (U3)."""
        return len(self.inputs)

    def length(self) -> int:
        """The masked vector's length (0 before the first input)."""
        return 0 if self.total is None else int(self.total.size)

    def _check(self, stage: str, alive: int) -> None:
        if alive < self.need:
            raise SecAggFailed(stage, alive, self.need)

    # ---- keys ------------------------------------------------------------------------------
    def take_keys(self, cid: int, c_pk: np.ndarray, s_pk: np.ndarray,
                  seen: set[bytes] | frozenset[bytes] = frozenset()) -> str:
        """A client's two public keys ('' or why they are refused: not usable X25519 keys, the
        same key twice, or a key of an earlier round (`seen`): a replay)."""
        c, s = bytes(c_pk), bytes(s_pk)
        for name, k in (("c_pk", c), ("s_pk", s)):
            if not crypto.usable(k):
                return f"its public key {name} is not a usable X25519 key (a low-order point)"
            if k in seen:
                return f"its public key {name} is one of an earlier round (a replay)"
        if c == s or c in self.used or s in self.used:
            return "its public keys repeat a key of this round"
        self.pks[cid] = (c, s)
        self.used.update((c, s))
        return ""

    def share_requests(self) -> dict[int, dict[str, np.ndarray]]:
        """After the keys stage: each client's neighbours that advertised keys, their keys."""
        self._check("keys", len(self.pks))
        out = {}
        for u in sorted(self.pks):
            nb = [v for v in self.graph[u] if v in self.pks]
            if not nb:
                continue
            self.nbrs[u], self.t[u] = nb, threshold(len(nb), self.fraction)
            out[u] = {"nbrs": np.array(nb, np.int64),
                      "c_pks": _keys([self.pks[v][0] for v in nb]),
                      "s_pks": _keys([self.pks[v][1] for v in nb])}
        return out

    # ---- shares ----------------------------------------------------------------------------
    def take_shares(self, cid: int, to: np.ndarray, sealed: np.ndarray) -> str:
        """A client's sealed shares, one per neighbour asked ('' or why they are refused)."""
        if cid not in self.nbrs or [int(v) for v in to] != self.nbrs[cid]:
            return "its shares are not for the neighbours it was given"
        for v, row in zip(self.nbrs[cid], sealed):
            self.routed.setdefault(v, {})[cid] = row
        self._u2 = None
        return ""

    def shared(self) -> list[int]:
        """U2: the clients whose shares the server holds (less those left out for shares
        that did not open: remask_requests). Computed once after the shares stage (a pass over
        every routed share), kept until a share is taken or a sender left out."""
        if self._u2 is None:
            self._u2 = sorted({u for rows in self.routed.values() for u in rows}
                              - set(self.excluded))
        return list(self._u2)

    def input_requests(self) -> dict[int, dict[str, np.ndarray]]:
        """After the shares stage: each client's shares from its neighbours, and its mask
        partners (its neighbours that shared)."""
        u2 = set(self.shared())
        self._check("shares", len(u2))
        out = {}
        for u in sorted(u2):
            rows = self.routed.get(u, {})
            senders = sorted(v for v in rows if v in u2)
            out[u] = {"from": np.array(senders, np.int64),
                      "sealed": (np.stack([rows[v] for v in senders]) if senders
                                 else np.zeros((0, C.SEALED_BYTES), np.uint8)),
                      "partners": np.array([v for v in self.nbrs[u] if v in u2], np.int64)}
        return out

    # ---- input -----------------------------------------------------------------------------
    def take_input(self, cid: int, y: np.ndarray) -> None:
        """A masked input: added to the sum modulo 2^f."""
        if self.total is None:
            self.total = y.copy()
        elif self.total.dtype == np.result_type(self.total, y) and self.total.shape == y.shape:
            np.add(self.total, y, out=self.total)  # (its own copy: in place, the same sum)
        else:
            self.total = self.total + y
        self.inputs.add(cid)

    def complain(self, cid: int, bad: list) -> str:
        """A survivor's complaint at the input stage: the senders whose sealed shares did not
        open at it ('' or why the complaint itself is refused: not senders the server routed
        to it, or a complaint with an input asked again). Those senders are left out of the
        round (remask_requests)."""
        sent = set(self.routed.get(cid, {}))  # (to -> from -> row)
        got = [v for v in bad if isinstance(v, int) and not isinstance(v, bool)]
        if len(got) != len(bad) or not set(got) <= sent:
            return "its complaint names clients whose shares the server did not route to it"
        if got and self.remasked:
            return "it complains with an input asked again (the shares were opened before)"
        for v in got:
            self.complaints.setdefault(v, set()).add(cid)
        return ""

    def accused(self) -> dict[int, list[int]]:
        """The senders whose sealed shares did not open at a survivor of the input stage, and
        at whom (a sender's bad share and a receiver's false complaint look the same to the
        server: either way the sender is left out, and only it loses its part)."""
        if self.remasked:
            return {}
        return {v: sorted(by & self.inputs) for v, by in sorted(self.complaints.items())
                if by & self.inputs}

    def remask_requests(self) -> dict[int, dict[str, np.ndarray]]:
        """After an input stage with complaints: the accused senders left out, as if they had
        dropped out at the shares stage (no survivor masks with them, their input is not
        summed, no secret of theirs is asked), and the input stage asked again of the other
        survivors: each client's same update masked with its partners less the left out. The
        first masked inputs are discarded: a survivor that masked with a sender whose share
        it could open would otherwise need that sender's key rebuilt, from shares that may
        open nowhere. Honest rounds never take this round trip."""
        self.excluded, self._u2 = self.accused(), None
        survivors = self.inputs - set(self.excluded)
        self.total, self.inputs, self.remasked = None, set(), True
        self._check("input", len(survivors))
        u2 = set(self.shared())
        return {u: {"partners": np.array([v for v in self.nbrs[u] if v in u2], np.int64)}
                for u in sorted(survivors)}

    def unmask_requests(self) -> dict[int, dict[str, np.ndarray]]:
        """After the input stage: of the neighbours whose shares each survivor holds, who
        survived (their b share asked) and who dropped (their s share asked)."""
        self._check("input", len(self.inputs))
        u2 = set(self.shared())
        out = {}
        for u in sorted(self.inputs):
            held = [v for v in self.nbrs[u] if v in u2]
            out[u] = {"survivors": np.array([v for v in held if v in self.inputs], np.int64),
                      "dropped": np.array([v for v in held if v not in self.inputs], np.int64)}
        return out

    # ---- unmask ----------------------------------------------------------------------------
    def take_unmask(self, cid: int, got: dict[str, np.ndarray],
                    asked: dict[str, np.ndarray]) -> str:
        """A survivor's shares ('' or why they are refused: not what it was asked)."""
        if ([int(v) for v in got["b_of"]] != [int(v) for v in asked["survivors"]]
                or [int(v) for v in got["s_of"]] != [int(v) for v in asked["dropped"]]):
            return "its shares are not of the clients it was asked about"
        for of, rows, into in ((got["b_of"], got["b_share"], self.b_shares),
                               (got["s_of"], got["s_share"], self.s_shares)):
            ids = np.asarray(of).tolist()
            if not ids:
                continue
            rows = np.asarray(rows)
            if rows.ndim != 2 or rows.shape[1] != shamir.SHARE_BYTES:
                return f"a share is {shamir.SHARE_BYTES} bytes"
            y, ok = shamir.decode_rows(rows[:len(ids)])  # (every share of the reply at once)
            bad = int(np.argmin(ok)) if not ok.all() else len(ids)
            for v, row in zip(ids[:bad], y):  # (those before a wrong one taken, as one by one)
                into.setdefault(v, {})[cid] = row
            if bad < len(ids):
                return "a share is field elements"
        self.answered.add(cid)
        return ""

    def result(self, levels: int = 0, outside: Callable[[np.ndarray, int], int] | None = None
               ) -> tuple[np.ndarray, int]:
        """(sum_u n_u q_u over the survivors, sum_u n_u): every mask removed. With `levels`
        (2^bits - 1), SecAggFailed when a value lies outside [0, levels sum_u n_u], where every
        honest sum lies: a wrong masked input or a lying share (the masks left in make the
        values uniform modulo 2^f, nearly all far outside). Each secret is rebuilt from its
        first t holders; only when that fails (out of the bound, an s key not its own, shares
        that rebuild nothing) are the secrets checked against a second window of holders, a
        lying holder found and taken out, and the sum unmasked again (`careful`). `outside`
        (total, weight): how many values lie outside the bound, in place of `levels`' (signed
        values: distributed DP's)."""
        for careful in (False, True):
            try:
                total = self._unmasked(careful)
                self._bounded(total, levels, outside)
                return total, sum(self.weights[u] for u in self.inputs)
            except SecAggFailed:
                if careful:
                    raise
        raise AssertionError("unreachable")

    def _bounded(self, total: np.ndarray, levels: int,
                 outside: Callable[[np.ndarray, int], int] | None = None) -> None:
        weight = sum(self.weights[u] for u in self.inputs)
        if outside is not None:
            over, bound = outside(total, weight), "the bound honest clients' sums keep"
        else:
            over = int(np.count_nonzero(total > np.uint64(levels * weight))) if levels else 0
            bound = f"its bound [0, {levels * weight}]"
        if over:
            raise SecAggFailed("unmask", len(self.answered), self.need, (
                f"the unmasked sum is outside {bound} in {over} of {total.size} values: a "
                "client sent a wrong masked input or share"))

    def _unmasked(self, careful: bool) -> np.ndarray:
        b_of, s_of = self._secrets(careful)
        assert self.total is not None
        total = np.array(self.total, dtype_of(self.fbits), copy=True)  # (masks removed in place)
        for v in sorted(self.inputs):
            crypto.add_mask(total, b_of[v], -1)
        for v, s_sk in sorted(s_of.items()):
            key = crypto.private(s_sk)  # (built once: one exchange per neighbour)
            if crypto.public(key) != self.pks[v][1]:
                raise SecAggFailed("unmask", len(self.answered), self.need,
                                   f"the s key rebuilt for client {v} is not its own")
            for w in (x for x in self.nbrs[v] if x in self.inputs):
                crypto.add_mask(total, C.pair_key(key, self.pks[w][1], self.rnd),
                                -1 if w < v else 1)
        return total

    def _secrets(self, careful: bool) -> tuple[dict[int, bytes], dict[int, bytes]]:
        """Every survivor's b and every dropped client's s key, rebuilt from the unmask
        shares; `careful`: checked against a second window of holders, a holder whose shares
        prove wrong (Liar) taken out, as if it had not answered the unmask stage, and the
        secrets rebuilt without it."""
        while True:
            self._check("unmask", len(self.answered))
            self.windows = {}
            try:
                b_ids, s_ids = sorted(self.inputs), sorted(set(self.shared()) - self.inputs)
                ready = {} if careful else self.first_windows(
                    [(v, self.b_shares) for v in b_ids] + [(v, self.s_shares) for v in s_ids])
                b_of = {v: ready.get((v, "b")) or self._rebuild(v, self.b_shares, "b", careful)
                        for v in b_ids}
                s_of = {v: ready.get((v, "s")) or self._rebuild(v, self.s_shares, "s", careful)
                        for v in s_ids}
                return b_of, s_of
            except Liar as e:
                self.answered.discard(e.holder)
                self.liars[e.holder] = str(e)

    def first_windows(self, which: list[tuple[int, dict[int, dict[int, np.ndarray]]]]
                      ) -> dict[tuple[int, str], bytes]:
        """The secrets _rebuild (not careful) gives, all at once (shamir.reconstruct_many of
        each secret's first t answered holders): (client, 'b' or 's') -> secret, for those that
        rebuild; the others (too few shares, a window that rebuilds nothing) are left to
        _rebuild, which raises what it raises. The holders each was rebuilt from: `windows`."""
        items, keys = [], []
        for v, shares in which:
            held, t = shares.get(v, {}), self.t[v]
            first = shamir.first_holders(held, self.answered, t)
            if len(first) >= t:
                items.append(({h: held[h] for h in first}, t))
                keys.append((v, "b" if shares is self.b_shares else "s"))
                self.windows[keys[-1]] = first
        return {k: r for k, r in zip(keys, shamir.reconstruct_many(items))
                if isinstance(r, bytes)}

    def _rebuild(self, v: int, shares: dict[int, dict[int, np.ndarray]], what: str,
                 careful: bool) -> bytes:
        got = {h: y for h, y in shares.get(v, {}).items() if h in self.answered}
        t = self.t[v]
        if len(got) < t:
            raise SecAggFailed("unmask", len(self.answered), self.need,
                               f"client {v}'s {what} needs {t} shares, {len(got)} came")
        try:
            if not careful:
                return shamir.reconstruct(got, t)  # (its first t holders)
            secret = _rebuilt(got, t)
            if secret is not None:
                return secret
            liar = _liar(got, t)  # two windows disagree: find the one holder who lied
            if liar is None:
                raise ValueError("the holders' shares disagree and no one holder explains it "
                                 "(more than one lied, or too few answered to tell)")
            raise Liar(liar, f"its share of client {v}'s {what} disagrees with the other "
                       "holders'")
        except ValueError as e:
            raise SecAggFailed("unmask", len(self.answered), self.need,
                               f"client {v}'s {what}: {e}") from None


class Liar(Exception):
    """A holder whose unmask share is proven wrong by the others."""

    def __init__(self, holder: int, why: str) -> None:
        super().__init__(why)
        self.holder = holder


def _rebuilt(got: dict[int, np.ndarray], t: int) -> bytes | None:
    """The secret from the first t holders (in id order); None when more than t holders
    answered and the last t rebuild another secret, or either window none (a holder lied).
    Holders between the two windows are not read: a wrong share there changes nothing."""
    holders = sorted(got)
    if len(holders) == t:  # nothing to compare with (a bad share: ValueError, or unseen)
        return shamir.reconstruct(got, t)
    try:
        secret = shamir.reconstruct({h: got[h] for h in holders[:t]}, t)
        other = shamir.reconstruct({h: got[h] for h in holders[-t:]}, t)
    except ValueError:  # a window that rebuilds no secret at all
        return None
    return secret if other == secret else None


def _liar(got: dict[int, np.ndarray], t: int) -> int | None:
    """The one holder without whom the rest agree (None when no single holder explains the
    disagreement): with one wrong share in a window, leaving it out is the only way both
    windows agree, and leaving out another holder keeps it in its window."""
    holders = sorted(got)
    suspects = set(holders[:t]) | set(holders[-t:])
    found = [h for h in sorted(suspects) if len(got) - 1 > t
             and _rebuilt({k: y for k, y in got.items() if k != h}, t) is not None]
    return found[0] if len(found) == 1 else None


def _keys(keys: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), crypto.KEY_BYTES).copy()
