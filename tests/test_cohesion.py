"""Cohesion measured by who touches whom (issue 57 item 5), in place of line caps on modules,
benchmark scripts and docs/architecture.md: parsed from every class of fednet/ and benchmarks/.

- No class (nor function) reaches a private member (`x._name`) of another object: only `self._name` and
  `cls._name`, a module's own names (`os._exit`), and the third-party internals listed in
  FOREIGN_PRIVATE with their reasons.
- No class reads or writes more than MAX_TOUCHED data attributes of one collaborator
  (`self.<collaborator>.<attribute>`, not counting method calls): a class that needs more of
  another object's fields either belongs with it or should be given what it needs. Records,
  whose fields are their interface (a run's settings, an algorithm's parameters and state, a
  context), are listed in RECORDS with why.

The check reads `self.<collaborator>.<attribute>` only (an alias of the collaborator is not
followed): it catches the common shape of feature envy, not every one."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "fednet"
BENCH = ROOT / "benchmarks"

MAX_TOUCHED = 5
RECORDS: dict[str, str] = {
    "cfg": "a run's settings (config/settings.RunConfig and its sections): plain fields",
    "p": "an algorithm's parameters (a dataclass of its --param values)",
    "state": "an algorithm's State (algorithms/state.py): the record it checkpoints",
    "info": "what the server tells a Strategy at setup (contract.ServerInfo): a record",
    "ctx": "a client's or a round's context (ClientContext, RoundContext): records",
    "spec": "a codec's or an algorithm's declared facts (CodecSpec, Spec): records",
}
FOREIGN_PRIVATE: dict[str, str] = {
    "models/param_kinds.py:_parameters": "torch.nn.Module's own parameter table, read to tag "
                                         "each parameter once",
    "models/param_kinds.py:_fednet_kind": "fednet's tag set on torch Parameters (their kind)",
    "../benchmarks/pfl_peer.py:_model": "pfl-research's PyTorchModel keeps its torch module "
                                        "there (the peer's test accuracy, as pfl has no getter)",
    "training/batched.py:_BatchNorm": "torch's base class of the batch-norm layers, to refuse "
                                      "them (no public name covers all three)",
    "training/flops.py:_parameters": "torch.nn.Module's own tables, read as its named_* methods "
                                     "read them (structure_key, a model's key every task)",
    "training/flops.py:_buffers": "(the same)",
    "training/flops.py:_modules": "(the same)",
    "models/arrays.py:_parameters": "torch.nn.Module's own tables, read as its state_dict reads "
                                    "them (state_tensors, a model's state several times a task)",
    "models/arrays.py:_buffers": "(the same)",
    "models/arrays.py:_modules": "(the same)",
    "models/arrays.py:_non_persistent_buffers_set": "(the same)",
    "models/arrays.py:_state_dict_pre_hooks": "(the same: a hooked module is read by state_dict)",
    "models/arrays.py:_state_dict_hooks": "(the same)",
}


def _files() -> list[Path]:
    """fednet/ and the benchmark scripts (named from fednet/, benchmarks/ as ../benchmarks)."""
    return sorted(PKG.rglob("*.py")) + (sorted(BENCH.rglob("*.py")) if BENCH.is_dir() else [])


def _rel(f: Path) -> str:
    return str(f.relative_to(PKG)) if f.is_relative_to(PKG) else "../" + str(f.relative_to(ROOT))


def _module_names(tree: ast.Module) -> set[str]:
    """Names a module binds by importing (a module's members are not another object's)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return out


def _is_own(v: ast.expr, modules: set[str]) -> bool:
    if isinstance(v, ast.Name):
        return v.id in ("self", "cls") or v.id in modules
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
        return True
    return isinstance(v, ast.Attribute) and _is_own(v.value, modules) and not \
        (isinstance(v.value, ast.Name) and v.value.id in ("self", "cls"))


def private_reaches() -> list[str]:
    bad = []
    for f in _files():
        tree, rel = ast.parse(f.read_text()), _rel(f)
        modules = _module_names(tree)
        for n in ast.walk(tree):
            if (isinstance(n, ast.Attribute) and n.attr.startswith("_")
                    and not n.attr.startswith("__") and not _is_own(n.value, modules)
                    and f"{rel}:{n.attr}" not in FOREIGN_PRIVATE):
                bad.append(f"{rel}:{n.lineno} {ast.unparse(n)}")
    return bad


def touched() -> dict[tuple[str, str, str], set[str]]:
    """(module, class, collaborator) -> the data attributes the class reads or writes of
    self.<collaborator> (method calls not counted)."""
    out: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for f in _files():
        tree, rel = ast.parse(f.read_text()), _rel(f)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            calls = {id(n.func) for n in ast.walk(cls) if isinstance(n, ast.Call)}
            for n in ast.walk(cls):
                if (isinstance(n, ast.Attribute) and id(n) not in calls
                        and isinstance(n.value, ast.Attribute)
                        and isinstance(n.value.value, ast.Name) and n.value.value.id == "self"):
                    out[(rel, cls.name, n.value.attr)].add(n.attr)
    return out


def test_no_class_reaches_a_private_member_of_another_object():
    bad = private_reaches()
    assert not bad, ("private members reached from outside their object (make them public, "
                     "or ask the object):\n" + "\n".join(bad))


def test_no_class_touches_more_than_a_few_fields_of_another():
    bad = [f"{m} {c} touches {len(a)} fields of self.{who}: {', '.join(sorted(a))}"
           for (m, c, who), a in sorted(touched().items())
           if len(a) > MAX_TOUCHED and who not in RECORDS]
    assert not bad, (f"classes touching more than {MAX_TOUCHED} data attributes of one "
                     "collaborator (move the work to it, or pass what is needed):\n"
                     + "\n".join(bad))


def test_the_checks_see_what_they_check(tmp_path, monkeypatch):
    """A class reaching a private member, and one reading six fields of another, both fail."""
    bad = tmp_path / "fednet"
    bad.mkdir()
    (bad / "m.py").write_text(
        "class A:\n    def f(self, other):\n        return other._x + self.b.one + self.b.two"
        " + self.b.three + self.b.four + self.b.five + self.b.six\n")
    me = __import__(__name__, fromlist=["PKG"])
    monkeypatch.setattr(me, "PKG", bad)
    monkeypatch.setattr(me, "BENCH", tmp_path / "none")
    assert private_reaches() == ["m.py:3 other._x"]
    assert touched()[("m.py", "A", "b")] == {"one", "two", "three", "four", "five", "six"}


def test_no_test_module_imports_another():
    """One harness: what tests share lives in tests/harness.py, conftest.py and the fixture
    modules (tests/integration/cluster.py, netns.py, ...), never in another test module."""
    bad = []
    for f in sorted((ROOT / "tests").rglob("test_*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and \
                    n.module.split(".")[-1].startswith("test_"):
                bad.append(f"{f.relative_to(ROOT)}:{n.lineno} from {n.module}")
    assert not bad, "test modules importing others (move what they share to tests/harness.py):\n" \
        + "\n".join(bad)
