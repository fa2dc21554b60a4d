"""Plugins: algorithms, models and datasets from installed packages and from modules.

- Installed packages declare entry points in three groups (docs/extending.md):
  `fednet.algorithms` (a registry Spec, or a callable that registers, or a module that does on
  import), `fednet.models` (name = the model, a builder (num_classes, input_shape) -> nn.Module)
  and `fednet.datasets` (name = the dataset, a loader (data_root, download, split_seed) ->
  Dataset). Algorithms load the first time the registry lists its names (the CLI derives --algo
  and the per-algorithm options from it); models and datasets load on first use, or all at once
  in preload() (the zygote, before it warms up and forks the clients).
- `--plugin MODULE` (a dotted name or a .py file; `plugins` in config.toml) imports code that is
  not packaged; it registers through the same calls (registry.register, models.register_model,
  data.register_dataset, training.objective.register_objective).

Each registration remembers which plugin provided it, so a run names exactly the plugins it uses
(required(): [name, version] pairs, sent in WELCOME). A `fednet clients` process on another host
imports them and refuses the run with one line (require()) when one is missing or differs. No
torch is imported here.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENTRY_HANDLERS: dict[str, Callable[[Any], None]] = {}
"""kind -> what a loaded entry point's object becomes (set by the layer that owns the kind)."""

GROUPS = {"fednet.algorithms": "algorithm", "fednet.models": "model", "fednet.datasets": "dataset"}
Plugin = tuple[str, str]  # (name, version): a distribution, or a --plugin module and its version
LOAD_CHECKS: list[Callable[[str, list[tuple[str, str]]], None]] = []
"""Run on each --plugin module once it is imported, with its reference and what it registered
((kind, name) pairs): each raises ConfigError naming what is wrong (algorithms/spec.py checks
that a Spec's classes exist)."""

PROVIDERS: dict[tuple[str, str], Plugin] = {}  # (kind, name) -> the plugin that registered it
LOADED: dict[str, Plugin] = {}                 # --plugin reference -> (reference, version)
_REFUSED: dict[str, str] = {}                  # --plugin reference -> why its check failed
DISTS: dict[str, str] = {}                     # distribution with fednet entry points -> version
BROKEN: dict[str, str] = {}                    # "dist (group: name)" -> why it did not load
PENDING: dict[str, dict[str, Any]] = {"model": {}, "dataset": {}}  # kind -> name -> entry point
                                               # (or (the loaded object,))
_SINKS: dict[str, Callable[[str, Any], None]] = {}  # kind -> register(name, lazy loader)
_CURRENT: list[Plugin] = []
_FILES: list[tuple[str, str, Any]] = []  # (stem, private module name, module) being imported


class PluginError(ConfigError):
    """A plugin the run needs is missing or differs (one line; exit code 2)."""


def provide(kind: str, name: str) -> None:
    """Called by every registration: remember the plugin being loaded, if any."""
    if _CURRENT:
        PROVIDERS[(kind, name)] = _CURRENT[-1]


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


_SCANNED: list[bool] = []


def scan() -> None:
    """Find the installed entry points (once per process; nothing is imported yet)."""
    if _SCANNED:
        return
    _SCANNED.append(True)
    from importlib.metadata import entry_points

    for group, kind in GROUPS.items():
        for ep in entry_points(group=group):
            dist = getattr(ep, "dist", None)
            plugin = (dist.name, dist.version) if dist is not None else (ep.module, "")
            DISTS[_canon(plugin[0])] = plugin[1]
            PENDING.setdefault(kind, {})[ep.name] = ep
            if kind != "algorithm":
                PROVIDERS[(kind, ep.name)] = plugin
                if kind in _SINKS:
                    _SINKS[kind](ep.name, _lazy(kind, ep.name))


def load_algorithms() -> None:
    """Import every algorithm entry point (once; the registry asks before it lists names)."""
    scan()
    for name, ep in list(PENDING.get("algorithm", {}).items()):
        if not isinstance(ep, tuple):
            dist = getattr(ep, "dist", None)
            plugin = (dist.name, dist.version) if dist is not None else (ep.module, "")
            PENDING["algorithm"][name] = (_load_entry(ep, plugin, "algorithm"),)


def _load_entry(ep: Any, plugin: Plugin, kind: str) -> Any:
    """Load one entry point under its plugin's name; a broken one is a warning, not a crash."""
    _CURRENT.append(plugin)
    try:
        obj = ep.load()
        if kind in ENTRY_HANDLERS:  # algorithms: registered (algorithms/spec.py)
            ENTRY_HANDLERS[kind](obj)
        return obj
    except Exception as e:  # noqa: BLE001 - one bad plugin must not stop fednet
        where = f"{plugin[0]} ({[g for g, k in GROUPS.items() if k == kind][0]}: {ep.name})"
        BROKEN[where] = f"{type(e).__name__}: {e}"
        print(f"fednet: warning: plugin {where} could not be loaded: {BROKEN[where]}",
              file=sys.stderr)
        return None
    finally:
        _CURRENT.pop()


def _lazy(kind: str, name: str) -> Callable[..., Any]:
    """A stand-in that loads the entry point on first call, then calls what it gives."""
    def call(*a: Any, **kw: Any) -> Any:
        return load_pending(kind, name)(*a, **kw)
    call.fednet_lazy = True  # type: ignore[attr-defined]  # a marker on the function object
    return call


