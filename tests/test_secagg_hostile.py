"""One misbehaving key holder under secure aggregation (issue 53): a public key that no
agreement can use (the all-zero, low-order point), a replay of its previous round's keys, or a
lying unmask share costs the round only that client's part: the final model is the run's where
that client dropped out at that stage, bit for bit. A wrong masked input, which the server
cannot trace to its sender, fails the round named (the unmasked sum is outside the bound every
honest sum lies in), never the model."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.algorithms import secagg as S
from fednet.core.inproc import run_local
from fednet.errors import Dropout
from fednet.secagg import client as C
from tests.conftest import small_config
from tests.harness import final_model, same_arrays


def _run(tmp_path, name, mode="full", rounds=2):
    cfg = small_config(clients=8, rounds=rounds, net={"secagg": mode}, out=str(tmp_path / name))
    return run_local(cfg, quiet=True), final_model(tmp_path / name)


def _rows(tmp_path, name):
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def _dropping(monkeypatch, cid: int, stage: str, rounds=(0, 1)):
    run = S.SecAggClient.run

    def dropped(self, ctx, task):
        if ctx.cid == cid and task.stage == stage and task.round in rounds:
            raise Dropout(f"dropped out at stage {stage}")
        return run(self, ctx, task)
    monkeypatch.setattr(S.SecAggClient, "run", dropped)


@pytest.mark.parametrize("mode", ["full", "plus"])
def test_a_low_order_public_key_costs_only_its_sender(tmp_path, monkeypatch, mode):
    keys = C.keys

    def zero_key(cid, rnd, rng):
        out = keys(cid, rnd, rng)
        if cid == 2:
            out["c_pk"] = np.zeros(32, np.uint8)
        return out
    monkeypatch.setattr(C, "keys", zero_key)
    s, got = _run(tmp_path, "bad", mode)
    assert s["status"] == "completed" and not s["failures"]  # no honest client blamed
    refused = [r["secagg_refused"] for r in _rows(tmp_path, "bad")]
    assert refused == [[[2, "keys", "its public key c_pk is not a usable X25519 key (a "
                         "low-order point)"]]] * 2
    monkeypatch.setattr(C, "keys", keys)
    _dropping(monkeypatch, 2, "keys")
    _, want = _run(tmp_path, "drop", mode)
    assert same_arrays(got, want)


def test_a_replay_of_last_rounds_keys_costs_only_its_sender(tmp_path, monkeypatch):
    keys, old = C.keys, {}

    def replay(cid, rnd, rng):
        out = keys(cid, rnd, rng)
        if cid == 5:
            if rnd == 1:
                return old[0]
            old[rnd] = {k: v.copy() for k, v in out.items()}
        return out
    monkeypatch.setattr(C, "keys", replay)
    s, got = _run(tmp_path, "replay")
    rows = _rows(tmp_path, "replay")
    assert "secagg_refused" not in rows[0]
    assert rows[1]["secagg_refused"] == [[5, "keys", "its public key c_pk is one of an earlier "
                                          "round (a replay)"]]
    assert s["status"] == "completed" and not s["failures"]
    monkeypatch.setattr(C, "keys", keys)
    _dropping(monkeypatch, 5, "keys", rounds=(1,))
    _, want = _run(tmp_path, "drop")
    assert same_arrays(got, want)


def test_a_lying_unmask_share_is_found_and_costs_only_its_holder(tmp_path, monkeypatch):
    unmask = C.unmask

    def lying(s, survivors, dropped):
        out = unmask(s, survivors, dropped)
        if s.cid == 1 and len(out["b_share"]):
            out["b_share"] = out["b_share"].copy()
            out["b_share"][0, :4] ^= 0x5A  # one share of one survivor's b, changed
        return out
    monkeypatch.setattr(C, "unmask", lying)
    s, got = _run(tmp_path, "lie")
    rows = _rows(tmp_path, "lie")
    assert all(r["secagg_refused"][0][:2] == [1, "unmask"] for r in rows)
    assert all("disagrees with the other holders'" in r["secagg_refused"][0][2] for r in rows)
    assert all(r["secagg_clients"] == [8, 8, 8, 8, 7] for r in rows)
    assert s["status"] == "completed"
    monkeypatch.setattr(C, "unmask", unmask)
    _dropping(monkeypatch, 1, "unmask")
    _, want = _run(tmp_path, "drop")
    assert same_arrays(got, want)


def test_a_wrong_masked_input_fails_the_round_named_not_the_model(tmp_path, monkeypatch):
    masked = C.masked

    def wrong(s, values, partners):
        y = masked(s, values, partners)  # client 3 sends values of its own choosing instead
        return np.random.default_rng(0).integers(0, 1 << 31, y.size).astype(y.dtype) \
            if s.cid == 3 else y
    monkeypatch.setattr(C, "masked", wrong)
    s, got = _run(tmp_path, "wrong", rounds=1)
    row = _rows(tmp_path, "wrong")[0]
    assert row["round_failed"].startswith("secure aggregation failed at stage unmask: 8 clients "
                                          "left, 5 needed; the unmasked sum is outside its bound")
    fresh = small_config(clients=8, rounds=1, net={"secagg": "full"})
    from fednet.core.session import Session
    init = Session(fresh, quiet=True, write=False).algo.eval_arrays()
    assert same_arrays(got, init)  # the model kept
    assert s["status"] == "failed"


def test_nothing_individual_reaches_the_server(tmp_path, monkeypatch):
    """Every reply of every stage, as the server receives it: the protocol's arrays (public
    keys, sealed shares, the masked vector, unmask shares) under the stage's name, a body of the
    sample count the server's own partition gives, the local steps (fixed by that count and
    the run's settings) and the emulator's CPU measurement; no loss, no update value. The round's
    training loss is the survivors' weighted mean, from the masked vector."""
    from fednet.core import replies

    seen: list[tuple[str, dict, dict]] = []
    accept = replies.accept_reply

    def spy(msg, *a, **k):
        got = accept(msg, *a, **k)
        body = msg.body.get("body", msg.body) if isinstance(msg.body, dict) else {}
        seen.append((str(msg.body.get("stage")), dict(body), {n: v.shape for n, v in
                                                            getattr(got, "arrays", {}).items()}))
        return got
    monkeypatch.setattr(replies, "accept_reply", spy)
    s, _ = _run(tmp_path, "spy", rounds=1)
    assert {st for st, _, _ in seen} == {"keys", "shares", "input", "unmask"}
    for stage, body, _ in seen:
        assert set(body) <= {"cpu_s", "samples", "steps"}, (stage, body)
    row = _rows(tmp_path, "spy")[0]
    assert 0 < row["train_loss"] < 8  # the mean, within the clip


