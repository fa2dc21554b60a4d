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


def test_a_population_of_ten_million_is_ranges_from_the_specs_to_the_command():
    specs = client_specs(10_000_000, "tcp://127.0.0.1:1", (), 1, per_process=625_000)
    assert [s["cids"] for s in specs][:2] == [range(0, 625_000), range(625_000, 1_250_000)]
    assert len(specs) == 16 and specs[-1]["cids"] == range(9_375_000, 10_000_000)
    cmd = _sent(specs)
    assert cmd["ranges"][-1] == [9_375_000, 10_000_000] and "groups" not in cmd
    listed = client_specs(0, "tcp://127.0.0.1:1", (), 1, ids=[4, 5, 6, 7], per_process=3)
    assert [s["cids"] for s in listed] == [range(4, 7), range(7, 8)]  # consecutive: a range


def _zygote_with_events(events):
    import os

    r, w = os.pipe()
    os.set_blocking(r, False)
    os.write(w, b"".join(json.dumps(e).encode() + b"\n" for e in events))
    os.close(w)
    z = Zygote.__new__(Zygote)  # no zygote process: its events read from a pipe
    z.proc = SimpleNamespace(stdout=os.fdopen(r, "rb", buffering=0), poll=lambda: None)
    z._buf, z.procs, z.codes, z._new_dead, z.warm_s = b"", {}, {}, [], None
    return z


def test_exits_are_one_entry_per_process():
    z = _zygote_with_events([
        {"event": "spawned", "range": [0, 625_000], "pid": 11},
        {"event": "spawned", "cids": [700_000, 700_002], "pid": 12},
        {"event": "spawned", "range": [625_000, 625_003], "pid": 13},
        {"event": "exit", "range": [0, 625_000], "pid": 11, "code": 0},
        {"event": "exit", "cids": [700_000, 700_002], "pid": 12, "code": -9}])
    exits = z.exits()
    assert exits == [(range(0, 625_000), "process exited with code 0"),
                     ([700_000, 700_002], "process killed by signal 9")]
    assert z.exits() == [] and z.exited() == 625_002
    assert z.failed() == {700_000: -9, 700_002: -9}
    z.codes[13] = 1
    z._new_dead.append((z.procs[13], "process exited with code 1"))
    assert z.exits() == [(range(625_000, 625_003), "process exited with code 1")]


def test_the_processes_holding_clients_are_found_without_a_set_of_them():
    from fednet.launch.spawn import holding

    procs = {11: range(0, 625_000), 12: [700_000, 700_002], 13: range(625_000, 650_000)}
    assert holding(procs, [624_999, 5]) == [11]
    assert holding(procs, range(700_001, 700_003)) == [12]
    assert holding(procs, [650_000, 700_001]) == []
    assert holding(procs, []) == []
    assert holding(procs, [625_000, 0]) == [11, 13]
