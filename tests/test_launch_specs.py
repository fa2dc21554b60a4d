"""What the launcher tells the zygote reaches every process as its own: ids, device and, under
`fednet launch --secure`, the CURVE pair issued to that process (never the first process's)."""
from __future__ import annotations

import io
import json
from types import SimpleNamespace

import zmq

from fednet.launch.spawn import Zygote, client_specs
from fednet.launch.zygote import group_specs


def _sent(specs):
    z = Zygote.__new__(Zygote)  # no zygote process: capture the command line it would read
    z.proc = SimpleNamespace(stdin=io.BytesIO())
    z.spawn(specs)
    return json.loads(z.proc.stdin.getvalue().decode().splitlines()[0])


def test_every_process_gets_its_own_curve_pair():
    pairs = [tuple(k.decode() for k in zmq.curve_keypair()) for _ in range(3)]
    specs = client_specs(7, "tcp://127.0.0.1:1", (0, 1), 1, per_process=3, secure="/keys",
                         run_key=b"k" * 32, curve_pairs=pairs)
    cmd = _sent(specs)
    assert "curve" not in cmd["common"]
    got = group_specs(cmd)
    assert [list(g["cids"]) for g in got] == [[0, 1, 2], [3, 4, 5], [6]]
    assert cmd["ranges"] == [[0, 3], [3, 6], [6, 7]] and "groups" not in cmd  # a few bytes
    assert [g["device"] for g in got] == ["cuda:0", "cuda:1", "cuda:0"]
    assert [tuple(g["curve"]) for g in got] == pairs
    assert len({g["curve"][0] for g in got}) == 3
    assert all(g["secure"] == "/keys" and g["run_key"] == (b"k" * 32).hex() for g in got)


def test_without_secure_no_process_gets_a_pair():
    got = group_specs(_sent(client_specs(2, "tcp://127.0.0.1:1", (), 1)))
    assert [g["curve"] for g in got] == [None, None]


def test_ids_that_are_no_range_travel_as_lists_and_events_name_them_both_ways():
    from fednet.launch.spawn import event_ids
    from fednet.launch.zygote import ids_field

    specs = client_specs(0, "tcp://127.0.0.1:1", (), 1, ids=[0, 2, 3, 9], per_process=2)
    cmd = _sent(specs)
    assert cmd["groups"] == [[0, 2], [3, 9]] and "ranges" not in cmd
    assert [list(g["cids"]) for g in group_specs(cmd)] == [[0, 2], [3, 9]]
    for ids in (range(5, 62_505), [4, 8, 9]):
        ev = json.loads(json.dumps({"event": "spawned", **ids_field(ids), "pid": 1}))
        assert list(event_ids(ev)) == list(ids)
    assert len(json.dumps(ids_field(range(0, 10_000_000)))) < 40
