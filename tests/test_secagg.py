"""Secure aggregation's pieces and the protocol run between a server and clients in one
process, without the round driver: Shamir's sharing (known vectors, any t shares rebuild, t-1
shares are uniformly distributed), the neighbour graphs, the sealed shares, and an unmasked sum
equal, bit for bit, to the sum of the clients' quantized vectors computed on the clients' side,
with and without dropouts at every stage; a round that cannot be unmasked says which stage."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.secagg import client as C
from fednet.secagg import crypto, field, shamir
from fednet.secagg.graph import default_neighbours, neighbours
from fednet.secagg.server import Aggregation, SecAggFailed


def test_shamir_rebuilds_from_any_t_shares_and_a_known_vector():
    rng = np.random.default_rng(0)
    secret = b"fednet secure aggregation secret"
    sh = shamir.share(secret, list(range(7)), 4, rng)
    for pick in ([0, 1, 2, 3], [6, 4, 2, 0], [1, 3, 5, 6], list(range(7))):
        assert shamir.reconstruct({p: sh[p] for p in pick}, 4) == secret
    with pytest.raises(ValueError, match="3 shares, 4 needed"):
        shamir.reconstruct({p: sh[p] for p in (0, 1, 2)}, 4)
    # a known vector: f(x) = 42 + 7x + 3x^2 in every chunk, at x = 1, 2, 3 (parties 0, 1, 2)
    k = shamir.chunks()
    pts = {p: np.full(k, 42 + 7 * (p + 1) + 3 * (p + 1) ** 2, np.int64) for p in range(3)}
    got = shamir.reconstruct(pts, 3)
    assert shamir.split(got).tolist() == [42] * k
    assert np.array_equal(shamir.decode_share(shamir.encode_share(sh[3])), sh[3])
    assert np.array_equal(shamir.lagrange_at_zero(np.array([1, 2, 3])),
                          np.array([3, shamir.P - 3, 1]))  # 3, -3, 1


def test_fewer_than_t_shares_reveal_nothing_of_the_secret():
    """With t - 1 = 1 share, the share's distribution is the same for two different secrets:
    uniform over the field, chunk by chunk (each chunk's top bit set half of the time)."""
    rng = np.random.default_rng(1)
    for secret in (bytes(32), b"\xff" * 32):
        tops = np.stack([shamir.share(secret, [0, 1], 2, rng)[0] >> 30 for _ in range(3000)])
        assert np.all(np.abs(tops.mean(axis=0) - 0.5) < 0.04), (secret[:1], tops.mean(axis=0))


def test_neighbour_graphs_are_symmetric_and_regular():
    rng = np.random.default_rng(2)
    full = neighbours(range(6), None, rng)
    assert full[3] == [0, 1, 2, 4, 5]
    g = neighbours(range(100), 8, rng)
    assert all(len(v) == 8 for v in g.values())
    assert all(u in g[v] for u in g for v in g[u])
    assert default_neighbours(3) == 2 and default_neighbours(40, 0.3) == 39  # the full graph


@pytest.mark.parametrize("n,dropout", [(1000, 0.1), (1000, 0.3), (5000, 0.2)])
def test_the_default_degree_is_the_fewest_that_keep_enough_shares(n, dropout):
    """k neighbours with threshold k/2 + 1: the chance that some neighbourhood of the n keeps
    too few shares, clients dropping out at `dropout`, is at most 2^-20 with k, above it with
    k - 2 (once above the O(log n) floor), computed here from the binomial directly."""
    from math import comb

    def short(k):  # P[Binomial(k, 1 - dropout) <= k / 2]
        return sum(comb(k, i) * (1 - dropout) ** i * dropout ** (k - i) for i in range(k // 2 + 1))
    k = default_neighbours(n, dropout)
    assert k % 2 == 0 and n * short(k) <= 2.0 ** -20 < n * short(k - 2)
    assert default_neighbours(1000, 0.1) == 38 and default_neighbours(1000, 0.3) == 212


def test_a_sealed_share_opens_only_for_its_receiver_and_unchanged():
    a_sk, a_pk = crypto.keypair(bytes(range(32)))
    b_sk, b_pk = crypto.keypair(bytes(range(1, 33)))
    key = crypto.agree(a_sk, b_pk, b"x")
    assert key == crypto.agree(b_sk, a_pk, b"x")
    sealed = crypto.seal(key, bytes(12), b"share", b"aad")
    assert crypto.unseal(key, bytes(12), sealed, b"aad") == b"share"
    bad = bytearray(sealed)
    bad[0] ^= 1
    with pytest.raises(ValueError, match="does not open"):
        crypto.unseal(key, bytes(12), bytes(bad), b"aad")


def _round(n: int, d: int, degree: int | None, drop: dict[str, set[int]], seed: int = 0):
    """The protocol for clients 0..n-1 with dropouts after each stage; (server's result, the
    clients' own sum of their weighted quantized vectors over the survivors of the input stage)."""
    rng = np.random.default_rng(seed)
    weights = {u: int(rng.integers(5, 50)) for u in range(n)}
    fbits = field.field_bits(sum(weights.values()), 16)
    agg = Aggregation(3, list(range(n)), weights, degree, 0.5, fbits, np.random.default_rng(seed))
    alive = set(range(n)) - drop.get("keys", set())
    for u in sorted(alive):
        pk = C.keys(u, 3, np.random.default_rng([seed, u, 0]))
        agg.take_keys(u, pk["c_pk"], pk["s_pk"])
    req = agg.share_requests()
    alive = set(req) - drop.get("shares", set())
    for u in sorted(alive):
        r = req[u]
        out = C.shares(C.session(u, 3), r["nbrs"], r["c_pks"], r["s_pks"],
                       agg.t[u], np.random.default_rng([seed, u, 1]))
        assert agg.take_shares(u, out["to"], out["sealed"]) == ""
    req = agg.input_requests()
    alive = set(req) - drop.get("input", set())
    own = np.zeros(d, field.dtype_of(fbits))
    for u in sorted(alive):
        r = req[u]
        s = C.session(u, 3)
        C.open_shares(s, r["from"], r["sealed"])
        x = np.random.default_rng([seed, u, 2]).normal(0, 1, d)
        v = field.quantize(x, 4.0, 16, weights[u], fbits, np.random.default_rng([seed, u, 3]))
        own = own + v
        y = C.masked(s, v, r["partners"])
        assert not np.array_equal(y, v)
        agg.take_input(u, y)
    req = agg.unmask_requests()
    for u in sorted(set(req) - drop.get("unmask", set())):
        got = C.unmask(C.session(u, 3), req[u]["survivors"], req[u]["dropped"])
        assert agg.take_unmask(u, got, req[u]) == ""
    return agg.result(), own, sum(weights[u] for u in agg.inputs)


@pytest.mark.parametrize("degree", [None, 6])
@pytest.mark.parametrize("drop", [{}, {"keys": {1}, "shares": {2}, "input": {3},
                                       "unmask": {5}}])
def test_the_unmasked_sum_is_the_clients_sum_bit_for_bit(degree, drop):
    (total, weight), own, w = _round(12, 1000, degree, drop)
    assert np.array_equal(total, own) and weight == w


def test_too_many_dropouts_fail_naming_the_stage():
    with pytest.raises(SecAggFailed, match="stage input: 5 clients left, 7 needed"):
        _round(12, 10, None, {"input": set(range(7))})


def test_a_client_refuses_to_reveal_both_shares_of_one_neighbour():
    _round(4, 10, None, {})  # sessions made and used
    s = C.Session(0, 9, *crypto.keypair(bytes(32)), *crypto.keypair(bytes(range(32))))
    s.held = {1: (np.zeros(9, np.int64), np.zeros(9, np.int64))}
    with pytest.raises(ValueError, match="asks both shares of client"):
        C.unmask(s, np.array([1]), np.array([1]))


def test_quantization_round_trips_within_one_step():
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-1, 1, 500) for _ in range(3)]
    ws = [3, 5, 7]
    fb = field.field_bits(sum(ws), 16)
    tot = sum(field.quantize(x, 2.0, 16, w, fb, rng).astype(np.uint64) for x, w in zip(xs, ws))
    mean = field.dequantize(tot, sum(ws), 2.0, 16)
    exact = sum(w * x for x, w in zip(xs, ws)) / sum(ws)
    assert np.max(np.abs(mean - exact)) <= 2 * 2.0 / 65535


def test_the_batched_shamir_pieces_give_what_the_one_at_a_time_ones_give():
    """lagrange_rows, reconstruct_many, encode_rows and decode_rows (the vectorised forms the
    clients and the server use) agree with lagrange_at_zero, reconstruct, encode_share and
    decode_share, errors included (too few shares, a share that rebuilds no secret)."""
    rng = np.random.default_rng(3)
    xs = np.array([rng.choice(np.arange(1, 5000), 7, replace=False) for _ in range(20)])
    want = np.stack([shamir.lagrange_at_zero(x) for x in xs])
    assert np.array_equal(shamir.lagrange_rows(xs), want)
    items = []
    for i in range(12):
        parties = sorted(rng.choice(3000, 9, replace=False).tolist())
        t = 2 + i % 5
        sh = shamir.share(bytes([i]) * 32, parties, t, rng)
        got = {p: sh[p] for p in parties[: t + (i % 3) - 1]}  # some with t - 1 shares
        if i % 4 == 0 and got:  # a share that is wrong
            got[parties[0]] = rng.integers(0, shamir.P, shamir.chunks())
        items.append((got, t))
    for (got, t), res in zip(items, shamir.reconstruct_many(items)):
        try:
            assert res == shamir.reconstruct(got, t)
        except ValueError as e:
            assert isinstance(res, ValueError) and str(res) == str(e)
    y = rng.integers(0, shamir.P, (5, shamir.chunks()))
    rows = shamir.encode_rows(y)
    assert rows.tobytes() == b"".join(shamir.encode_share(v) for v in y)
    rows[2, :4] = 255  # a chunk at 2^32 - 1: no field element
    back, ok = shamir.decode_rows(rows)
    assert ok.tolist() == [True, True, False, True, True]
    assert np.array_equal(back[ok], y[ok])
    for t in (1, 4, 9):  # share_rows_many: share_rows of each secret in turn, the same draws
        one, many = np.random.default_rng([t, 1]), np.random.default_rng([t, 1])
        secrets, parties = [bytes([t]) * 32, bytes(range(32))], [4, 9, 11, 30, 31, 40, 41, 50, 77]
        want = np.stack([shamir.share_rows(x, parties, t, one) for x in secrets])
        assert np.array_equal(shamir.share_rows_many(secrets, parties, t, many), want)
        assert one.integers(1 << 60) == many.integers(1 << 60)


def test_masks_in_place_and_pair_keys_kept_for_the_other_end_are_the_same_bytes():
    """add_mask is + or - mask() in place; agree() gives both ends of a pair the same key,
    the second end taking the first's (kept in PAIRS, then gone), and a third party's key
    pair is never given another pair's key."""
    seed = bytes(range(32))
    for dt in (np.uint32, np.uint64):
        y = np.arange(1001, dtype=dt)
        m = crypto.mask(seed, y.size, np.dtype(dt))
        assert np.array_equal(crypto.add_mask(y.copy(), seed), y + m)
        assert np.array_equal(crypto.add_mask(y.copy(), seed, -1), y - m)
    (a, pa), (b, pb), (c, pc) = (crypto.keypair(bytes([i]) * 32) for i in (7, 8, 9))
    info = b"test-pairs|0"
    crypto.PAIRS.pop(info, None)
    ab = crypto.agree(a, pb, info)
    assert len(crypto.PAIRS[info]) == 1
    assert crypto.agree(c, pb, info) != ab and crypto.agree(c, pa, info) != ab
    assert crypto.agree(b, pa, info) == ab and (min(pa, pb), max(pa, pb)) not in crypto.PAIRS[info]
    crypto.PAIRS.clear()
    assert crypto.agree(b, pa, info) == ab  # (computed: nothing kept)


def test_an_unmask_reply_with_a_wrong_share_keeps_those_before_it_as_one_by_one_did():
    """take_unmask decodes a reply's shares at once, and still takes the shares before the
    first that is no share (what the server's cost counts, secagg/cost.unmasking) and refuses
    the reply with decode_share's reason."""
    agg = Aggregation(0, list(range(6)), {u: 1 for u in range(6)}, None, 0.5, 32,
                      np.random.default_rng(0))
    rng = np.random.default_rng(1)
    rows = shamir.encode_rows(rng.integers(0, shamir.P, (4, shamir.chunks())))
    rows[2, :4] = 255
    ids, none = np.arange(1, 5, dtype=np.int64), np.zeros(0, np.int64)
    got = {"b_of": ids, "b_share": rows, "s_of": none,
           "s_share": np.zeros((0, shamir.SHARE_BYTES), np.uint8)}
    why = agg.take_unmask(0, got, {"survivors": ids, "dropped": none})
    assert why == "a share is field elements" and 0 not in agg.answered
    assert sorted(agg.b_shares) == [1, 2]
    assert np.array_equal(agg.b_shares[2][0], shamir.decode_share(rows[1].tobytes()))


def test_a_pair_mask_kept_for_the_other_end_gives_the_same_masked_inputs(monkeypatch):
    """Two clients of one process: the first keeps the pairwise mask for the second
    (client.MASKS), which adds it in place of expanding its own; the masked vectors are those
    of clients that each expand every mask (a budget of 0 keeps nothing)."""
    def run() -> list[np.ndarray]:
        C.SESSIONS.clear()
        sess = []
        for cid in (3, 5):
            C.keys(cid, 7, np.random.default_rng(cid))
            sess.append(C.SESSIONS[cid])
        for s, o in ((sess[0], sess[1]), (sess[1], sess[0])):
            s.pks = {o.cid: (o.c_pk, o.s_pk)}
            s.b = bytes([s.cid]) * 32
        out = []
        for s, o in ((sess[0], sess[1]), (sess[1], sess[0])):
            s.q = np.arange(50, dtype=np.uint32) * np.uint32(s.cid)
            out.append(C.masked(s, s.q, np.array([o.cid])))
        return out
    kept = run()
    assert C.MASKS.held == {} and C.MASKS.size == 0  # (kept by 3, taken by 5)
    monkeypatch.setattr(C._Masks, "BUDGET", 0)
    crypto.PAIRS.clear()
    fresh = run()
    assert all(np.array_equal(a, b) for a, b in zip(kept, fresh))
    assert np.array_equal(kept[0] + kept[1], np.arange(50, dtype=np.uint32) * np.uint32(8)
                          + crypto.mask(bytes([3]) * 32, 50, np.dtype(np.uint32))
                          + crypto.mask(bytes([5]) * 32, 50, np.dtype(np.uint32)))
    C.SESSIONS.clear()


def test_with_share_ends_off_each_end_exchanges_and_expands_its_own_for_the_same_bytes(
        monkeypatch):
    """crypto.SHARE_ENDS False (bench_compute's deployed clients): agree() keeps nothing for
    the other end and masked() neither keeps nor takes a mask, so each end does the work the
    clock counts for it; the keys and masked vectors are the shared path's."""
    (a, pa), (b, pb) = (crypto.keypair(bytes([i]) * 32) for i in (17, 18))
    info = b"test-ends|0"
    shared = crypto.agree(a, pb, info)
    crypto.PAIRS.clear()
    monkeypatch.setattr(crypto, "SHARE_ENDS", False)
    assert crypto.agree(a, pb, info) == shared and info not in crypto.PAIRS
    crypto.PAIRS[info] = {(min(pa, pb), max(pa, pb)): b"x" * 32}  # (a kept key: not taken)
    assert crypto.agree(b, pa, info) == shared and len(crypto.PAIRS[info]) == 1
    crypto.PAIRS.clear()
    sess = []
    C.SESSIONS.clear()
    for cid in (3, 5):
        C.keys(cid, 7, np.random.default_rng(cid))
        sess.append(C.SESSIONS[cid])
    for s, o in ((sess[0], sess[1]), (sess[1], sess[0])):
        s.pks, s.b = {o.cid: (o.c_pk, o.s_pk)}, bytes([s.cid]) * 32
    out = [C.masked(s, np.arange(50, dtype=np.uint32) * np.uint32(s.cid), np.array([o.cid]))
           for s, o in ((sess[0], sess[1]), (sess[1], sess[0]))]
    assert C.MASKS.held == {}  # (nothing kept for the other end)
    assert np.array_equal(out[0] + out[1] - crypto.mask(sess[0].b, 50, np.dtype(np.uint32))
                          - crypto.mask(sess[1].b, 50, np.dtype(np.uint32)),
                          np.arange(50, dtype=np.uint32) * np.uint32(8))
    C.SESSIONS.clear()


def test_pair_masks_summed_for_the_other_end_give_each_end_expanding_its_own_bytes(monkeypatch):
    """Clients of one process (client.MASKS): each pairwise mask is expanded by the end that
    masks first, which adds it to the other end's kept sum; the other end adds the sum once.
    Over a 5-client complete graph, with a partner left out at one client (its kept sum then
    holds a key the client does not mask with: dropped, each of its masks expanded), the masked
    vectors are those of clients that each expand every mask (SHARE_ENDS off), and nothing is
    left kept but the sum of the client that never masks."""
    def run(share: bool) -> list[np.ndarray]:
        monkeypatch.setattr(crypto, "SHARE_ENDS", share)
        C.SESSIONS.clear()
        crypto.PAIRS.clear()
        ids = [2, 3, 5, 8, 13]
        sess = {}
        for cid in ids:
            C.keys(cid, 4, np.random.default_rng(cid))
            sess[cid] = C.SESSIONS[cid]
        for s in sess.values():
            s.pks = {o.cid: (o.c_pk, o.s_pk) for o in sess.values() if o is not s}
            s.b = bytes([s.cid]) * 32
        out = []
        for cid in ids[:-1]:  # (13 never masks)
            s = sess[cid]
            partners = [v for v in ids if v != cid and not (cid == 8 and v == 2)]
            s.q = np.arange(300, dtype=np.uint64) * np.uint64(cid)
            out.append(C.masked(s, s.q, np.array(partners)))
        return out
    kept = run(True)
    assert sorted(C.MASKS.held) == [13] and len(C.MASKS.held[13][1]) == 4
    fresh = run(False)
    assert all(np.array_equal(a, b) for a, b in zip(kept, fresh))
    C.SESSIONS.clear()
    C.MASKS.__init__()  # type: ignore[misc]
    crypto.PAIRS.clear()
