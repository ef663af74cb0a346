"""Every table of a report, in Markdown, HTML and LaTeX, through one library path (tabulate).

A :class:`Table` holds a title, column headers, an alignment per column and rows of cells (plain
text; :class:`Cell` marks one bold). Its three renderings come from ``tabulate`` with one table
format per output, so a number is printed once (by the section that built the cell: ``±``, clipped
``mean [low, high]``, ``≥``, ⚑ and the other marks stay in the cell's text) and shown the same way
everywhere:

* :meth:`Table.markdown`: a GitHub/pipe table under ``### title``, cells unpadded (``|`` escaped),
  bold as ``**…**``; the report's ``report.md``.
* :meth:`Table.html`: a ``<table>`` (cells escaped, bold as ``<strong>``, left-aligned text
  columns marked); the report's ``report.html``.
* :meth:`Table.latex`: a booktabs ``tabular`` (``\\toprule`` / ``\\midrule`` / ``\\bottomrule``),
  cells escaped and the report's symbols written as LaTeX (:func:`latex_text`: ``±`` is
  ``$\\pm$``, ``→`` ``$\\rightarrow$``, ``Δ`` ``$\\Delta$``, …), bold as ``\\textbf``, long text
  columns wrapped (``p{}``); :func:`latex_document` puts every table of a report into one document
  that ``pdflatex`` compiles (``tables.tex``), each ``tabular`` ready to paste into a paper.

A section returns its lines as strings; a table among them is a :class:`TableText`: its Markdown
(a ``str``, so sections and their tests join lines as before) that also carries the table, from which
the report writes the HTML and LaTeX versions (:func:`tables_in`).
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from tabulate import DataRow, Line, TableFormat, tabulate


@dataclass(frozen=True)
class Cell:
    """One cell's text, printed as the section wrote it, and whether it is bold (a defined mark)."""

    text: str
    bold: bool = False


CellLike = Union[Cell, str, int, float]


def _cell(c: CellLike) -> Cell:
    if isinstance(c, Cell):
        return Cell(_one_line(c.text), c.bold)
    return Cell(_one_line("" if c is None else str(c)))


def _one_line(s: str) -> str:
    return " ".join(str(s).split("\n"))  # a newline would split the row in every format


class TableText(str):
    """A table's Markdown that carries the :class:`Table` itself (:func:`tables_in`)."""

    table: "Table"


class Table:
    """A titled table: ``columns`` (headers), ``rows`` (lists of :class:`Cell` or text), ``align`` a
    string of ``l`` / ``r`` per column (default: the first column left, the rest right)."""

    def __init__(self, columns: Sequence[str], rows: Iterable[Sequence[CellLike]], title: str = "",
                 align: Optional[str] = None):
        self.columns = [_one_line(c) for c in columns]
        self.rows = [[_cell(c) for c in row] for row in rows]
        self.title = title
        self.align = align or "l" + "r" * (len(self.columns) - 1)
        if len(self.align) != len(self.columns) or set(self.align) - {"l", "r"}:
            raise ValueError(f"align {self.align!r}: one of l / r per column ({len(self.columns)} columns)")
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {title!r}: a row of {len(row)} cells under {len(self.columns)} columns")

    # one tabulate call per output; cells arrive already rendered, tabulate lays out rows and rules
    def _tabulate(self, fmt: TableFormat, cell, header) -> str:
        return tabulate([[cell(c) for c in row] for row in self.rows], [header(h) for h in self.columns],
                        tablefmt=fmt, disable_numparse=True, stralign=None, numalign=None)

    def markdown(self) -> str:
        rule = "|" + "|".join("---:" if a == "r" else "---" for a in self.align) + "|"
        fmt = TableFormat(lineabove=None, linebelowheader=lambda widths, aligns: rule, linebetweenrows=None,
                          linebelow=None, headerrow=DataRow("|", "|", "|"), datarow=DataRow("|", "|", "|"),
                          padding=1, with_header_hide=None)
        body = self._tabulate(fmt, lambda c: f"**{_md(c.text)}**" if c.bold else _md(c.text), _md)
        return (f"### {self.title}\n\n" if self.title else "") + body + "\n"

    def html(self) -> str:
        left = [a == "l" for a in self.align]
        LEFT = ' class="l"'  # a text column (the page's style aligns the rest right)

        def row(tag, values, widths, aligns):
            cells = "".join(f"<{tag}{LEFT if lft else ''}>{v}</{tag}>" for v, lft in zip(values, left))
            return f"<table>\n<thead>\n<tr>{cells}</tr>\n</thead>\n<tbody>" if tag == "th" else f"<tr>{cells}</tr>"

        fmt = TableFormat(lineabove=None, linebelowheader=None, linebetweenrows=None,
                          linebelow=Line("</tbody>\n</table>", "", "", ""), headerrow=lambda *a: row("th", *a),
                          datarow=lambda *a: row("td", *a), padding=0, with_header_hide=None)
        body = self._tabulate(fmt, lambda c: f"<strong>{_html(c.text)}</strong>" if c.bold else _html(c.text),
                              _html)
        return (f"<h3>{_html(self.title)}</h3>\n" if self.title else "") + body + "\n"

    def latex(self) -> str:
        """The booktabs ``tabular`` alone (a paper's table body); :func:`latex_document` adds the title. A
        column whose longest cell has more than 40 characters wraps (``p{}``), its share of ``\\linewidth``
        in proportion to its length."""
        longest = [min(120, max([len(h)] + [len(r[i].text) for r in self.rows])) for i, h in enumerate(self.columns)]
        total = sum(longest) + 3 * len(longest)  # a column's padding, in characters
        spec = "".join(f"p{{{0.9 * n / total:.2f}\\linewidth}}" if n > 40 else a for a, n in zip(self.align, longest))
        fmt = TableFormat(lineabove=lambda widths, aligns: f"\\begin{{tabular}}{{{spec}}}\n\\toprule",
                          linebelowheader=Line("\\midrule", "", "", ""), linebetweenrows=None,
                          linebelow=Line("\\bottomrule\n\\end{tabular}", "", "", ""),
                          headerrow=DataRow("", "&", "\\\\"), datarow=DataRow("", "&", "\\\\"), padding=1,
                          with_header_hide=None)
        return self._tabulate(fmt, lambda c: f"\\textbf{{{latex_text(c.text)}}}" if c.bold else latex_text(c.text),
                              latex_text) + "\n"

    def text(self) -> TableText:
        """The Markdown as a :class:`TableText` (what a section puts among its lines)."""
        out = TableText(self.markdown())
        out.table = self
        return out


