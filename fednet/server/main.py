"""Whole runs over ZeroMQ: `fednet launch` (server + local clients) and `fednet server` (LAN)."""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import zmq

from fednet.algorithms.checks import validate
from fednet.config import RunConfig
from fednet.core.run import Run, Stopped
from fednet.core.status import RunStatus
from fednet import plugins
from fednet.errors import ConfigError
from fednet.launch.spawn import Zygote, client_specs, open_client_log
from fednet.metrics.history import resolve_out
from fednet.platform import packing
from fednet.platform.gpus import check_gpus
from fednet.platform.malloc import Reserve
from fednet.platform.proc import (check_files_per_process, check_server_connections,
                                  pss_bytes, raise_fd_limit)
from fednet.server.conns import identity_for
from fednet.server.inflight import reserve_bytes
from fednet.transport import channels

if TYPE_CHECKING:
    from fednet.server.app import ZmqServer

log = logging.getLogger("fednet.server")


def _client_exits(zyg: Zygote | None) -> dict[str, Any]:
    return {} if zyg is None else {"client_exit_codes": {
        str(c): code for c, code in sorted(zyg.failed().items())}}


def _client_view(byes: dict[int, dict[str, Any]]) -> dict[str, int]:
    """The clients' own ledgers added up (sent with BYE): a cross-check of the server's view."""
    out: dict[str, int] = {}
    for k, v in (kv for totals in byes.values() for kv in totals.items()):
        if isinstance(v, int):
            out[k] = out.get(k, 0) + v
    return out


def split_bind(bind: str) -> tuple[str, int]:
    """'tcp://HOST:PORT' -> (HOST, PORT); errors name --bind."""
    host, _, port = bind[6:].rpartition(":")
    if not bind.startswith("tcp://") or not host:
        raise ConfigError(f"--bind expects tcp://HOST:PORT, e.g. tcp://0.0.0.0:5555 (got '{bind}')")
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--bind: port '{port}' is not a number in 0..65535 (0 = any free port)")
    return host, int(port)


def precheck(cfg: RunConfig) -> None:
    """Configuration errors that need the dataset but not torch, found before any process starts."""
    from fednet.network import latency
    from fednet.data import load_dataset, run_partition

    validate(cfg)
    plugins.load_modules(list(cfg.plugins))  # (the CLI did; a RunConfig's plugins fail here,
    # in one line, not in every READY's WELCOME while the registration waits out its timeout)
    d = cfg.data
    ds = load_dataset(d.dataset, d.data_root or None, d.download)  # cached for the session
    run_partition(ds, d, cfg.clients, cfg.seed)
    latency.profiles(cfg.latency, cfg.clients, cfg.seed)


def per_process_choice(cfg: RunConfig) -> packing.Choice:
    """--clients-per-process for this machine: the number given, or the auto rule's choice
    (platform/packing.py) from its cores, memory and, with --gpus, device memory."""
    requested = cfg.net.clients_per_process
    if requested:
        return packing.choose(cfg.clients, packing.this_machine(), requested)
    machine = packing.this_machine(cfg.gpus)
    per_client, model = packing.CLIENT_DEVICE_BYTES, 0
    from fednet.core.footprint import device_bytes_per_client, model_bytes
    try:
        model = model_bytes(cfg)
        if cfg.gpus and machine.device_bytes:
            per_client = device_bytes_per_client(cfg)
    except Exception as e:  # noqa: BLE001 - e.g. a plugin model that cannot be built on meta
        log.warning("cannot size the model on the meta device (%s); counting %d MiB per "
                    "client", e, per_client >> 20)
    from fednet.core.batching import batching
    return packing.choose(cfg.clients, machine, 0, cfg.gpus, per_client,
                          real_time=cfg.latency.real, model_bytes=model, handoffs=_handoffs(cfg),
                          batched=batching(cfg))


def _batching(cfg: RunConfig) -> bool:  # the run trains its clients in blocks
    from fednet.core.batching import batching; return batching(cfg)  # noqa: E702


def _handoffs(cfg: RunConfig) -> bool:  # the algorithm hands models over: clients hold files
    from fednet.core import footprint; return footprint.hands_off(cfg)  # noqa: E702


STOPPING = "interrupted: stopping the clients and writing the results"


