"""`fednet clients`: run a set of client ids on this host through the warm zygote."""
from __future__ import annotations

import sys
import time

from fednet.errors import ConfigError
from fednet.launch.gpus import parse_gpus
from fednet.launch.spawn import Zygote, client_specs


def parse_ids(text: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7]; errors name --ids."""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise ConfigError(f"--ids expects ranges and numbers such as 0-49 or 0,2,4 (got '{text}')") \
            from None
    if not out or min(out) < 0 or len(set(out)) != len(out):
        raise ConfigError(f"--ids must name distinct non-negative client ids (got '{text}')")
    return out


def run_clients(connect: str, ids: list[int], gpus: str | None, advertise: str, threads: int) -> int:
    """Fork the clients, wait for all of them to exit; exit code 0 only if all exited cleanly."""
    g = parse_gpus(gpus)
    if g:
        from fednet.launch.gpus import check_gpus
        check_gpus(g)
    zyg = Zygote(log_file=None)
    zyg.spawn(client_specs(len(ids), connect, g, threads, ids=ids, advertise=advertise,
                           log_level="WARNING"))
    print(f"started {len(ids)} clients connecting to {connect}", file=sys.stderr)
    try:
        while len(zyg.exits) < len(ids):
            zyg.dead()
            if zyg.proc.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        zyg.stop()
    bad = {c: code for c, code in zyg.exits.items() if code != 0}
    if bad:
        print(f"{len(bad)} clients exited with errors: {dict(list(bad.items())[:10])}", file=sys.stderr)
    return 0 if not bad and len(zyg.exits) == len(ids) else 1
