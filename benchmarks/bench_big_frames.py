"""Half-open connections holding part of a large frame (issue 23 item 7), against a plaintext
`fednet server` (its join key's gate, frames capped at 1.25 MiB):

    python3 benchmarks/bench_big_frames.py [--connections 2000] [--announce-mib 1024] [--send-mib 1]
        [--json F]

N raw TCP connections each send a ZMTP greeting offering PLAIN (the gate's mechanism) and then
the start of a command frame announcing ANNOUNCE MiB, of which they send up to SEND MiB, and
stay open; the server's RSS is sampled every 20 ms. Prints the peak above the server's
baseline. (With libzmq's per-frame limit at 2 GiB, as before, libzmq allocated each announced
frame and kept what arrived: tests/integration/test_attacks.py measured +307 MB for 300.)
"""

import argparse
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import RssSampler, fednet_installed, rss_bytes  # noqa: E402
from benchlib.util import headline_row, machine, measured, write_json  # noqa: E402


def headline(data: dict) -> list:
    """The dashboard's row: the server's peak RSS growth (BENCHMARKS section 23: <= 50 MB at the
    peak, for 2,000 connections)."""
    a = data.get("args", {})
    n = a.get("connections")
    return measured(
        headline_row(
            "trust boundary",
            f"{n} half-open connections, each announcing a {a.get('announce_mib')} "
            "MiB frame: plaintext fednet server's peak RSS growth",
            data.get("peak_mb"),
            "MB",
            "<= 50 MB" if n == 2000 else "",
            f"over {data.get('base_mb', 0):.0f} MB; up to {a.get('send_mib')} MiB sent on each; "
            f"{data.get('cut_short')} sends cut short",
        )
    )


def start_server(port: int, tmp: str) -> subprocess.Popen:
    """`fednet server` on 127.0.0.1:port for one client, once it says it is listening."""
    srv = subprocess.Popen(
        fednet_installed("server", "--bind", f"tcp://127.0.0.1:{port}", "--clients", "1",
                         "--rounds", "1", "--register-timeout", "120", "-q", "--out",
                         tmp + "/run"),
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert srv.stderr is not None
    for line in srv.stderr:
        if "listening" in line:
            break
    return srv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--announce-mib", type=int, default=1024)
    ap.add_argument("--send-mib", type=int, default=1)
    ap.add_argument("--port", type=int, default=5655)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    info = machine()
    tmp = tempfile.mkdtemp()
    resource.setrlimit(resource.RLIMIT_NOFILE, (a.connections + 4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    port = a.port
    srv = start_server(port, tmp)
    time.sleep(2)
    base = rss_bytes(srv.pid)
    sampler = RssSampler(srv.pid, every_s=0.02)
    g = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"PLAIN".ljust(20, b"\0") + b"\0" * 32
    held = []
    cut = 0
    chunk = b"\0" * (a.send_mib << 20)
    t0 = time.monotonic()
    for _ in range(a.connections):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(g + b"\x06" + (a.announce_mib << 20).to_bytes(8, "big"))
        s.settimeout(0.05)
        try:
            s.sendall(chunk)
        except OSError:
            cut += 1
        held.append(s)
    time.sleep(1)
    sampler.stop()
    peak = [max(base, sampler.peak_rss)]
    seconds = time.monotonic() - t0
    print(
        f"{a.connections} half-open, each announcing {a.announce_mib} MiB and sending up to "
        f"{a.send_mib} MiB: server peak +{(peak[0] - base) / 2**20:.1f} MB over "
        f"{base / 2**20:.0f} MB; {cut} sends cut short; {seconds:.1f} s"
    )
    for s in held:
        s.close()
    srv.terminate()
    srv.wait(30)
    data = {
        "machine": info,
        "args": vars(a),
        "peak_mb": (peak[0] - base) / 2**20,
        "base_mb": base / 2**20,
        "cut_short": cut,
        "seconds": seconds,
    }
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