def run_zmq(cfg: RunConfig, quiet: bool = False, local_clients: bool = True,
            on_listen: Any = None, prepare: Any = None, resume: bool = False,
            join_key: str = "") -> dict[str, Any]:
    """Serve a whole run; with local_clients, fork the clients here through the zygote.

    Everything started here is owned by a `Run` and stopped before returning, also on Ctrl-C and
    on errors; metrics.jsonl is already on disk for the rounds that finished, and summary.json
    says why the run ended. `join_key`: plaintext `fednet server`'s join key file (drawn there
    when it does not exist; protocol/join_key.py); without it such a server proves nothing.
    """
    t_start = time.monotonic()
    raise_fd_limit()  # one connection per client process; the zygote's children inherit it
    check_server_connections(cfg.clients, cfg.net.clients_per_process, local_clients)
    if local_clients:
        check_gpus(cfg.gpus)
        if cfg.net.clients_per_process:
            check_files_per_process(cfg.net.clients_per_process, _handoffs(cfg))
    precheck(cfg)
    runtime = "launch" if local_clients else "server"
    with Run(runtime, resolve_out(cfg), on_interrupt=STOPPING, t_start=t_start) as run:
        server, zyg = _start(run, cfg, quiet, local_clients, prepare, resume, join_key)
        run.started()
        got = run.extra.get("clients_per_process")
        _announce(server, cfg, packing.Choice(**got) if got else None, on_listen)
        _serve(run, server, zyg, cfg, local_clients, join_key)
    assert run.summary is not None
    return run.summary


def _start(run: Run, cfg: RunConfig, quiet: bool, local_clients: bool, prepare: Any,
           resume: bool, join_key: str = "") -> tuple[ZmqServer, Zygote | None]:
    """Start the run's resources, each owned by `run` (stopped in reverse order).

    Start-up overlaps on both cores: the socket is bound first (clients can queue their READY),
    the zygote warms up while this process imports torch and builds the session; the clients
    are forked once the session exists (the zygote reads commands only after its warm-up, so
    this costs nothing, and a configuration error stops the zygote before any client exists)."""
    assert run.out is not None
    out = run.out
    logfile = open_client_log(out) if local_clients else None
    if logfile is not None:
        run.enter(logfile)
    # --clients-per-process auto is chosen once torch is imported (the model's size counts),
    # except under --secure, whose CURVE pairs (one per process) are needed before the bind
    early = per_process_choice(cfg) if local_clients and cfg.net.secure else None
    ident, specs = identity_for(cfg, local_clients, early.per_process if early else 1,
                                join_key)
    ctx = channels.server_context()
    built: list[ZmqServer] = []
    run.on_stop(_close_zmq, run, ctx, built)
    from fednet.transport.security import server_guard  # CURVE + allowed keys, or the gate
    setup, auth = server_guard(ctx, cfg.net.secure, ident.key_ids, specs.get("run_key"))
    if auth is not None:
        run.on_stop(auth.stop)
    live = cfg.liveness
    sock, endpoint = channels.bind_router(
        ctx, cfg.net.host, cfg.net.port, what="--bind port" if not local_clients else "net.port",
        setup=setup, heartbeat_ms=channels.server_heartbeat_ms(cfg.clients, live),
        handshake_ms=channels.server_handshake_ms(cfg.clients, live),
        hwm=channels.ROUTER_HWM + 2 * cfg.clients, live=live)
    run.finish_here()  # the summary is written once the server and the clients have stopped
    zyg = Zygote(cfg.data.dataset, cfg.data.data_root, logfile,
                 batch_size=cfg.train.batch_size) if local_clients else None
    if zyg is not None:
        run.on_stop(_stop_zygote, run, zyg, built)
    import torch

    from fednet.core.session import Session
    from fednet.server.app import ZmqServer

    torch.set_num_threads(max(1, cfg.train.threads))
    session = run.open(Session(cfg, quiet=quiet, out=out, resume=resume,
                                   store_here=local_clients))
    if prepare is not None:  # e.g. tests and notebooks that customise the algorithm object
        prepare(session)
    server = ZmqServer(session, bound=(ctx, sock, endpoint), identity=ident)
    built.append(server)
    if server.tasks_per_process:  # a big model: server/inflight.py
        run.extra["tasks_per_process"] = server.tasks_per_process
    run.on_stop(_shutdown, run, server)
    run.clients = lambda: server.clients.roster()  # every registered client, built when read
    run.reports.append(lambda: _report(run, server))
    if zyg is not None:
        _spawn(run, cfg, zyg, early, endpoint, specs, session)
    return server, zyg


def _spawn(run: Run, cfg: RunConfig, zyg: Zygote, early: packing.Choice | None, endpoint: str,
           specs: dict[str, Any], session: Any) -> None:
    """Fork the run's client processes from the warm zygote (clients per process chosen now,
    unless --secure chose them before the bind)."""
    choice = early or per_process_choice(cfg)
    check_files_per_process(choice.per_process, _handoffs(cfg))
    run.extra["clients_per_process"] = choice.as_dict()
    zyg.spawn(client_specs(cfg.clients, endpoint, cfg.gpus, cfg.train.threads, secure=cfg.net.secure,
                           register_timeout=cfg.net.register_timeout,
                           per_process=choice.per_process, liveness=cfg.liveness, **specs),
              template=session.model_template(), batched=_batching(cfg))
    zyg.wait_warm()


