"""Import rules of docs/architecture.md ("Layers and import rules"), checked by parsing every
module's imports (function bodies and TYPE_CHECKING blocks included)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "fednet"

# The command line: may import every layer below it; no layer below imports it.
APP = {"__main__", "api", "cli", "options", "options_extra", "plugins_cli", "sweep", "sweep_cli",
       "sweep_grid"}

# Every other layer (a package, or a module at the top of fednet/) and the fednet modules it may
# import (the whole layer). The table of docs/architecture.md says the same; a new layer must be
# added to both.
BASE = {"errors", "rng", "types"}
MAY_IMPORT: dict[str, set[str]] = {
    "fednet": set(),  # fednet/__init__.py: the version only
    "errors": set(), "rng": set(), "types": set(), "log": set(),
    "platform": {"errors"},  # a leaf: processes, signals, limits, memory, GPUs, huge pages
    "protocol": {"errors"},  # the wire format knows nothing of fednet's other layers
    "plugins": BASE,  # and lazily: see LAZY
    "plugin_check": BASE | {"plugins"},  # and lazily: see LAZY
    "config": BASE | {"compress"},
    "compress": BASE,  # a leaf: how results travel (numpy only)
    "models": BASE | {"plugins", "data"},  # a dataset's default model
    "data": BASE | {"plugins"},
    "training": BASE | {"plugins", "config", "models", "data"},
    "algorithms": BASE | {"plugins", "config", "models", "data", "training"},
    "latency": BASE | {"config"},
    "network": BASE | {"config", "latency"},  # server link, availability, deadlines
    "metrics": BASE | {"config"},
    "wire": BASE | {"metrics", "protocol"},
    "transport": BASE | {"log", "metrics", "protocol", "platform"},
    "core": BASE | {"config", "compress", "models", "data", "training", "algorithms", "latency", "network",
                    "metrics", "wire", "protocol", "platform"},
    "client": BASE | {"log", "config", "compress", "models", "data", "training", "algorithms", "latency", "network",
                      "metrics", "wire", "protocol", "transport", "platform", "plugins",
                      "plugin_check"},
    "inproc": BASE | {"config", "compress", "models", "data", "training", "algorithms", "latency", "network",
                      "metrics",
                      "wire", "protocol", "platform", "core", "client"},
    "server": BASE | {"log", "config", "data", "latency", "network", "metrics", "wire", "protocol",
                      "transport", "platform", "core", "launch", "plugins", "plugin_check"},
    "launch": BASE | {"log", "platform", "config", "plugins"},  # and lazily: see LAZY
}
# Imports allowed only inside functions (never at module level).
LAZY: dict[str, set[str]] = {
    # the zygote preloads the client runtime before it forks; `fednet clients` checks keys and
    # reads the join key
    "launch": {"client", "transport", "data", "models", "training", "plugin_check", "protocol"},
    # loading a plugin registers its algorithm; a config file names the run's plugins
    "plugins": {"algorithms", "config"},
    # a client host checks that it has what WELCOME names
    "plugin_check": {"algorithms", "data", "models"},
}
# Single imports outside the table, each with its reason: (importing file, imported module).
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("fednet/config.py", "fednet.algorithms.registry"):
        "algorithm names, defaults and typed parameters come from the registry (torch-free)",
    ("fednet/config.py", "fednet.algorithms.params"):
        "a run setting is type-checked as an algorithm parameter is (params.setting; torch-free)",
    ("fednet/client/executor.py", "fednet.core.state_files"):
        "a client writes its own state files; core/checkpoint.py finds them for --resume, so "
        "their format lives in core (which imports no client)",
    ("fednet/metrics/report.py", "fednet.algorithms"):
        "a report names an old run's default model (algorithms.model_name, in a function)",
}

THIRD_PARTY_ONLY_IN = {
    "zmq": {"transport", "server", "client"},  # the sockets
    "msgpack": {"protocol"},  # the codec
}
NO_TORCH_AT_MODULE_LEVEL = {"protocol", "transport", "platform", "launch", "config", "latency", "network",
                            "wire", "plugins", "plugin_check", "options", "options_extra",
                            "plugins_cli", "cli", "sweep", "sweep_cli", "sweep_grid"}


def _layer_of_file(f: Path) -> str:
    parts = f.relative_to(PKG).parts
    if parts == ("__init__.py",):
        return "fednet"
    return parts[0] if len(parts) > 1 else parts[0][:-3]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, at module level) of every import in the file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for n in tree.body:  # `if TYPE_CHECKING:` / try blocks at module level are module level too
        if isinstance(n, (ast.If, ast.Try)):
            top.update(id(m) for m in ast.walk(n))
    here = list(path.relative_to(PKG.parent).with_suffix("").parts)
    out: list[tuple[str, bool]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(a.name, id(n) in top) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:  # relative: resolved against this module's package
                base = here[:-n.level] if here[-1] != "__init__" else here[:len(here) - n.level]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            sub = [a.name for a in n.names if _is_module(f"{mod}.{a.name}")]
            if len(sub) < len(n.names) or not sub:  # names from the module itself
                out.append((mod, id(n) in top))
            out += [(f"{mod}.{name}", id(n) in top) for name in sub]  # from X import submodule
    return out


def _is_module(dotted: str) -> bool:
    p = PKG.parent.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _allows(allowed: set[str], target: str) -> bool:
    """target: a fednet module without the 'fednet.' prefix."""
    return any(target == a or target.startswith(a + ".") for a in allowed)


def _files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_layer_is_in_the_table():
    layers = {_layer_of_file(f) for f in _files()}
    missing = layers - APP - set(MAY_IMPORT)
    assert not missing, (f"layers without import rules: {sorted(missing)}; add them to MAY_IMPORT "
                         "here and to the table in docs/architecture.md")


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_layer_imports_only_what_the_table_allows(layer):
    bad = []
    for f in _files():
        if _layer_of_file(f) != layer:
            continue
        rel = str(f.relative_to(PKG))
        for mod, top in _imports(f):
            if not mod.startswith("fednet."):
                continue
            target = mod[len("fednet."):]
            if target.split(".")[0] == layer or (f"fednet/{rel}", mod) in EXCEPTIONS:
                continue
            if _allows(MAY_IMPORT[layer], target):
                continue
            if not top and _allows(LAZY.get(layer, set()), target):
                continue
            bad.append(f"{rel}: {mod}{'' if top else ' (in a function)'}")
    assert not bad, f"{layer} breaks its import rules:\n" + "\n".join(bad)


def test_exceptions_are_still_needed():
    used = set()
    for f in _files():
        for mod, _top in _imports(f):
            used.add((f"fednet/{f.relative_to(PKG)}", mod))
    assert not set(EXCEPTIONS) - used, f"stale exceptions: {sorted(set(EXCEPTIONS) - used)}"


@pytest.mark.parametrize("lib", sorted(THIRD_PARTY_ONLY_IN))
def test_third_party_wire_libraries_stay_in_their_layers(lib):
    bad = [str(f.relative_to(PKG)) for f in _files()
           if _layer_of_file(f) not in THIRD_PARTY_ONLY_IN[lib]
           and any(m == lib or m.startswith(lib + ".") for m, _ in _imports(f))]
    assert not bad, f"{lib} imported outside {sorted(THIRD_PARTY_ONLY_IN[lib])}: {bad}"


def test_no_torch_at_module_level_where_the_cli_and_the_launcher_start():
    bad = [str(f.relative_to(PKG)) for f in _files()
           if _layer_of_file(f) in NO_TORCH_AT_MODULE_LEVEL
           and any(top and (m == "torch" or m.startswith("torch.")) for m, top in _imports(f))]
    assert not bad, f"torch imported at module level: {bad}"


def test_no_pickle_like_serialisation_anywhere():
    needles = ("import pickle", "torch.save", "torch.load", "send_pyobj", "recv_pyobj",
               "allow_pickle=True", "cPickle", "dill")
    for f in _files():
        text = f.read_text()
        assert not [n for n in needles if n in text], f.relative_to(PKG)


def test_modules_stay_small():
    big = {str(f.relative_to(PKG)): n for f in _files()
           if (n := len(f.read_text().splitlines())) > 300}
    assert not big, f"modules over 300 lines: {big}"
