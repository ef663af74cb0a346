"""report.md and claims.csv as HTML pages that `snakemake --report` shows inline (issue 39 point 5)."""

from __future__ import annotations

from fedshift.report.html import markdown_html, write_html_views


def test_markdown_tables_render_and_figures_are_named_not_linked():
    md = ("# FCCL+ Table VIII\n\n| method | AVG |\n| --- | ---: |\n| fedavg | 58.57 ± 1.20 |\n\n"
          "![curves](curves__rotmnist__photo_patches__homo_lenet.png)\n")
    out = markdown_html(md)
    assert out.startswith("<!DOCTYPE html>") and "<h1>FCCL+ Table VIII</h1>" in out
    assert "<table>" in out and "<td>fedavg</td>" in out and "58.57 ± 1.20" in out
    assert "<img" not in out and "curves__rotmnist__photo_patches__homo_lenet.png" in out and '&quot;curves&quot;' in out


def test_views_are_written_beside_report_md_and_claims_csv(tmp_path):
    (tmp_path / "report.md").write_text("# report\n\ntext <b>not html</b>\n")
    assert write_html_views(tmp_path) == [tmp_path / "report.html"]  # no claims.csv: no claims.html
    assert "&lt;b&gt;" in (tmp_path / "report.html").read_text()  # raw HTML in Markdown is escaped
    (tmp_path / "claims.csv").write_text("claim,paper,ours\nfccl_plus > fedavg,held,NOT held\n")
    write_html_views(tmp_path)
    claims = (tmp_path / "claims.html").read_text()
    assert "<table" in claims and "<td>NOT held</td>" in claims
