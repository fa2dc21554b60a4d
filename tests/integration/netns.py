"""A small emulated LAN made of network namespaces, for tests that run fednet across "hosts".

Layout (every name carries the test process id, so parallel runs do not collide):

    <p>-srv  eth0 10.77.X.1 --+
    <p>-h1   eth0 10.77.X.2 --+-- veth --> <p>-br: bridge br0 (ports vsrv, vh1, vh2)
    <p>-h2   eth0 10.77.X.3 --+

Nothing is created in the root namespace: each veth pair is made inside the bridge namespace
with its peer placed straight into the host namespace (`ip -n BR link add ... peer ... netns H`),
and addresses exist only inside the namespaces made here. `close()` deletes every namespace,
which also deletes their links and qdiscs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from collections.abc import Iterator
from dataclasses import dataclass, field

HOSTS = ("srv", "h1", "h2")


class NetnsUnavailable(RuntimeError):
    """The machine cannot build namespaces (not root, no `ip`, no veth/bridge support)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`; on failure raise with its stderr."""
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip() or res.returncode}")
    return res


def tc(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `tc ARGS` inside namespace ns."""
    res = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True,
                         timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} (in {ns}): {res.stderr.strip() or res.returncode}")
    return res


@dataclass
class Lan:
    """Three hosts (srv, h1, h2) on one bridge; `ns[host]` and `addr[host]` name them."""

    prefix: str
    subnet: int
    ns: dict[str, str] = field(default_factory=dict)
    addr: dict[str, str] = field(default_factory=dict)
    bridge_ns: str = ""
    made: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, subnet: int | None = None, hosts: tuple[str, ...] = HOSTS) -> Lan:
        """Create the namespaces, veths and bridge (one host per name in `hosts`, the first is
        the server's); raise NetnsUnavailable if that is impossible."""
        if os.geteuid() != 0:
            raise NetnsUnavailable("needs root to create network namespaces")
        pid = os.getpid()
        lan = cls(prefix=f"fn{pid}", subnet=subnet if subnet is not None else 1 + pid % 250)
        lan.bridge_ns = f"{lan.prefix}-br"
        try:
            lan._make_ns(lan.bridge_ns)
        except (RuntimeError, FileNotFoundError) as e:
            lan.close()
            raise NetnsUnavailable(f"`ip netns add` failed: {e}") from None
        try:
            lan._wire(hosts)
        except Exception:
            lan.close()
            raise
        return lan

    def _make_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.made.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        # no IPv6 chatter (router solicitations, DAD) on the links whose counters we read
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw",
                        "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                       capture_output=True, timeout=20)

    def _wire(self, hosts: tuple[str, ...]) -> None:
        br = self.bridge_ns
        ip("-n", br, "link", "add", "br0", "type", "bridge")
        ip("-n", br, "link", "set", "br0", "up")
        for i, host in enumerate(hosts):
            name = f"{self.prefix}-{host}"
            self._make_ns(name)
            self.ns[host] = name
            self.addr[host] = f"10.77.{self.subnet}.{i + 1}"
            port = self.port(host)
            ip("-n", br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
            ip("-n", br, "link", "set", port, "master", "br0")
            ip("-n", br, "link", "set", port, "up")
            ip("-n", name, "addr", "add", f"{self.addr[host]}/24", "dev", "eth0")
            ip("-n", name, "link", "set", "eth0", "up")
        self._wait_reachable()

    @staticmethod
    def port(host: str) -> str:
        """The bridge-side end (inside the bridge namespace) of host's veth."""
        return f"v{host}"

    def _wait_reachable(self, timeout_s: float = 10.0) -> None:
        """Until h1 and h2 open a TCP connection to srv through the bridge (no ping here)."""
        srv = self.addr["srv"]
        listener = subprocess.Popen(
            [*self.exec_prefix("srv"), sys.executable, "-c",
             "import socket,sys\n"
             f"s=socket.create_server(('{srv}', 0)); s.settimeout({timeout_s})\n"
             "print(s.getsockname()[1], flush=True)\n"
             f"for _ in range({len(self.ns) - 1}): s.accept()[0].close()\n"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            port = int(listener.stdout.readline() or 0)
            if not port:
                raise RuntimeError(f"no TCP listener on {srv}: {listener.stderr.read().strip()}")
            probe = ("import socket,sys,time\n"
                     f"end=time.monotonic()+{timeout_s}\n"
                     "while True:\n"
                     f"  try: socket.create_connection(('{srv}', {port}), timeout=1).close()"
                     "; break\n"
                     "  except OSError:\n"
                     "    if time.monotonic()>end: sys.exit(1)\n"
                     "    time.sleep(0.1)\n")
            for host in [h for h in self.ns if h != "srv"]:
                res = subprocess.run([*self.exec_prefix(host), sys.executable, "-c", probe],
                                     capture_output=True, timeout=timeout_s + 10)
                if res.returncode != 0:
                    raise RuntimeError(f"{host} cannot reach {srv} through the bridge")
            listener.wait(timeout=timeout_s)
        finally:
            if listener.poll() is None:
                listener.kill()
                listener.wait()

    def exec_prefix(self, host: str) -> list[str]:
        """`ip netns exec NS` for host: prepend it to a command to run it on that host."""
        return ["ip", "netns", "exec", self.ns[host]]

    def counters(self, host: str) -> dict[str, int]:
        """rx/tx bytes and packets of host's eth0 (as seen inside the host)."""
        out = ip("-n", self.ns[host], "-j", "-s", "link", "show", "dev", "eth0").stdout
        st = json.loads(out)[0]["stats64"]
        return {"rx_bytes": st["rx"]["bytes"], "tx_bytes": st["tx"]["bytes"],
                "rx_packets": st["rx"]["packets"], "tx_packets": st["tx"]["packets"]}

    def port_counters(self) -> dict[str, dict[str, int]]:
        """rx/tx bytes of every bridge port (rx = what that host sent into the bridge)."""
        out = ip("-n", self.bridge_ns, "-j", "-s", "link", "show", "master", "br0").stdout
        return {d["ifname"][1:]: {"rx_bytes": d["stats64"]["rx"]["bytes"],
                                  "tx_bytes": d["stats64"]["tx"]["bytes"]} for d in json.loads(out)}

    @contextmanager
    def capped(self, host: str, rate: str = "1mbit", burst: str = "16kb",
               latency: str = "400ms") -> Iterator[None]:
        """A tbf rate cap on host's link, both directions: its eth0 (uplink) and its bridge port
        (downlink). Removed on exit."""
        spec = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        where = [(self.ns[host], "eth0"), (self.bridge_ns, self.port(host))]
        added: list[tuple[str, str]] = []
        try:
            for ns, dev in where:
                tc(ns, "qdisc", "add", "dev", dev, *spec)
                added.append((ns, dev))
            yield
        finally:
            for ns, dev in added:
                tc(ns, "qdisc", "del", "dev", dev, "root", check=False)

    @contextmanager
    def shaped(self, rates: dict[str, tuple[float, float]], burst: int = 4096,
               latency: str = "5s") -> Iterator[None]:
        """tbf caps matching client profiles: rates[host] = (up, down) in bytes/s; up on the
        host's eth0, down on its bridge port. A small bucket (`burst` bytes, a few packets) so
        that little passes at line rate; a deep queue (`latency`) so that TCP sees no drops."""
        added: list[tuple[str, str]] = []
        try:
            for host, (up, down) in rates.items():
                for ns, dev, rate in ((self.ns[host], "eth0", up),
                                      (self.bridge_ns, self.port(host), down)):
                    tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                       f"{round(rate * 8)}bit", "burst", f"{burst}b", "latency", latency)
                    added.append((ns, dev))
            yield
        finally:
            for ns, dev in added:
                tc(ns, "qdisc", "del", "dev", dev, "root", check=False)

    def kill_inside(self) -> list[int]:
        """SIGKILL what is still inside one of our namespaces (only processes this test started)."""
        killed = []
        for ns in self.made:
            res = ip("netns", "pids", ns, check=False)
            for tok in res.stdout.split():
                try:
                    os.kill(int(tok), 9)
                    killed.append(int(tok))
                except (ValueError, ProcessLookupError, PermissionError):
                    pass
        return killed

    def close(self) -> None:
        """Delete every namespace made here (their veths, bridge and qdiscs go with them)."""
        self.kill_inside()
        for ns in reversed(self.made):
            ip("netns", "del", ns, check=False)
        self.made.clear()