def _announce(server: ZmqServer, cfg: RunConfig, choice: packing.Choice | None,
              on_listen: Any) -> None:
    progress = server.s.progress
    progress.message(server.s.describe())
    from fednet.core.batching import note

    if note(server.s.cfg):  # --batch-clients asked of an algorithm that cannot batch
        progress.message(note(server.s.cfg))
    if choice is not None:
        progress.message(choice.line(cfg.clients))
    cores = os.cpu_count() or 1
    if choice is not None and not choice.auto and choice.per_process == 1 and \
            cfg.clients > packing.PROCESSES_PER_CORE * cores:
        progress.message(f"{cfg.clients} client processes on {cores} cores: "
                         "--clients-per-process auto starts faster, needs a fraction of "
                         "the memory and gives the same results")
    if server.tasks_per_process:
        progress.message(f"a {server.s.evaluator.model_bytes / 1e6:.1f} MB model: each client "
                         f"process gets at most {server.tasks_per_process} tasks at a time "
                         "(--max-inflight N sets a limit of your own)")
    if on_listen is None:
        progress.message(f"server listening on {server.endpoint}; results in {server.s.out}")
    else:  # `fednet server`: the endpoint is printed by the caller even with --quiet
        progress.message(f"results in {server.s.out}")
        on_listen(server.endpoint)


def _serve(run: Run, server: ZmqServer, zyg: Zygote | None, cfg: RunConfig,
           local_clients: bool, join_key: str = "") -> None:
    """Wait for the clients, then run every round."""
    session, run.extra["endpoint"] = server.s, server.endpoint
    hint = f"tracebacks in {session.out}/logs/clients.log" if zyg else ""
    session.driver.verdict.log_hint = hint
    if zyg is not None:
        server.watch = zyg.exits
    # big models: map the heap for a first round's results while the clients register
    reserving = Reserve(reserve_bytes(cfg, session.evaluator.model_bytes))
    try:
        server.wait_for_clients(cfg.clients, cfg.net.register_timeout)
    except TimeoutError as e:
        proof = (f" --secure {cfg.net.secure} --key NAME" if cfg.net.secure else
                 f" --join-key {join_key}" if join_key else "")
        hint = (f"see {session.out}/logs/clients.log" if local_clients else
                f"start them with `fednet clients --connect {server.endpoint}{proof} --ids "
                f"0-{cfg.clients - 1}`")
        raise Stopped(RunStatus.REGISTRATION_TIMEOUT,
                      f"{e}; {hint}, or raise --register-timeout") from None
    run.extra["ready_s"] = time.monotonic() - run.t_start
    mapped = ""
    if (held := reserving.join()):
        run.extra["heap_reserved_bytes"] = held
        mapped = f" ({held / 1e9:.2f} GB mapped meanwhile for a first round's results)"
    session.progress.message(f"{len(server.alive_clients())} clients ready in "
                             f"{run.extra['ready_s']:.1f}s{mapped}")
    session.driver.run(server)
    if zyg is not None:
        run.extra["client_pss_bytes"] = pss_bytes(zyg.child_pids())


# ---- stopping, in this order: server, clients, summary, authenticator, sockets, log ------------
def _shutdown(run: Run, server: ZmqServer) -> None:
    if run.is_started:
        server.shutdown(timeout_s=5.0)


def _stop_zygote(run: Run, zyg: Zygote, built: list[ZmqServer]) -> None:
    if run.is_started:  # clients that said BYE exit by themselves within moments
        server = built[0]
        zyg.stop(wait_for=server.fates.waiting_exit())
    else:
        zyg.stop()
    run.extra.update(_client_exits(zyg))


def _report(run: Run, server: ZmqServer) -> None:
    """The server's part of the summary (after the clients stopped)."""
    driver = server.s.driver
    driver.failures.extend(server.untasked_deaths(driver.failures))
    run.extra["rejected_messages"] = server.chan.rejects.total
    run.extra["client_phases"] = server.final_phases()
    run.extra["dropped_sends"] = server.chan.dropped_sends  # REJECTs not sent (rate, queue)
    view = _client_view(server.fates.totals)
    run.extra["client_rejected_messages"] = view.pop("rejected_messages", 0)
    run.extra["client_rejected_bytes"] = view.pop("rejected", 0)
    run.extra["bytes_client_view"] = view
    run.extra["total_wall_s"] = time.monotonic() - run.t_start


def _close_zmq(run: Run, ctx: zmq.Context, built: list[ZmqServer]) -> None:
    if run.is_started:
        built[0].close()  # the socket (after SHUTDOWN and BYE), then the context
    else:  # a run that never started: nothing is worth waiting for
        ctx.destroy(linger=0)
