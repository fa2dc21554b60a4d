"""docs/architecture.md is a map of the code (issue 37 item 4), as long as it needs to be; its
"Layers" block names every module of fednet/ (or its sub-package), and nothing that is not there;
and every module and name it cites exists in the tree. A citation is a path with a folder
(`core/rounds.py`, `docs/usage.md`), a module's name (`core/rounds.RoundDriver`,
`cli/options.build_config`, `core/rounds.RoundDriver.round`) or a class's attribute
(`Strategy.absorb`, `Executor.on_task`); paths are read from fednet/ or the repository's root."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "fednet"
DOC = ROOT / "docs" / "architecture.md"

PATH_NAME = re.compile(r"(?<![\w/.-])((?:[a-z_]+/)+[a-z_]+)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)")
CLASS_ATTR = re.compile(r"(?<![\w/.])([A-Z][A-Za-z0-9]+)\.([a-z_]\w*)\b")


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _top_names(path: Path) -> dict[str, ast.AST]:
    """Names a module defines at its top: functions, classes, assignments, imports."""
    out: dict[str, ast.AST] = {}
    for n in _tree(path).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[n.name] = n
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if isinstance(t, ast.Name):
                    out[t.id] = n
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                out[(a.asname or a.name).split(".")[0]] = n
    return out


def _members(cls: ast.ClassDef) -> set[str]:
    got = set()
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            got.add(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            got.add(n.target.id)
        elif isinstance(n, ast.Assign):
            got |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return got


@functools.cache
def _classes() -> dict[str, list[ast.ClassDef]]:
    """Every class defined in fednet/, by name."""
    out: dict[str, list[ast.ClassDef]] = {}
    for f in PKG.rglob("*.py"):
        for n in ast.walk(_tree(f)):
            if isinstance(n, ast.ClassDef):
                out.setdefault(n.name, []).append(n)
    return out


def _has_member(name: str, attr: str) -> bool:
    """Class `name` (or, for an inherited attribute, one of its bases in fednet/) has attr."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        for cls in _classes().get(c, []):
            if attr in _members(cls):
                return True
            todo += [ast.unparse(b).split(".")[-1] for b in cls.bases]
    return False


def _problem(prefix: str, rest: str) -> str | None:
    """Why `prefix.rest` (a path with its suffix, or a module and a name in it) is not in the tree."""
    for base in (PKG, ROOT):
        if (base / f"{prefix}.{rest}").exists():
            return None  # a file: core/rounds.py, docs/usage.md
    module = next((b / f"{prefix}.py" for b in (PKG, ROOT) if (b / f"{prefix}.py").exists()), None)
    if module is None:
        package = next((b / prefix / "__init__.py" for b in (PKG, ROOT)
                        if (b / prefix / "__init__.py").exists()), None)
        if package is None:
            return f"{prefix}.{rest}: no such file or module"
        module = package
    name, _, attr = rest.partition(".")
    node = _top_names(module).get(name)
    if node is None:
        return f"{prefix}.{rest}: {module.relative_to(ROOT)} defines no {name}"
    if attr and not (isinstance(node, ast.ClassDef) and _has_member(name, attr)):
        return f"{prefix}.{rest}: {name} has no {attr}"
    return None


def _citations(text: str) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    paths = {(m.group(1), m.group(2)) for m in PATH_NAME.finditer(text)}
    attrs = {(m.group(1), m.group(2)) for m in CLASS_ATTR.finditer(text)}
    return paths, attrs


def test_every_module_and_name_the_map_cites_exists():
    paths, attrs = _citations(DOC.read_text())
    assert len(paths) > 50 and len(attrs) > 10  # the patterns still find the citations
    bad = [p for prefix, rest in sorted(paths) if (p := _problem(prefix, rest))]
    bad += [f"{c}.{a}: no class {c} with {a} in fednet/" for c, a in sorted(attrs)
            if not _has_member(c, a)]
    assert not bad, "docs/architecture.md cites what is not in the tree:\n" + "\n".join(bad)


def test_the_checks_catch_a_wrong_citation():
    assert _problem("core/rounds", "RoundDriver.round") is None
    assert _problem("core/rounds", "py") is None and _problem("docs/usage", "md") is None
    assert _problem("core/rounds", "RoundDriver.no_such_method")
    assert _problem("core/no_such_module", "py") and _problem("core/rounds", "NoSuchName")
    assert _has_member("StagedStrategy", "absorb")  # inherited from Strategy
    assert not _has_member("Strategy", "no_such_method")


def _layers_block() -> str:
    return DOC.read_text().split("## Layers", 1)[1].split("```", 2)[1]


def test_the_layers_name_every_module_and_only_modules():
    """A line that starts with a package (`core/`) names its modules as `x.py`; a line that starts
    with anything else (the command line, the leaves) names them from fednet/."""
    named, bad, pkg = set(), [], ""
    for line in _layers_block().splitlines():
        head = re.match(r"(\w+/)\s", line)
        if head and (PKG / head.group(1)).is_dir():
            pkg = head.group(1)
            line = line[head.end():]  # the package heads its modules; it names none itself
        elif re.match(r"\S", line):
            pkg = ""
        for tok in re.findall(r"(?<![\w/.])((?:[a-z_]+/)*[a-z_]+(?:\.py|/))(?!\w)", line):
            where = [PKG / pkg / tok, PKG / tok] if "/" not in tok.rstrip("/") else [PKG / tok]
            hit = next((c for c in where if c.exists()), None)
            if hit is None:
                bad.append(f"{pkg}{tok}")
            else:
                named.add(hit.resolve())
    assert not bad, f"the Layers block names what fednet/ does not hold: {bad}"
    missing = [str(p.relative_to(PKG)) for p in sorted(PKG.rglob("*.py"))
               if p.name != "__init__.py" and p.resolve() not in named
               and p.parent.resolve() not in named]
    assert not missing, f"modules the Layers block does not name (one line each): {missing}"
