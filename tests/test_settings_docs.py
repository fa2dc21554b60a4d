"""docs/usage.md's option tables against the run settings' declarations (config/settings.py): every
declared option is documented with its declared default, and the docs name no option that does
not exist. A new setting, declared once, fails here until the docs describe it."""
from __future__ import annotations

import re
from pathlib import Path

from fednet.config import declarations

DOC = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
NOT_SETTINGS = {"--config", "--param", "--resume", "--overwrite"}  # options that set no setting


def _split(cell: str) -> list[str]:
    """A cell's comma-separated items, commas inside parentheses or backticks kept."""
    out, depth, tick, cur = [], 0, False, ""
    for ch in cell:
        if ch == "`":
            tick = not tick
        depth += (ch == "(") - (ch == ")") if not tick else 0
        if ch == "," and depth == 0 and not tick:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [c for c in out + [cur.strip()] if c]


def _rows(heading: str) -> list[list[str]]:
    text = DOC.read_text().split(heading + "\n", 1)[1].split("\n#", 1)[0]  # to the next heading
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.replace("\\|", "\u2502").splitlines() if line.startswith("| ")]
    return rows[1:]  # without the header


def _names(cell: str) -> list[str]:
    """The options (or TOML keys) a row's first cell names, in order."""
    return list(dict.fromkeys(m.split()[0] for m in re.findall(r"`([^`]+)`", cell)))


def _same(doc: str, declared: str) -> bool:
    """The docs' default is the declared one (the docs may explain it after it: '0 (all; ...)')."""
    doc = doc.replace("`", "")
    if doc == declared or doc.startswith(declared + " "):
        return True
    try:
        return float(doc.split(" (")[0]) == float(declared)
    except ValueError:
        return False


def _table(heading: str) -> dict[str, str]:
    """name -> the default the docs give it."""
    out: dict[str, str] = {}
    for cells in _rows(heading):
        names = _names(cells[0])
        defaults = _split(cells[-1]) if cells[-1] else []
        assert len(defaults) in (0, len(names)) or len(names) == 1, (
            f"docs/usage.md: the row of {', '.join(names)} gives {len(defaults)} defaults; give "
            "one per option, in order")
        for i, n in enumerate(names):
            out[n] = defaults[i] if len(defaults) == len(names) else cells[-1]
    return out


def _declared(with_option: bool) -> dict[str, str]:
    """option (or key) -> its declared default (an option of several settings: the first's)."""
    out: dict[str, str] = {}
    for i in declarations():
        if bool(i.option) == with_option:
            out.setdefault(i.names()[0] if with_option else i.key, i.default_text())
    return out


def test_every_option_is_documented_with_its_default():
    doc, declared = _table("## Options"), _declared(True)
    missing = sorted(set(declared) - set(doc))
    assert not missing, f"options declared but not in docs/usage.md's table: {missing}"
    unknown = sorted(set(doc) - set(declared) - NOT_SETTINGS)
    assert not unknown, f"docs/usage.md's table names options that do not exist: {unknown}"
    wrong = {o: (doc[o], d) for o, d in declared.items() if not _same(doc[o], d)}
    assert not wrong, f"docs/usage.md gives other defaults than the declarations (doc, declared): {wrong}"


def test_every_file_only_setting_is_documented_with_its_default():
    doc, declared = _table("### Settings only a file sets"), _declared(False)
    assert sorted(doc) == sorted(declared), (
        f"docs/usage.md's file-only settings {sorted(doc)} differ from the declared ones "
        f"{sorted(declared)}")
    wrong = {k: (doc[k], d) for k, d in declared.items() if not _same(doc[k], d)}
    assert not wrong, f"docs/usage.md gives other defaults than the declarations: {wrong}"


def test_the_table_reader_reads_a_row():
    assert _split("5, 8 (a, b), `x, y`, 1") == ["5", "8 (a, b)", "`x, y`", "1"]
    assert _names("`--epochs`, `--lr LR`, `--epochs`") == ["--epochs", "--lr"]
    assert _same("4e-4", "0.0004") and not _same("0.5", "0.4") and _same("lan", "lan")
