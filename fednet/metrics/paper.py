"""Tables as the console prints them, and the same cells for a paper: LaTeX (booktabs) and
Markdown (`--latex FILE`, `--markdown FILE` of `fednet sweep` and `fednet report`).

A Table holds the formatted cells once (sweep_table.sweep_tables, report.compare_table), so the
three renderings state the same numbers and intervals. A cell ending in MARK, and a note
starting with it, is a footnote marker (a seed marked collapsed or diverged:
metrics/seed_health.py): `*` on the console and in Markdown, a superscript in LaTeX."""
from __future__ import annotations

from dataclasses import dataclass, field

from fednet.metrics.progress import table

MARK = "*"
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
          "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}", "<": r"\textless{}", ">": r"\textgreater{}"}


@dataclass
class Table:
    """title: the line above it; notes: the lines under it (footnotes, what a column means);
    right: the columns aligned right in LaTeX and Markdown (numbers)."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    right: set[int] = field(default_factory=set)

    def text(self) -> list[str]:
        """The console's lines: title, the aligned table, the notes."""
        return [self.title, table(self.headers, self.rows), *self.notes]


@dataclass
class Part:
    """Tables that belong together (a sweep's, the runs side by side): head lines above them
    (what the metric is), tail lines under them (the notes)."""

    head: list[str]
    tables: list[Table]
    tail: list[str] = field(default_factory=list)


def latex_escape(text: str) -> str:
    """Text safe in LaTeX's text mode (also <, > and ^, which print other glyphs there)."""
    return "".join(_LATEX.get(ch, ch) for ch in text)


def _latex_cell(text: str) -> str:
    if text.endswith(MARK) and len(text) > 1:
        return latex_escape(text[:-1]) + "$^{" + MARK + "}$"
    return latex_escape(text)


def _latex_note(text: str) -> str:
    if text.startswith(MARK + " "):
        return "$^{" + MARK + "}$" + latex_escape(text[1:])
    return latex_escape(text)


def latex(parts: list[Part]) -> str:
    """Each table as a booktabs tabular (\\toprule, \\midrule, \\bottomrule; needs
    \\usepackage{booktabs}), its title and its part's head lines and notes as comments, its notes
    in small type under it."""
    out = ["% needs \\usepackage{booktabs}"]
    for part in parts:
        out += [""] + [f"% {line}" for line in part.head] if part.head else []
        for t in part.tables:
            cols = "".join("r" if i in t.right else "l" for i in range(len(t.headers)))
            out += ["", f"% {t.title}", f"\\begin{{tabular}}{{{cols}}}",
                    "\\toprule", " & ".join(latex_escape(h) for h in t.headers) + " \\\\",
                    "\\midrule"]
            out += [" & ".join(_latex_cell(c) for c in row) + " \\\\" for row in t.rows]
            out += ["\\bottomrule", "\\end{tabular}"]
            if t.notes:
                out += ["\\par\\smallskip", "{\\footnotesize"]
                out += [_latex_note(n) + "\\par" for n in t.notes]
                out.append("}")
        out += [f"% note: {line}" for line in part.tail]
    return "\n".join(out) + "\n"


def md_escape(text: str) -> str:
    """Text safe in a Markdown table cell: | and * escaped (no column break, no emphasis)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


def markdown(parts: list[Part]) -> str:
    """Each table as a pipe table (numbers right-aligned) under its title, its notes as a list
    under it; each part's head lines before its tables, its tail lines (a list) after."""
    out: list[str] = []
    for part in parts:
        for line in part.head:
            out += [md_escape(line), ""]
        for t in part.tables:
            out += [md_escape(t.title), "",
                    "| " + " | ".join(md_escape(h) for h in t.headers) + " |",
                    "|" + "|".join("---:" if i in t.right else "---"
                                   for i in range(len(t.headers))) + "|"]
            out += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in t.rows]
            out += [""] + ([f"- {md_escape(n)}" for n in t.notes] + [""] if t.notes else [])
        if part.tail:
            out += [f"- {md_escape(n)}" for n in part.tail] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def write(parts: list[Part], latex_file: str | None, markdown_file: str | None) -> list[str]:
    """--latex FILE, --markdown FILE: the files written (each replaced atomically)."""
    from pathlib import Path

    from fednet.metrics.files import write_text

    done = []
    for f, make in ((latex_file, latex), (markdown_file, markdown)):
        if f:
            write_text(Path(f), make(parts))
            done.append(f)
    return done
