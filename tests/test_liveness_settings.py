"""The liveness timers as run settings (config/liveness.py, issue 37 item 1): their defaults, one
hidden option that scales them, and each process that uses them gets them: the server's sockets
and grace from its RunConfig, a client process's link from its spawn spec or `fednet clients
--liveness`."""
from __future__ import annotations

import io
import json
from dataclasses import fields
from types import SimpleNamespace

import pytest
import zmq
from click.testing import CliRunner

from fednet.cli import main
from fednet.cli.options import build_config
from fednet.cli.options_extra import check_resume_options
from fednet.config import RunConfig, from_dict
from fednet.config.liveness import DEFAULT, Liveness, overrides
from fednet.errors import ConfigError
from fednet.launch.spawn import Zygote, client_specs
from fednet.launch.zygote import group_specs
from fednet.transport import channels


def test_the_defaults_are_the_timers_a_run_always_had():
    assert DEFAULT == RunConfig().liveness == Liveness()
    assert (DEFAULT.heartbeat_ms, DEFAULT.heartbeat_timeout_ms, DEFAULT.link_timeout_ms) == \
        (1000, 3000, 6000)
    assert (DEFAULT.handshake_ms, DEFAULT.connect_handshake_ms) == (5000, 30_000)
    assert (DEFAULT.lost_grace_s, DEFAULT.hello_every_s, DEFAULT.rehello_s, DEFAULT.recheck_s,
            DEFAULT.check_s) == (1.0, 2.0, 2.0, 1.0, 0.05)


def test_scaled_multiplies_every_timer():
    t = DEFAULT.scaled(0.1)
    assert t.to_dict() == {"heartbeat_ms": 100, "heartbeat_timeout_ms": 300,
                           "link_timeout_ms": 600, "handshake_ms": 500,
                           "connect_handshake_ms": 3000, "reconnect_max_ms": 500,
                           "lost_grace_s": 0.1,
                           "hello_every_s": 0.2, "rehello_s": 0.2, "recheck_s": 0.1,
                           "check_s": 0.005}
    assert DEFAULT.scaled(1e-6).heartbeat_ms == 1  # milliseconds stay at least 1
    assert DEFAULT.scaled(1.0) == DEFAULT


def _cfg(*args):
    from fednet.cli import local

    ctx = local.make_context("local", list(args))
    return build_config(dict(ctx.params), {"clients": 10})


def test_the_hidden_option_scales_them_and_is_not_in_help():
    assert _cfg("--liveness", "0.1").liveness == DEFAULT.scaled(0.1)
    assert _cfg().liveness == DEFAULT
    r = CliRunner()
    for cmd in ("launch", "local", "server", "clients"):
        out = r.invoke(main, [cmd, "--help"]).output
        assert "--clients" in out or "--connect" in out  # (the help itself printed)
        assert "--liveness" not in out, cmd


def test_fednet_local_says_it_has_no_timers_to_scale(tmp_path):
    """fednet local has no sockets: --liveness is accepted (a sweep's shared options) and a
    note says it does nothing there."""
    args = ["local", "--clients", "2", "--rounds", "1", "-q", "--out"]
    r = CliRunner().invoke(main, [*args, str(tmp_path / "a"), "--liveness", "0.5"])
    assert r.exit_code == 0, r.output
    assert "--liveness shape client processes" in r.output and "ignores them" in r.output
    r = CliRunner().invoke(main, [*args, str(tmp_path / "b")])
    assert r.exit_code == 0 and "ignores them" not in r.output


@pytest.mark.parametrize("bad", ["0", "-1", "x", "nan", "inf"])
def test_a_bad_scale_is_one_line_naming_the_option(bad):
    with pytest.raises(ConfigError, match="^--liveness must be a positive number") as e:
        _cfg("--liveness", bad)
    assert "\n" not in str(e.value)
    r = CliRunner().invoke(main, ["clients", "--connect", "tcp://127.0.0.1:1", "--ids", "0",
                                  "--join-key", "k", "--liveness", bad])
    assert r.exit_code == 2 and "fednet: error: --liveness must be a positive number" in r.output


