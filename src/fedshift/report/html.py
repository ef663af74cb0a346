"""The report's other views beside ``report.md``: ``report.html`` (figures embedded), ``claims.html`` and
``tables.tex``.

``snakemake --report`` shows images, PDFs and HTML inline and offers every other file (Markdown, CSV) as
a download only (issue 39 point 5), and shows each HTML item as a data-URI page that cannot reach the
PNGs beside it: ``report.html`` therefore carries every figure of ``report.md`` inside it (a base64 data
URI; issue 50). Its text is report.md's, rendered by markdown-it-py (in the pinned environment, via rich);
its tables are the tables' own HTML (:mod:`fedshift.report.tables`), so report.md, report.html and
``tables.tex`` (every table as LaTeX, one document ``pdflatex`` compiles) show the same cells.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import List, Optional, Sequence

from .tables import TableText, latex_document, tables_in

_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_STYLE = ("body{font-family:sans-serif;font-size:14px;margin:1em 2em;line-height:1.4}"
          "table{border-collapse:collapse;margin:.5em 0 1.2em}th,td{border:1px solid #ccc;padding:2px 6px;"
          "text-align:right}th:first-child,td:first-child,th.l,td.l{text-align:left}thead{background:#f2f2f2}"
          "code{background:#f6f6f6;padding:0 2px}img{max-width:100%;height:auto}")


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n")


def embed_figures(text: str, folder: Optional[Path]) -> str:
    """Markdown whose ``![alt](figure.png)`` references to PNGs in ``folder`` are data URIs (the figure
    inside the page); a figure not in ``folder`` is named instead."""
    def one(m):
        path = Path(folder) / m.group(2) if folder is not None else None
        if path is not None and path.suffix == ".png" and path.is_file():
            return f"![{m.group(1)}](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"
        return f"*[figure `{m.group(2)}`: not found beside the report]*"

    return _IMAGE.sub(one, text)


def markdown_body(text: str, folder: Optional[Path] = None) -> str:
    """Markdown as HTML (tables as <table>, figures of ``folder`` embedded)."""
    text = embed_figures(text, folder)
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # not in the environment: the text as is, still readable inline
        return f"<pre>{html.escape(text)}</pre>"
    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def markdown_html(text: str, title: str = "report", folder: Optional[Path] = None) -> str:
    """A Markdown report as one HTML page."""
    return page(title, markdown_body(text, folder))


def report_html(lines: Sequence[str], folder: Path, title: str = "report") -> str:
    """The report's lines as one page: text through markdown-it, each table through its own HTML."""
    parts: List[str] = []
    text: List[str] = []
    for line in list(lines) + [TableText("")]:
        if isinstance(line, TableText):
            if text:
                parts.append(markdown_body("\n".join(text), folder))
                text = []
            if line:
                parts.append(line.table.html())
        else:
            text.append(line)
    return page(title, "\n".join(parts))


def csv_html(path: Path, title: str) -> str:
    """A CSV file as one HTML table."""
    import pandas as pd

    frame = pd.read_csv(path)
    return page(title, f"<h2>{html.escape(title)}</h2>\n" + frame.to_html(index=False, na_rep="", border=0))


def write_views(lines: Sequence[str], folder: Path, title: str = "fedshift report") -> list:
    """``report.html`` and ``tables.tex`` from the report's lines, ``claims.html`` beside ``claims.csv``;
    returns the files written."""
    folder = Path(folder)
    (folder / "report.html").write_text(report_html(lines, folder, title))
    out = [folder / "report.html"]
    tables = tables_in(lines)
    if tables:
        (folder / "tables.tex").write_text(latex_document(tables, title))
        out.append(folder / "tables.tex")
    return out + _claims_view(folder)


def write_html_views(folder: Path) -> list:
    """``report.html`` from a ``report.md`` already written (figures embedded) and ``claims.html`` beside
    ``claims.csv``; returns the files written."""
    folder = Path(folder)
    out = []
    if (folder / "report.md").exists():
        (folder / "report.html").write_text(markdown_html((folder / "report.md").read_text(), "report.md", folder))
        out.append(folder / "report.html")
    return out + _claims_view(folder)


def _claims_view(folder: Path) -> list:
    if not (folder / "claims.csv").exists():
        return []
    (folder / "claims.html").write_text(csv_html(folder / "claims.csv", "claims: each paper conclusion, "
                                                                        "on the paper's table and on ours"))
    return [folder / "claims.html"]
