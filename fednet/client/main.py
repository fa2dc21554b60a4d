"""A client process's entry point: its clients (one, or `--clients-per-process N`) in one Host."""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from fednet.client.app import EXIT_ERROR, EXIT_USAGE
from fednet.client.host import Host
from fednet.client.table import ids_text
from fednet.config.liveness import DEFAULT, Liveness
from fednet.errors import ConfigError
from fednet.core.plugin_check import report

log = logging.getLogger("fednet.client")


def run_client(cid: int | Sequence[int], connect: str, device: str = "cpu",
               advertise: str = "127.0.0.1", threads: int = 1, register_timeout: float = 60.0,
               secure: str = "", run_key: bytes | None = None, key_name: str = "",
               curve: tuple[bytes, bytes] | None = None, liveness: Liveness = DEFAULT) -> int:
    """Run one client, or a process's ids (a range or a list), to completion; returns the
    process exit code. `run_key`: the launcher's secret (clients it forked prove their ids
    with it); `key_name`: which key pair of the --secure folder is this host's; `curve`: the
    key pair `fednet launch --secure` issued to this process instead; `liveness`: the
    timers of its server link and registration (config/liveness.py)."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    return run_host([cid] if isinstance(cid, int) else cid, connect, device, advertise, threads,
                    register_timeout, secure, run_key, key_name, curve, liveness)


def run_host(cids: Sequence[int], connect: str, device: str = "cpu", advertise: str = "127.0.0.1",
             threads: int = 1, register_timeout: float = 60.0, secure: str = "",
             run_key: bytes | None = None, key_name: str = "",
             curve: tuple[bytes, bytes] | None = None, liveness: Liveness = DEFAULT) -> int:
    """Run the clients `cids` in this process to completion; returns the process exit code."""
    name = f"client{'s' if len(cids) > 1 else ''} {ids_text(cids)}"
    try:
        host = Host(cids, connect, device, advertise, threads, secure, run_key, key_name, curve,
                    lost_timeout=register_timeout, liveness=liveness)
    except ConfigError as e:
        log.error("%s: %s", name, e)
        return EXIT_USAGE
    try:
        host.register(register_timeout)
        return host.serve()
    except ConfigError as e:
        if not report(e):  # a missing plugin: one line per host, not one per client
            log.error("%s: %s", name, e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_ERROR
    finally:
        host.close()