def test_the_low_order_list_is_what_the_agreement_refuses():
    """Every encoding usable() refuses makes X25519 raise (with the top bit set or not), and
    keys drawn at random are taken."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    from fednet.secagg import crypto

    me = X25519PrivateKey.from_private_bytes(bytes(range(32)))
    for u in crypto.LOW_ORDER:
        for top in (0, 0x80):
            b = bytearray(u)
            b[31] |= top
            assert not crypto.usable(bytes(b))
            with pytest.raises(ValueError):
                me.exchange(X25519PublicKey.from_public_bytes(bytes(b)))
    rng = np.random.default_rng(0)
    assert all(crypto.usable(crypto.keypair(rng.bytes(32))[1]) for _ in range(200))
    assert not crypto.usable(bytes(31))


def _garbling(monkeypatch, cid: int, victims):
    """Client `cid` seals garbage for the neighbours in `victims` (None: all of them)."""
    shares = C.shares

    def bad(s, nbrs, c_pks, s_pks, t, rng):
        out = shares(s, nbrs, c_pks, s_pks, t, rng)
        if s.cid == cid:
            out["sealed"] = out["sealed"].copy()
            for i, v in enumerate(out["to"]):
                if victims is None or int(v) in victims:
                    out["sealed"][i, :8] ^= 0xFF
        return out
    monkeypatch.setattr(C, "shares", bad)


@pytest.mark.parametrize("mode, victims", [("full", {0, 1}), ("full", None), ("plus", None)])
def test_shares_that_do_not_open_cost_only_their_sender(tmp_path, monkeypatch, mode, victims):
    """Client 4's sealed shares do not open at some or all of its neighbours: they say so with
    their masked inputs (no honest failure, no traceback), client 4 is left out as if it had
    dropped out at the shares stage, named, and the other survivors' inputs are asked again
    without it: the model is the run's where client 4 dropped out there, bit for bit."""
    shares = C.shares
    _garbling(monkeypatch, 4, victims)
    s, got = _run(tmp_path, "garble", mode)
    assert s["status"] == "completed" and not s["failures"]
    rows = _rows(tmp_path, "garble")
    for row in rows:
        assert "round_failed" not in row
        assert row["secagg_clients"] == [8, 8, 7, 7, 7]
        [(cid, stage, why)] = row["secagg_refused"]
        assert (cid, stage) == (4, "shares") and why.startswith("its sealed shares did not open")
    monkeypatch.setattr(C, "shares", shares)
    _dropping(monkeypatch, 4, "shares")
    _, want = _run(tmp_path, "drop", mode)
    assert same_arrays(got, want)
    assert [r["secagg_clients"] for r in _rows(tmp_path, "drop")] == [[8, 8, 7, 7, 7]] * 2


def test_honest_rounds_take_no_second_input(tmp_path, monkeypatch):
    """The input stage is asked again only after a complaint: an honest round (here with a
    dropout at the input stage) never asks for an input masked again."""
    def never(s, partners):
        raise AssertionError("an honest round asked for an input masked again")
    monkeypatch.setattr(C, "remasked", never)
    _dropping(monkeypatch, 3, "input")
    s, _ = _run(tmp_path, "honest", rounds=1)
    row = _rows(tmp_path, "honest")[0]
    assert s["status"] == "completed" and row["secagg_clients"] == [8, 8, 8, 7, 7]
    assert "secagg_refused" not in row


def test_an_input_is_masked_again_only_with_fewer_of_its_partners():
    rng = np.random.default_rng(0)
    C.keys(0, 0, rng)
    s = C.session(0, 0)
    s.pks = {1: (b"", bytes(C.crypto.keypair(rng.bytes(32))[1])),
             2: (b"", bytes(C.crypto.keypair(rng.bytes(32))[1]))}
    s.b, s.q, s.partners = rng.bytes(32), np.arange(4, dtype=np.uint32), frozenset({1, 2})
    assert C.remasked(s, np.array([1])).shape == (4,)
    for bad in ([], [1, 2], [1, 3]):
        with pytest.raises(ValueError, match="not some of its first ones"):
            C.remasked(s, np.array(bad, np.int64))
