"""A client process's entry point: one client, or a Host of several (`--clients-per-process`)."""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from fednet.client.app import EXIT_ERROR, EXIT_USAGE, Client
from fednet.client.host import Host
from fednet.client.link import ids_text
from fednet.config.liveness import DEFAULT, Liveness
from fednet.errors import ConfigError
from fednet.core.plugin_check import report

log = logging.getLogger("fednet.client")


def run_host(cids: Sequence[int], connect: str, device: str = "cpu", advertise: str = "127.0.0.1",
             threads: int = 1, register_timeout: float = 60.0, secure: str = "",
             run_key: bytes | None = None, key_name: str = "",
             curve: tuple[bytes, bytes] | None = None, liveness: Liveness = DEFAULT) -> int:
    """Run several clients in this process to completion; returns the process exit code."""
    try:
        host = Host(cids, connect, device, advertise, threads, secure, run_key, key_name, curve,
                    liveness=liveness)
    except ConfigError as e:
        log.error("clients %s: %s", ids_text(cids), e)
        return EXIT_USAGE
    host.lost_timeout = register_timeout
    for c in host.clients:
        c.lost_timeout = register_timeout
    try:
        host.register(register_timeout)
        return host.serve()
    except ConfigError as e:
        if not report(e):  # a missing plugin: one line per host, not one per client
            log.error("clients %s: %s", ids_text(cids), e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_ERROR
    finally:
        host.close()


def run_client(cid: int | Sequence[int], connect: str, device: str = "cpu",
               advertise: str = "127.0.0.1", threads: int = 1, register_timeout: float = 60.0,
               secure: str = "", run_key: bytes | None = None, key_name: str = "",
               curve: tuple[bytes, bytes] | None = None, liveness: Liveness = DEFAULT) -> int:
    """Run one client (or, given a list of ids, several in this process) to completion; returns
    a process exit code. `run_key`: the launcher's secret (clients it forked prove their ids
    with it); `key_name`: which key pair of the --secure folder is this host's; `curve`: the
    key pair `fednet launch --secure` issued to this process instead; `liveness`: the
    timers of its server link and registration (config/liveness.py)."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if not isinstance(cid, int):  # a process's ids: a range, or a list
        if len(cid) > 1:
            return run_host(cid, connect, device, advertise, threads, register_timeout, secure,
                            run_key, key_name, curve, liveness)
        cid = int(cid[0])
    try:
        client = Client(cid, connect, device, advertise, threads, secure, run_key=run_key,
                        key_name=key_name, curve=curve, liveness=liveness)
    except ConfigError as e:
        log.error("client %d: %s", cid, e)
        return EXIT_USAGE
    client.lost_timeout = register_timeout
    try:
        client.register(register_timeout)
        return client.serve()
    except ConfigError as e:
        if not report(e):
            log.error("client %d: %s", cid, e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_ERROR
    finally:
        client.close()
