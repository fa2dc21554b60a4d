"""Open-file limits for many clients: raised to the hard limit, refused with a clear message."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from fednet.client.table import ids_text
from fednet.errors import ConfigError
from fednet.platform.proc import check_files_per_process


def test_raise_fd_limit_lifts_the_soft_limit_towards_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("the hard limit leaves nothing to raise")
    code = ("import resource; from fednet.platform.proc import raise_fd_limit;"
            "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1];"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, h));"
            "n = raise_fd_limit(); s = resource.getrlimit(resource.RLIMIT_NOFILE)[0];"
            "print(n, s, h)")
    n, s, h = (int(x) for x in subprocess.run([sys.executable, "-c", code], check=True,
                                              capture_output=True, text=True).stdout.split())
    assert n == s > 256
    assert s == min(h, 1 << 16) or (h == resource.RLIM_INFINITY and s == 1 << 16)


def test_too_many_clients_per_process_for_the_limit_names_the_option(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (1024, 1024))
    check_files_per_process(100)  # 864 files: fits
    with pytest.raises(ConfigError, match=r"--clients-per-process 300: .* about 2464 open files, "
                                          r"the limit is 1024 \(ulimit -n\)"):
        check_files_per_process(300)


def test_ids_text():
    assert ids_text(list(range(0, 300))) == "0-299"
    assert ids_text([7]) == "7"
    assert ids_text([1, 5, 9]) == "1,5,9"
    assert ids_text(list(range(0, 40, 2))).endswith(",...")


def test_pss_bytes_sums_live_processes_and_skips_gone_ones():
    import os

    from fednet.platform.proc import pss_bytes

    p = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                          "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        one = pss_bytes([p.pid])
        assert one > 1 << 20  # an interpreter holds more than 1 MiB
        me = pss_bytes([os.getpid()])
        both = pss_bytes([p.pid, os.getpid()])
        assert abs(both - (one + me)) < 0.1 * both
        assert pss_bytes([]) == 0
    finally:
        p.kill()
        p.wait()
    assert pss_bytes([p.pid]) == 0  # exited and reaped: no such process


def test_routing_ids_that_libzmq_generates_are_not_predictable():
    """libzmq draws a ROUTER's generated routing ids from C's rand(): unseeded, every process's
    first id was 00 6b 8b 45 67 (issue 23). Two processes seeded by seed_routing_ids differ."""
    import subprocess
    import sys

    code = ("import zmq\nfrom fednet.platform.proc import seed_routing_ids\n{seed}\n"
            "c = zmq.Context(); r = c.socket(zmq.ROUTER)\n"
            "p = r.bind_to_random_port('tcp://127.0.0.1'); d = c.socket(zmq.DEALER)\n"
            "d.connect(f'tcp://127.0.0.1:{{p}}'); d.send(b'x'); print(r.recv_multipart()[0].hex())\n"
            "d.close(0); r.close(0); c.term()\n")

    def first_id(seed: str) -> str:
        return subprocess.run([sys.executable, "-c", code.format(seed=seed)], capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()

    assert first_id("") == first_id("") == "006b8b4567"  # the attack's premise, unseeded
    seeded = {first_id("seed_routing_ids()") for _ in range(3)}
    assert "006b8b4567" not in seeded and len(seeded) == 3