def tables_in(lines: Iterable[str]) -> List[Tuple[str, Table]]:
    """(title, table) of each table among a report's lines, in order; an untitled table takes the title of
    the Markdown heading above it."""
    out, heading = [], ""
    for line in lines:
        if isinstance(line, TableText):
            out.append((line.table.title or heading, line.table))
        elif str(line).startswith("#"):
            heading = str(line).lstrip("#").strip()
    return out


def _md(s: str) -> str:
    return s.replace("|", "\\|")


def _html(s: str) -> str:
    """Escaped text; `code` spans (the report's file and key names) as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(s, quote=False))


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                  "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}
# the symbols the report's cells and titles use, as LaTeX every distribution has (no unicode set-up needed)
_LATEX_SYMBOLS = {"±": r"$\pm$", "→": r"$\rightarrow$", "↩": r"$\hookleftarrow$", "Δ": r"$\Delta$",
                  "−": r"$-$", "–": "--", "—": "---", "≥": r"$\geq$", "≤": r"$\leq$", "×": r"$\times$",
                  "τ": r"$\tau$", "α": r"$\alpha$", "μ": r"$\mu$", "·": r"$\cdot$", "√": r"$\surd$",
                  "≈": r"$\approx$", "≠": r"$\neq$", "∞": r"$\infty$", "⚑": r"\textsuperscript{[flag]}",
                  "↺": r"\textsuperscript{[reprint]}", "⚠": r"(!)", "…": r"\ldots{}", "’": "'", "“": "``",
                  "”": "''", "°": r"\textdegree{}"}


def latex_text(s: str) -> str:
    """Plain text as LaTeX: specials escaped, the report's symbols as commands, `code` as \\texttt,
    any other non-ASCII character as its name (never a character pdflatex cannot set)."""
    out = []
    for part, code in _code_spans(str(s)):
        text = "".join(_LATEX_SPECIAL.get(ch) or _LATEX_SYMBOLS.get(ch) or (ch if ord(ch) < 128 else _named(ch))
                       for ch in part)
        out.append(f"\\texttt{{{text}}}" if code else text)
    return "".join(out)


def _code_spans(s: str):
    parts = s.split("`")
    if len(parts) % 2 == 0:  # an unmatched backtick: no spans
        return [(s, False)]
    return [(p, i % 2 == 1) for i, p in enumerate(parts) if p]


def _named(ch: str) -> str:
    if unicodedata.category(ch).startswith("L"):  # an accented letter: its base letter
        base = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
        if base:
            return base
    return f"[{unicodedata.name(ch, hex(ord(ch))).lower()}]"


def latex_document(tables: Sequence[Tuple[str, Table]], title: str = "fedshift report") -> str:
    """One LaTeX document with every (title, table) of :func:`tables_in` (``pdflatex`` with the booktabs package
    compiles it); each ``tabular`` stands on its own, to be pasted into a paper. The default font encoding
    (no ``fontenc``): every cell is ASCII after :func:`latex_text`, and T1 would need fonts Debian's
    texlive-latex-base has only as bitmaps (generated on first use, seconds per size)."""
    body = []
    for name, t in tables:
        if name:
            body.append(f"\\subsection*{{{latex_text(name)}}}")
        body.append("{\\small\n" + t.latex() + "}\n")
    return ("\\documentclass[a4paper]{article}\n\\usepackage{booktabs}\n"
            "\\usepackage[landscape,margin=1.5cm]{geometry}\n\\setlength{\\parindent}{0pt}\n"
            f"\\title{{{latex_text(title)}}}\n\\author{{}}\n\\date{{}}\n\\begin{{document}}\n\\maketitle\n"
            + "\n".join(body) + "\n\\end{document}\n")
