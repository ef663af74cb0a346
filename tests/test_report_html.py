"""report.html, claims.html and tables.tex: the views `snakemake --report` shows inline (issue 39 point 5),
with the figures inside the page (issue 50: a data-URI page cannot reach the PNGs beside it)."""

from __future__ import annotations

import base64

from fedshift.report.html import markdown_html, report_html, write_html_views, write_views
from fedshift.report.tables import Cell, Table

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32  # the bytes only travel: nothing decodes them here


def test_markdown_tables_render_and_figures_are_embedded(tmp_path):
    (tmp_path / "curves__rotmnist.png").write_bytes(PNG)
    md = ("# FCCL+ Table VIII\n\n| method | AVG |\n| --- | ---: |\n| fedavg | 58.57 ± 1.20 |\n\n"
          "![curves](curves__rotmnist.png)\n\n![gone](missing.png)\n")
    out = markdown_html(md, folder=tmp_path)
    assert out.startswith("<!DOCTYPE html>") and "<h1>FCCL+ Table VIII</h1>" in out
    assert "<table>" in out and "<td>fedavg</td>" in out and "58.57 ± 1.20" in out
    assert f'<img src="data:image/png;base64,{base64.b64encode(PNG).decode()}" alt="curves"' in out
    assert "<code>missing.png</code>: not found beside the report" in out  # named, never a broken link


def test_report_html_takes_each_tables_own_html_and_the_text_through_markdown(tmp_path):
    (tmp_path / "f.png").write_bytes(PNG)
    table = Table(["method", "AVG→"], [["a_b", Cell("51.00 ± 2.00", bold=True)]], "Inter-domain top1: x")
    out = report_html(["# t", "", "**What** the `x` covers.", table.text(), "![f](f.png)"], tmp_path, "t")
    assert "<h1>t</h1>" in out and "<strong>What</strong> the <code>x</code> covers." in out
    assert ('<tr><td class="l">a_b</td><td><strong>51.00 ± 2.00</strong></td></tr>' in out
            and "<h3>Inter-domain top1: x</h3>" in out)
    assert out.index("<h3>Inter-domain") < out.index("data:image/png;base64,")  # in the report's order


def test_views_are_written_beside_report_md_and_claims_csv(tmp_path):
    (tmp_path / "report.md").write_text("# report\n\ntext <b>not html</b>\n")
    assert write_html_views(tmp_path) == [tmp_path / "report.html"]  # no claims.csv: no claims.html
    assert "&lt;b&gt;" in (tmp_path / "report.html").read_text()  # raw HTML in Markdown is escaped
    (tmp_path / "claims.csv").write_text("claim,paper,ours\nfccl_plus > fedavg,held,NOT held\n")
    write_html_views(tmp_path)
    claims = (tmp_path / "claims.html").read_text()
    assert "<table" in claims and "<td>NOT held</td>" in claims
    lines = ["# r", Table(["a", "b"], [["x", "1"]], "T").text()]
    assert write_views(lines, tmp_path) == [tmp_path / n for n in ("report.html", "tables.tex", "claims.html")]
    assert "\\begin{tabular}{lr}" in (tmp_path / "tables.tex").read_text()
