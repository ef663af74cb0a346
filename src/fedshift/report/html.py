"""report.md and claims.csv as HTML pages, for ``snakemake --report``: its HTML report shows
images, PDFs and HTML inline and offers every other file (Markdown, CSV) as a download only
(issue 39 point 5). The Markdown is rendered by markdown-it-py (in the pinned environment, via
rich), tables included; a figure reference becomes a line naming the figure's own report item
(a data-URI page cannot reach the PNGs beside it)."""

from __future__ import annotations

import html
import re
from pathlib import Path

_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_STYLE = ("body{font-family:sans-serif;font-size:14px;margin:1em 2em;line-height:1.4}"
          "table{border-collapse:collapse;margin:.5em 0 1.2em}th,td{border:1px solid #ccc;padding:2px 6px;"
          "text-align:right}th:first-child,td:first-child{text-align:left}thead{background:#f2f2f2}"
          "code{background:#f6f6f6;padding:0 2px}")


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n")


def markdown_html(text: str, title: str = "report") -> str:
    """A Markdown report as one HTML page (tables as <table>; figures named, not embedded)."""
    text = _IMAGE.sub(lambda m: f"*[figure `{m.group(2)}`: its own item in the report, under "
                                f"\"{m.group(2).split('__')[0]}\"]*", text)
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # not in the environment: the text as is, still readable inline
        return page(title, f"<pre>{html.escape(text)}</pre>")
    return page(title, MarkdownIt("commonmark", {"html": False}).enable("table").render(text))


def csv_html(path: Path, title: str) -> str:
    """A CSV file as one HTML table."""
    import pandas as pd

    frame = pd.read_csv(path)
    return page(title, f"<h2>{html.escape(title)}</h2>\n" + frame.to_html(index=False, na_rep="", border=0))


def write_html_views(folder: Path) -> list:
    """``report.html`` beside ``report.md`` and ``claims.html`` beside ``claims.csv``; returns the
    files written."""
    folder = Path(folder)
    out = []
    if (folder / "report.md").exists():
        (folder / "report.html").write_text(markdown_html((folder / "report.md").read_text(), "report.md"))
        out.append(folder / "report.html")
    if (folder / "claims.csv").exists():
        (folder / "claims.html").write_text(csv_html(folder / "claims.csv", "claims: each paper conclusion, "
                                                                            "on the paper's table and on ours"))
        out.append(folder / "claims.html")
    return out