def load_pending(kind: str, name: str) -> Any:
    """The object behind a model or dataset entry point (loaded once)."""
    ep = PENDING[kind][name]
    if isinstance(ep, tuple):  # already loaded: (object,)
        return ep[0]
    obj = _load_entry(ep, PROVIDERS[(kind, name)], kind)
    if obj is None:
        raise ConfigError(f"{kind} '{name}' comes from a plugin that could not be loaded "
                          "(see the warning above; `fednet plugins` lists it)")
    PENDING[kind][name] = (obj,)
    if kind in _SINKS:
        _SINKS[kind](name, obj)  # the real loader replaces the stand-in
    return obj


def attach(kind: str, register: Callable[[str, Any], None]) -> None:
    """models.nets and data.datasets hand over their register function: pending entry points
    are registered now (as lazy stand-ins), later ones as they are found."""
    _SINKS[kind] = register
    scan()
    for name, ep in PENDING[kind].items():
        register(name, ep[0] if isinstance(ep, tuple) else _lazy(kind, name))


def preload() -> None:
    """Load every plugin entry point now (the zygote, before it warms up and forks)."""
    load_algorithms()
    for kind in ("model", "dataset"):
        for name in list(PENDING[kind]):
            try:
                load_pending(kind, name)
            except ConfigError:
                pass  # warned once already; a run that uses it fails with its own line


# ---- --plugin modules ------------------------------------------------------------------------
def reference(ref: str) -> str:
    """How a --plugin value is recorded: a .py file as its absolute path, a module as given."""
    ref = ref.strip()
    return str(Path(ref).expanduser().resolve()) if ref.endswith(".py") else ref


def merged(first: list[str], more: list[str]) -> list[str]:
    """The plugins of both lists, each once, in order."""
    out: list[str] = []
    for r in map(reference, [*first, *more]):
        if r not in out:
            out.append(r)
    return out


def _version(mod: Any) -> str:
    v = getattr(mod, "__version__", None)
    if isinstance(v, str) and v:
        return v
    path = getattr(mod, "__file__", None)
    if path and os.path.isfile(path):  # unversioned code: its content is its version
        return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    return ""


def private_name(path: Path) -> str:
    """The module name a .py plugin is imported under: its stem made an identifier plus a digest
    of its absolute path, so a file named random.py shadows nothing and two copies of a plugin
    never collide (the same on every process that imports the same path)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]
    return f"fednet_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"


def own_ref(ref: str) -> str:
    """A "module:Class" reference registered while a .py plugin runs, to that file itself (by
    its stem, or by a module that does not exist but whose class the file defines: a copy of
    fedmedian.py saved as fedmedian_v2.py) -> the file's private module; others as given."""
    if not _FILES or ":" not in ref:
        return ref
    stem, private, mod = _FILES[-1]
    module, _, attr = ref.partition(":")
    if module == stem:
        return f"{private}:{attr}"
    if module in sys.modules or not hasattr(mod, attr.split(".")[0]):
        return ref
    try:
        exists = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        exists = False
    return ref if exists else f"{private}:{attr}"


def _import(ref: str) -> Any:
    if ref.endswith(".py"):
        path = Path(ref)
        if not path.is_file():
            raise ConfigError(f"--plugin {ref}: no such file")
        name = private_name(path)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        _FILES.append((path.stem, name, mod))
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            _FILES.pop()
        return mod
    try:
        return importlib.import_module(ref)
    except ModuleNotFoundError as e:
        if e.name is None or not ref.startswith(e.name):
            raise
        if os.getcwd() not in sys.path:  # `fednet` runs from its console script: cwd is not
            sys.path.append(os.getcwd())  # on the path, while `python -m` has it
            try:
                return importlib.import_module(ref)
            except ModuleNotFoundError:
                pass
        raise ConfigError(f"--plugin {ref}: no module named '{ref}' on the Python path; give "
                          "a .py file, run from its folder, or install its package") from None


def load_modules(refs: list[str]) -> list[Plugin]:
    """Import the --plugin modules (once each); ConfigError names the one that failed."""
    out = []
    for ref in map(reference, refs):
        if ref not in LOADED:
            plugin = (ref, "")
            _CURRENT.append(plugin)
            try:
                mod = _import(ref)
            except ConfigError:
                raise
            except Exception as e:  # noqa: BLE001 - the plugin's own error, in one line
                if os.environ.get("FEDNET_DEBUG"):
                    traceback.print_exc()
                raise ConfigError(f"--plugin {ref}: importing it failed: {type(e).__name__}: "
                                  f"{e} (FEDNET_DEBUG=1 prints the traceback)") from None
            finally:
                _CURRENT.pop()
            LOADED[ref] = (ref, _version(mod))
            mine = [key for key, who in PROVIDERS.items() if who == plugin]
            for key in mine:
                PROVIDERS[key] = LOADED[ref]
            try:
                _check_loaded(ref, mine)
            except ConfigError as e:
                _REFUSED[ref] = str(e)  # a second load in this process fails alike
                raise
        if ref in _REFUSED:
            raise ConfigError(_REFUSED[ref])
        out.append(LOADED[ref])
    return out


def _check_loaded(ref: str, registered: list[tuple[str, str]]) -> None:
    """A --plugin module must register something (`--plugin json` imports a module of the
    standard library and would be taken without a word), and what it registered must hold up."""
    if not registered:
        raise ConfigError(f"--plugin {ref}: it registered nothing (no algorithm, model, dataset, "
                          "objective, codec, defense or attack): is it the right module? (docs/extending.md)")
    for check in LOAD_CHECKS:
        check(ref, registered)


def named_in(path: Path) -> list[str]:
    """The plugins field of a TOML run file ([] when it has none or cannot be read: the file's
    own check reports that)."""
    try:
        with open(path, "rb") as fh:
            got = tomllib.load(fh).get("plugins", [])
    except (OSError, tomllib.TOMLDecodeError):
        return []
    return [str(x) for x in got] if isinstance(got, list) else []
