"""Import rules of docs/architecture.md ("Layers and import rules"), checked by parsing every
module's imports (function bodies and TYPE_CHECKING blocks included)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "fednet"

# The command line: may import every layer below it; no layer below imports it.
APP = {"__main__", "api", "cli", "sweep"}

# Every other layer (a package, or a module at the top of fednet/) and the fednet modules it may
# import (the whole layer). The table of docs/architecture.md says the same; a new layer must be
# added to both.
BASE = {"errors", "rng", "types", "opcount"}  # opcount: work counted in operations (a leaf)
MAY_IMPORT: dict[str, set[str]] = {
    "fednet": set(),  # fednet/__init__.py: the version only
    "errors": set(), "rng": set(), "types": set(), "log": set(), "opcount": set(),
    "platform": {"errors"},  # a leaf: processes, signals, limits, memory, GPUs, huge pages
    "protocol": {"errors"},  # the wire format knows nothing of fednet's other layers
    "plugins": BASE,  # a leaf: entry points and --plugin modules, who provided what
    "config": BASE | {"compress", "privacy"},
    "compress": BASE,  # a leaf: how results travel (numpy only)
    "secagg": BASE,  # a leaf: secure aggregation's primitives and protocol (numpy, cryptography)
    "privacy": BASE,  # a leaf: the accountant (dp-accounting) and the mechanisms' arithmetic
    "models": BASE | {"plugins", "data"},  # a dataset's default model
    "data": BASE | {"plugins"},
    "training": BASE | {"plugins", "config", "models", "data", "privacy"},
    "algorithms": BASE | {"plugins", "config", "compress", "models", "data", "training", "secagg",
                          "privacy"},  # compress: the codecs' facts (what sums in SecAgg's field)
    "network": BASE | {"config"},  # the clock: profiles, server link, availability, deadlines
    "metrics": BASE | {"config"},
    "transport": BASE | {"log", "config", "metrics", "protocol", "platform"},  # config: the
    # liveness timers (config/liveness.py)
    # the runtime-agnostic run: session, round driver, executor, in-process runtime, messages
    "core": BASE | {"config", "compress", "models", "data", "training", "algorithms", "network",
                    "metrics", "protocol", "platform", "plugins", "privacy"},
    "client": BASE | {"log", "config", "compress", "models", "data", "training", "algorithms",
                      "network", "metrics", "protocol", "transport", "platform", "plugins", "core"},
    "server": BASE | {"log", "config", "algorithms", "data", "network", "metrics", "protocol",
                      "transport", "platform", "core", "launch", "plugins"},
    "launch": BASE | {"log", "platform", "config", "plugins"},  # and lazily: see LAZY
}
# Imports allowed only inside functions (never at module level).
LAZY: dict[str, set[str]] = {
    # the zygote preloads the client runtime before it forks; `fednet clients` checks keys and
    # reads the join key
    "launch": {"client", "core", "transport", "data", "models", "training", "protocol"},
}
# No exceptions: an import the table does not allow is a layering change, made in the table
# (and in docs/architecture.md) or not at all.

THIRD_PARTY_ONLY_IN = {
    "zmq": {"transport", "server", "client"},  # the sockets
    "msgpack": {"protocol"},  # the codec
}
NO_TORCH_AT_MODULE_LEVEL = {"protocol", "transport", "platform", "launch", "config", "network",
                            "plugins", "cli", "sweep", "core/wire.py", "privacy"}


def _layer_of_file(f: Path) -> str:
    parts = f.relative_to(PKG).parts
    if parts == ("__init__.py",):
        return "fednet"
    return parts[0] if len(parts) > 1 else parts[0][:-3]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, at module level) of every import in the file, those in `if
    TYPE_CHECKING:` blocks included."""
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
            if target.split(".")[0] == layer:
                continue
            if _allows(MAY_IMPORT[layer], target):
                continue
            if not top and _allows(LAZY.get(layer, set()), target):
                continue
            bad.append(f"{rel}: {mod}{'' if top else ' (in a function)'}")
    assert not bad, f"{layer} breaks its import rules:\n" + "\n".join(bad)


@pytest.mark.parametrize("lib", sorted(THIRD_PARTY_ONLY_IN))
def test_third_party_wire_libraries_stay_in_their_layers(lib):
    bad = [str(f.relative_to(PKG)) for f in _files()
           if _layer_of_file(f) not in THIRD_PARTY_ONLY_IN[lib]
           and any(m == lib or m.startswith(lib + ".") for m, _ in _imports(f))]
    assert not bad, f"{lib} imported outside {sorted(THIRD_PARTY_ONLY_IN[lib])}: {bad}"


