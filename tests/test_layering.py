"""Import rules of docs/architecture.md, checked by parsing every module's imports."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "fednet"
WIRE = ("zmq", "msgpack", "fednet.protocol", "fednet.transport", "fednet.server", "fednet.client",
        "fednet.launch")


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
    return out


def _modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


@pytest.mark.parametrize("sub", ["algorithms", "models", "data", "training"])
def test_pure_packages_never_import_the_wire(sub):
    for f in _modules(sub):
        bad = {m for m in _imports(f, False) if m.startswith(WIRE)}
        assert not bad, f"{f.relative_to(PKG)} imports {sorted(bad)}"


def test_only_protocol_imports_msgpack():
    for f in PKG.rglob("*.py"):
        if "msgpack" in _imports(f, False):
            assert f.parent.name == "protocol", f"{f.relative_to(PKG)} imports msgpack"


@pytest.mark.parametrize("sub", ["protocol", "launch"])
def test_protocol_and_launch_do_not_import_torch_at_module_level(sub):
    for f in _modules(sub):
        bad = {m for m in _imports(f, True) if m == "torch" or m.startswith("torch.")}
        assert not bad, f"{f.relative_to(PKG)} imports torch at module level"


def test_no_pickle_like_serialisation_anywhere():
    needles = ("import pickle", "torch.save", "torch.load", "send_pyobj", "recv_pyobj",
               "allow_pickle=True", "cPickle", "dill")
    for f in PKG.rglob("*.py"):
        text = f.read_text()
        assert not [n for n in needles if n in text], f.relative_to(PKG)


def test_modules_stay_small():
    big = {str(f.relative_to(PKG)): n for f in PKG.rglob("*.py")
           if (n := len(f.read_text().splitlines())) > 300}
    assert not big, f"modules over 300 lines: {big}"
