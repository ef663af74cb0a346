"""One table, three outputs (report/tables.py): the same cells in Markdown, HTML and booktabs LaTeX, the
report's marks kept, specials escaped, and the report's symbols set as LaTeX pdflatex knows."""

from __future__ import annotations

import pytest

from fedshift.report.tables import Cell, Table, TableText, latex_document, latex_text, tables_in

ROWS = [["fedavg", Cell("58.57 ± 1.20", bold=True), "3"], ["my_plugin|v2", "97.45 [93.10, 100.00]", "2"]]


def table():
    return Table(["method", "AVG→ (lenet)", "seeds"], ROWS, "Inter-domain top1: rotmnist / public p_q")


def test_markdown_is_the_reports_pipe_table_unpadded():
    assert table().markdown() == (
        "### Inter-domain top1: rotmnist / public p_q\n\n| method | AVG→ (lenet) | seeds |\n|---|---:|---:|\n"
        "| fedavg | **58.57 ± 1.20** | 3 |\n| my_plugin\\|v2 | 97.45 [93.10, 100.00] | 2 |\n")


def test_html_escapes_and_marks_bold_and_text_columns():
    out = Table(["claim", "n"], [["a < b & `c`", Cell("5", True)]], "T <1>", align="lr").html()
    assert out.startswith("<h3>T &lt;1&gt;</h3>\n<table>\n<thead>\n<tr><th class=\"l\">claim</th><th>n</th></tr>")
    assert '<tr><td class="l">a &lt; b &amp; <code>c</code></td><td><strong>5</strong></td></tr>' in out


def test_latex_is_booktabs_with_the_same_cells():
    out = table().latex()
    assert out.splitlines()[:3] == ["\\begin{tabular}{lrr}", "\\toprule", " method & AVG$\\rightarrow$ (lenet) & seeds \\\\"]
    assert "\\midrule" in out and out.rstrip().endswith("\\bottomrule\n\\end{tabular}")
    assert " fedavg & \\textbf{58.57 $\\pm$ 1.20} & 3 \\\\" in out
    assert " my\\_plugin\\textbar{}v2 & 97.45 [93.10, 100.00] & 2 \\\\" in out
    long = Table(["claim", "n"], [["x" * 80, "1"]]).latex()
    assert long.startswith("\\begin{tabular}{p{0.83\\linewidth}r}")  # wraps: 0.9 x 80 / (80 + 1 + 2 x 3) of the line


@pytest.mark.parametrize("text,tex", [
    ("Δ = 1.5 ± 0.2 (n ≥ 3)", "$\\Delta$ = 1.5 $\\pm$ 0.2 (n $\\geq$ 3)"),
    ("AVG↩ 50% of #1 & $2_x", "AVG$\\hookleftarrow$ 50\\% of \\#1 \\& \\$2\\_x"),
    ("`std_table_*.csv` − ⚑", "\\texttt{std\\_table\\_*.csv} $-$ \\textsuperscript{[flag]}"),
    ("café ☃", "cafe [snowman]"),  # an unknown symbol is named, never a character pdflatex cannot set
])
def test_latex_text(text, tex):
    assert latex_text(text) == tex


def test_table_text_is_the_markdown_and_carries_the_table():
    t = table()
    bare = Table(["claim", "verdict"], [["c", "held"]])
    lines = ["# r", t.text(), "after", "## Claims of this grid", "", bare.text()]
    assert "\n".join(lines).count("| fedavg |") == 1 and isinstance(lines[1], TableText)
    assert tables_in(lines) == [(t.title, t), ("Claims of this grid", bare)]  # untitled: the heading above it
    doc = latex_document(tables_in(lines[:2]), "a_b")
    assert "\\usepackage{booktabs}" in doc and "\\title{a\\_b}" in doc
    assert "\\subsection*{Inter-domain top1: rotmnist / public p\\_q}" in doc and doc.rstrip().endswith("\\end{document}")


def test_rows_must_fit_the_columns():
    with pytest.raises(ValueError, match="a row of 2 cells under 3 columns"):
        Table(["a", "b", "c"], [["1", "2"]], "t")
    with pytest.raises(ValueError, match="align 'lx'"):
        Table(["a", "b"], [], align="lx")