def test_no_torch_at_module_level_where_the_cli_and_the_launcher_start():
    bad = [str(f.relative_to(PKG)) for f in _files()
           if (_layer_of_file(f) in NO_TORCH_AT_MODULE_LEVEL
               or str(f.relative_to(PKG)) in NO_TORCH_AT_MODULE_LEVEL)
           and any(top and (m == "torch" or m.startswith("torch.")) for m, top in _imports(f))]
    assert not bad, f"torch imported at module level: {bad}"


def test_no_pickle_like_serialisation_anywhere():
    needles = ("import pickle", "torch.save", "torch.load", "send_pyobj", "recv_pyobj",
               "allow_pickle=True", "cPickle", "dill")
    for f in _files():
        text = f.read_text()
        assert not [n for n in needles if n in text], f.relative_to(PKG)


MAX_FUNCTION_LINES = 60
# Import cycles left (a frozenset of modules each), `if TYPE_CHECKING:` imports counted. A new
# one must be broken, or listed here with its reason.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def test_functions_stay_short():
    long = []
    for f in _files():
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = n.end_lineno - n.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{f.relative_to(PKG)}:{n.lineno} {n.name} ({lines} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _module_name(f: Path) -> str:
    parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(dotted: str) -> str:
    """The module a dotted import names (an attribute's module for `from X import name`)."""
    parts = dotted.split(".")
    while parts and not _is_module(".".join(parts)):
        parts.pop()
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the fednet modules it imports (at module level, in a function, or in an `if
    TYPE_CHECKING:` block: never executed, but the two modules still know each other), without
    its own packages (which Python has imported before it)."""
    graph: dict[str, set[str]] = {}
    for f in _files():
        src = _module_name(f)
        mods = _imports(f)
        graph[src] = {t for m, _ in mods if m.startswith("fednet")
                      and (t := _resolve(m)) and t != src and not src.startswith(t + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_no_import_cycles():
    found = _cycles(_import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles (module level, in functions or TYPE_CHECKING blocks): {new}; " \
                    "break them, or list them in KNOWN_CYCLES with their reason"
    assert not set(KNOWN_CYCLES) - set(found), "KNOWN_CYCLES lists cycles that are gone"


def test_the_cycle_finder_finds_cycles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(g) == [frozenset("abc")]


def test_the_import_graph_counts_type_checking_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "fednet"
    (pkg / "a").mkdir(parents=True)
    files = {"__init__.py": "", "a/__init__.py": "", "a/y.py": "from fednet.a.x import X\n",
             "a/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from fednet.a.y import Y\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    monkeypatch.setitem(globals(), "PKG", pkg)
    assert _cycles(_import_graph()) == [frozenset({"fednet.a.x", "fednet.a.y"})]


def test_the_client_package_has_no_cycle():
    """Issue 57: client/app, host, enroll and link imported each other (through TYPE_CHECKING
    imports); a Client returns events its Host acts on, and knows no Host."""
    found = [sorted(c) for c in _cycles(_import_graph()) if any(m.startswith("fednet.client")
                                                               for m in c)]
    assert not found, found


def _doc_table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/architecture.md's import table: layer -> (may import, only inside functions)."""
    import re

    text = (PKG.parent / "docs" / "architecture.md").read_text()
    rows = {}
    for line in text.split("### Import rules", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 2 or cells[0] in ("layer", "---"):
            continue
        rule = re.sub(r"\([^)]*\)", "", cells[1])  # remarks in brackets name no layer
        top, _, lazy = rule.partition("inside functions only:")
        names = lambda t: set(re.findall(r"`([\w./]+)`", t))  # noqa: E731
        allowed = names(top) | (BASE if "base" in top else set())
        head = re.sub(r"\([^)]*\)", "", cells[0])
        for layer in names(head):
            rows[layer.strip("/").removesuffix(".py")] = (allowed, names(lazy))

    return rows


def test_the_docs_table_says_what_the_test_checks():
    doc = _doc_table()
    want = {k: (v, LAZY.get(k, set())) for k, v in MAY_IMPORT.items() if k != "fednet"}
    assert {k: doc.get(k) for k in want} == want
    assert {k for k in doc if k not in want} == APP, "the command line row names the APP layers"


def _package_of(module: str) -> str:
    """The layer a fednet module belongs to (its package under fednet/, or a top module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fednet"


def test_no_cycles_between_packages():
    """The layers form a DAG: no package reaches itself through others' imports, lazy imports
    (in functions) and TYPE_CHECKING ones counted; the command line (cli, sweep, api)
    included."""
    graph: dict[str, set[str]] = {}
    for src, targets in _import_graph().items():
        a = _package_of(src)
        graph.setdefault(a, set()).update(b for t in targets if (b := _package_of(t)) != a)
    assert _cycles(graph) == [], f"package cycles: {[sorted(c) for c in _cycles(graph)]}"
