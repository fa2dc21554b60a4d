"""--secure on one side only (issue 41 item 7): a client host's link to a server that speaks
another ZeroMQ security mechanism (CURVE against PLAIN or none) is told so at the handshake, in
one line naming --secure, instead of "the server did not answer" after --timeout. Real sockets on
loopback, set up by fednet's own server_guard and server_setup."""
from __future__ import annotations

import time

import pytest
import zmq

from fednet.client.link import ServerLink, server_setup
from fednet.errors import ConfigError
from fednet.protocol.proof import gate_password
from fednet.transport import security

pytestmark = pytest.mark.net

RUN_KEY = b"k" * 32


@pytest.fixture
def keys(tmp_path):
    security.init_keys(tmp_path)
    security.add_key(tmp_path, "hostA", "0-9")
    return tmp_path


def _server(ctx: zmq.Context, secure: str) -> tuple[zmq.Socket, str, object]:
    allowed = [pub for pub, _ in security.list_keys(secure).values()] if secure else []
    setup, auth = security.server_guard(ctx, secure, allowed, RUN_KEY)
    sock = ctx.socket(zmq.ROUTER)
    if setup is not None:
        setup(sock)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}", auth


def _link(ctx: zmq.Context, endpoint: str, secure: str) -> ServerLink:
    keys = security.load_keys(secure, need_server_secret=False, name="hostA") if secure else None
    gate = None if secure else gate_password(RUN_KEY)
    return ServerLink(ctx, endpoint, server_setup(keys, gate), secure=keys is not None)


def _told(link: ServerLink, within_s: float = 5.0) -> str:
    """What register() raises with no client to register, once the handshake has failed."""
    deadline = time.monotonic() + within_s
    while not link.mismatch and time.monotonic() < deadline:
        link.watch()
        time.sleep(0.05)
    return str(link.no_answer(60))


@pytest.mark.parametrize("server_secure, client_secure", [(True, False), (False, True)])
def test_secure_on_one_side_only_is_named_at_the_handshake(keys, server_secure, client_secure):
    ctx, cctx = zmq.Context(), zmq.Context()  # two hosts: two contexts
    srv, endpoint, auth = _server(ctx, str(keys) if server_secure else "")
    link = _link(cctx, endpoint, str(keys) if client_secure else "")
    try:
        t0 = time.monotonic()
        said = _told(link)
        assert time.monotonic() - t0 < 5.0 and link.mismatch
    finally:
        link.close(0)
        srv.close(0)
        if auth is not None:
            auth.stop()
        ctx.term()
        cctx.term()
    if server_secure:
        assert said == (f"the server at {endpoint} runs with --secure: give this host --secure "
                        "DIR (its copy of the run's key folder; --key NAME if it holds several "
                        "keys), not a join key")
    elif link.guessed:  # the server found the mismatch and closed before its greeting was read
        assert said.startswith(f"the server at {endpoint} closed each handshake from this host (")
        assert "either it does not run with --secure" in said and "drop --secure here" in said
    else:
        assert said == (f"the server at {endpoint} does not run with --secure (it is plaintext, "
                        "its clients join with --join-key): drop --secure here, or restart the "
                        "server with --secure DIR")


def test_a_secure_host_with_another_runs_key_folder_is_told_at_the_handshake(keys, tmp_path_factory):
    """A CURVE server closes a handshake it cannot decrypt (this host holds another run's
    server key) without a word: after a few such closes the host is told, naming both causes,
    instead of 'did not answer' after its timeout."""
    other = tmp_path_factory.mktemp("other-run")
    security.init_keys(other)
    security.add_key(other, "hostA", "0-9")
    ctx, cctx = zmq.Context(), zmq.Context()
    srv, endpoint, auth = _server(ctx, str(keys))
    link = _link(cctx, endpoint, str(other))
    try:
        said = _told(link)
        assert link.mismatch and link.guessed and not link.denied
    finally:
        link.close(0)
        srv.close(0)
        auth.stop()
        ctx.term()
        cctx.term()
    assert "or this host's key folder is not that run's" in said


def test_register_gives_up_at_the_mismatch_not_at_the_timeout(keys):
    """A plaintext client process (a launch's run key) against a --secure server: its
    registration stops at the handshake's mismatch, not after its 60 s timeout."""
    from fednet.client.host import Host

    ctx = zmq.Context()
    srv, endpoint, auth = _server(ctx, str(keys))
    host = Host([0], endpoint, run_key=RUN_KEY)
    try:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=r"runs with --secure: give this host --secure"):
            host.register(timeout_s=60)
        assert time.monotonic() - t0 < 5.0  # not the 60 s timeout
    finally:
        host.close()
        srv.close(0)
        auth.stop()
        ctx.term()
