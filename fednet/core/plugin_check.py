"""Which plugins a run uses, and the check a client host makes before it joins a run.

The server names the run's plugins in WELCOME (`plugins`: [name, version] pairs): the
distributions or --plugin modules that provided its algorithm, its model, its dataset and its
objective, and every --plugin module the run names. A client on another host imports them (a
--plugin module by the same reference: a dotted name, or a .py path that must exist there too)
and refuses the run with one line when one is missing or has another version.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Any

from fednet import plugins
from fednet.plugins import PluginError, _canon
from fednet.config import RunConfig


def required(cfg: RunConfig) -> list[list[str]]:
    """The [name, version] pairs of the plugins the run uses (empty for built-ins only)."""
    from fednet.algorithms import registry

    plugins.load_modules(list(cfg.plugins))
    need: list[plugins.Plugin] = [plugins.LOADED[plugins.reference(r)] for r in cfg.plugins]
    used = [("algorithm", cfg.algo.name), ("dataset", cfg.data.dataset)]
    model = registry.model_name(cfg)
    if model == "auto":
        try:
            from fednet.models.nets import resolve_model

            model = resolve_model(model, cfg.data.dataset)
        except Exception:  # noqa: BLE001 - the run reports that itself
            pass
    used.append(("model", model))
    try:
        from fednet.data.datasets import load_dataset

        ds = load_dataset(cfg.data.dataset, cfg.data.data_root or None, cfg.data.download)
        used.append(("objective", ds.objective or "classification"))
    except Exception:  # noqa: BLE001
        pass
    for key in used:
        p = plugins.PROVIDERS.get(key)
        if p is not None and p not in need:
            need.append(p)
    return [[n, v] for n, v in need]


_WELCOME: dict[int, tuple[Any, list[list[str]]]] = {}


def welcome_plugins(cfg: RunConfig) -> list[list[str]]:
    """required(cfg), computed once per configuration (the server sends it in every WELCOME)."""
    got = _WELCOME.get(id(cfg))
    if got is None or got[0] is not cfg:
        got = _WELCOME[id(cfg)] = (cfg, required(cfg))
    return got[1]


def _have(name: str) -> str | None:
    """This host's version of plugin `name` (a distribution or a --plugin reference), or None."""
    plugins.scan()
    if _canon(name) in plugins.DISTS:
        plugins.preload()
        return plugins.DISTS[_canon(name)]
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version(name)  # installed, though without fednet entry points
    except (PackageNotFoundError, ValueError):
        pass
    try:
        return plugins.load_modules([name])[0][1]
    except plugins.ConfigError:
        return None


def require(pairs: list[Any]) -> None:
    """Import the plugins the server named; PluginError (one line) if one is missing or differs."""
    host = socket.gethostname()
    for name, version in pairs:
        have = _have(str(name))
        if have is None:
            hint = (f"copy it to that path on {host}" if str(name).endswith(".py") else
                    f"pip install '{name}=={version}'" if not version.startswith("sha256:") else
                    "put the module on this host's Python path")
            raise PluginError(f"the server's run needs plugin {name} {version}, which {host} "
                              f"does not have; {hint}")
        if have != version:
            raise PluginError(f"plugin {name} is {have or 'unversioned'} on {host} but {version} "
                              "on the server; install the same version on every host")


def checked_welcome(body: dict[str, Any]) -> dict[str, Any]:
    """A WELCOME body, once the plugins it names are imported and match (PluginError if not)."""
    require(body.get("plugins") or [])
    return body


def report(e: Exception) -> bool:
    """Print a plugin refusal as one line (once per `fednet clients` host: the client process
    that takes the zygote's token; the others stay quiet); False for any other error (the
    caller logs it)."""
    if not isinstance(e, PluginError):
        return False
    if _take_token():
        print(f"fednet: error: {e}", file=sys.stderr, flush=True)
    return True


_TOKEN: list[int] = []  # the read end of a pipe holding one byte, inherited by forked clients


def arm_report_token() -> None:
    """In the zygote, before it forks: one token for the whole host (report())."""
    r, w = os.pipe()
    os.write(w, b"1")
    os.close(w)
    os.set_blocking(r, False)
    _TOKEN.append(r)


def _take_token() -> bool:
    if not _TOKEN:
        return True  # not forked from a zygote: this process reports for itself
    try:
        return os.read(_TOKEN[0], 1) == b"1"
    except BlockingIOError:
        return False


def installed() -> list[tuple[str, str, str]]:
    """(plugin, version, what it provides) for every plugin this process knows, and broken ones."""
    plugins.preload()
    rows: dict[plugins.Plugin, list[str]] = {}
    for (kind, name), p in plugins.PROVIDERS.items():
        rows.setdefault(p, []).append(f"{kind} {name}")
    out = [(n, v or "-", ", ".join(sorted(what))) for (n, v), what in rows.items()]
    for d, v in plugins.DISTS.items():
        if not any(_canon(n) == d for n, _, _ in out):
            out.append((d, v, "nothing"))
    out += [(where, "-", f"BROKEN: {why}") for where, why in plugins.BROKEN.items()]
    return sorted(out)