def test_a_file_sets_each_timer_by_its_key_and_a_bad_one_is_named():
    cfg = from_dict({"liveness": {"heartbeat_ms": 250, "lost_grace_s": 0.5}})
    assert (cfg.liveness.heartbeat_ms, cfg.liveness.lost_grace_s) == (250, 0.5)
    assert cfg.liveness.link_timeout_ms == 6000  # the others keep their defaults
    with pytest.raises(ConfigError, match="'liveness.heartbeat_ms' must be an integer"):
        from_dict({"liveness": {"heartbeat_ms": 0.5}})
    from fednet.algorithms.checks import validate

    with pytest.raises(ConfigError, match=r"^liveness.link_timeout_ms must be at least 1 "):
        validate(RunConfig().replace(**{"liveness.link_timeout_ms": 0}))


def test_a_resume_may_set_them_anew():
    run = {f"liveness.{f.name}": getattr(DEFAULT, f.name) for f in fields(Liveness)}
    check_resume_options(overrides("0.1"), run)  # no error
    with pytest.raises(ConfigError, match="rounds|seed"):
        check_resume_options({"seed": 3}, {"seed": 0})


def _opts(sock):
    return (sock.getsockopt(zmq.HEARTBEAT_IVL), sock.getsockopt(zmq.HEARTBEAT_TIMEOUT),
            sock.getsockopt(zmq.HANDSHAKE_IVL))


def test_the_sockets_take_the_timers():
    fast = DEFAULT.scaled(0.1)
    ctx = zmq.Context()
    try:
        srv, ep = channels.bind_router(ctx, "127.0.0.1", 0, live=fast)
        assert _opts(srv) == (100, 300, 500)
        big, _ = channels.bind_router(ctx, "127.0.0.1", 0, live=fast,
                                      heartbeat_ms=channels.server_heartbeat_ms(10_000, fast),
                                      handshake_ms=channels.server_handshake_ms(6000, fast))
        assert _opts(big) == (1000, 1200, 1500)  # 10 intervals; answers 300 ms after one more
        dflt, _ = channels.bind_router(ctx, "127.0.0.1", 0)
        assert _opts(dflt) == (1000, 3000, 5000)
        link = channels.connect_dealer(ctx, ep, live=fast)
        assert _opts(link) == (100, 600, 3000)
        assert _opts(channels.connect_dealer(ctx, ep)) == (1000, 6000, 30_000)
    finally:
        ctx.destroy(linger=0)


def test_a_launched_process_gets_the_runs_timers_through_its_spec():
    fast = DEFAULT.scaled(0.1)
    z = Zygote.__new__(Zygote)  # no zygote process: capture the command line it would read
    z.proc = SimpleNamespace(stdin=io.BytesIO())
    z.spawn(client_specs(4, "tcp://127.0.0.1:1", (), 1, per_process=2, liveness=fast))
    cmd = json.loads(z.proc.stdin.getvalue().decode().splitlines()[0])
    assert cmd["common"]["liveness"]["heartbeat_ms"] == 100  # once, for every process
    got = group_specs(cmd)
    assert [Liveness.from_dict(g["liveness"]) for g in got] == [fast, fast]
    assert Liveness.from_dict(None) == DEFAULT  # a spec without them: the defaults


def test_a_client_link_and_its_registration_use_them():
    from fednet.client.link import ServerLink

    ctx = zmq.Context()
    try:
        link = ServerLink(ctx, "tcp://127.0.0.1:1", liveness=DEFAULT.scaled(0.5))
        assert _opts(link.sock) == (500, 3000, 15_000) and link.liveness.recheck_s == 0.5
        link.close(0)
    finally:
        ctx.term()


def test_a_clients_peer_sockets_use_its_process_timers():
    """The ring's hand-off sockets (client/peers.py) take the process's timers, as its link."""
    from fednet.client.host import Host

    host = Host([3, 4], "tcp://127.0.0.1:1", liveness=DEFAULT.scaled(0.5))
    try:
        peers = host.first.peers
        assert peers.live is host.link.liveness
        peers.listen()
        assert _opts(peers.sock)[0] == 500  # its ping interval
    finally:
        host.close()
