"""The generic path names no paper's method (issue 35): runner.py, cli/ and engine/ import no
paper's method module and call no paper-specific code; a paper's extras reach them only through
the :class:`fedshift.methods.Method` hooks (``prototype_scores``, ``artifacts``, ``run_summary``) and the
grid's scoring registry (``fedshift.scoring``). Comments, docstrings and strings (citations,
file names in messages) are not code and are not scanned."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PKG = REPO / "src" / "fedshift"
GENERIC = [PKG / "runner.py", *sorted((PKG / "cli").glob("*.py")), *sorted((PKG / "engine").glob("*.py"))]
PAPER = re.compile(r"fedh2l|h2l|fccl|fedheal|fedproto|fedmd|fedmatch|rhfl|fpl|fedtgp|fedproc|rcfl|moon|fml\b",
                   re.IGNORECASE)


def names(path: Path):
    """(line, name) of every import and identifier the module's code uses."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield node.lineno, node.module or ""
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg


def test_runner_cli_and_engine_name_no_paper_method():
    found = [f"{p.relative_to(REPO)}:{line}: {name}" for p in GENERIC for line, name in names(p) if PAPER.search(name)]
    assert not found, "paper-specific code in the generic path (use a Method hook):\n" + "\n".join(found)

