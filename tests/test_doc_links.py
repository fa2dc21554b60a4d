"""Every relative link of README.md, BENCHMARKS.md and docs/ resolves: the file exists and, for
a Markdown file, the #anchor is one of its headings (GitHub's rule: lower case, punctuation
dropped, spaces to hyphens, repeats numbered) or an explicit <a id>."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"```.*?```", re.S)


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes of a Markdown text's headings (and its explicit ids)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for m in re.finditer(r"^#{1,6}\s+(.*)$", _FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    return out


def broken(md: Path) -> list[str]:
    """The relative links of md that do not resolve, each with why."""
    bad = []
    for link in re.findall(r"\]\(([^)\s]+)\)", _FENCE.sub("", md.read_text())):
        if re.match(r"^[a-z]+:", link):  # https:, mailto:
            continue
        path, _, frag = link.partition("#")
        target = (md.parent / path).resolve() if path else md
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif frag and target.suffix == ".md" and frag not in anchors(target.read_text()):
            bad.append(f"{link}: no heading makes #{frag}")
    return bad


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(md):
    assert broken(md) == []


def test_the_check_finds_a_broken_anchor_and_a_missing_file(tmp_path):
    (tmp_path / "a.md").write_text("## 12. Secure aggregation (`--secagg`, fednet/secagg)\n"
                                   "[ok](#12-secure-aggregation---secagg-fednetsecagg) "
                                   "[old](#secure-aggregation) [gone](nowhere.md)\n")
    assert broken(tmp_path / "a.md") == ["#secure-aggregation: no heading makes "
                                         "#secure-aggregation", "nowhere.md: no such file"]
