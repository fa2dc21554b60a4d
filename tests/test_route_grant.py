"""The server's grant of a hand-off (protocol/proof.route_grant) covers everything the hand-off
tells its receiver: a sender that changes any of it, the protocol stage the ledger files the
bytes under included, fails the receiver's check."""
from __future__ import annotations

from typing import Any

from fednet.protocol.proof import check_grant, grant_key, route_grants

MASTER = bytes(range(32))
ROUTE, KEYS, ENDS = [3, 5, 7], ["k3", "k5", "k7"], ["tcp://a:1", "tcp://b:2", "tcp://c:3"]
GRANTED: dict[str, Any] = dict(run_id="run", rnd=2, task_id=11, route=ROUTE, keys=KEYS, endpoints=ENDS,
               kind="train", body={"epochs": 1}, stage="input")


def _check(hop: int, **changed: Any) -> bool:
    grants = route_grants(MASTER, **GRANTED)
    fields = {**GRANTED, **changed}
    return check_grant(grant_key(MASTER, ROUTE[hop]), grants[hop], hop=hop,
                       **fields)


def test_the_granted_hand_off_passes_at_every_hop():
    assert _check(1) and _check(2)
    assert route_grants(MASTER, **GRANTED)[0] != route_grants(
        MASTER, **GRANTED)[1]  # hop 0 holds no grant


def test_any_field_a_sender_changes_fails_the_check():
    for change in ({"stage": ""}, {"stage": "keys"}, {"kind": "eval"}, {"body": {"epochs": 2}},
                   {"route": [3, 7, 5]}, {"keys": ["k3", "k5", "kx"]}, {"rnd": 3},
                   {"task_id": 12}, {"endpoints": ["tcp://a:1", "tcp://x:9", "tcp://c:3"]}):
        assert not _check(1, **change), change


def test_another_hops_grant_or_no_key_fails():
    grants = route_grants(MASTER, **GRANTED)
    assert not check_grant(grant_key(MASTER, ROUTE[2]), grants[1], hop=2, **GRANTED)
    assert not check_grant(None, grants[1], hop=1, **GRANTED)
