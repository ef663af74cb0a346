"""Lines of code of the three SCAFFOLDs, by the counter tests/test_method_contract.py holds plugins to (a module
docstring counted apart: the docs block has none)."""
import ast
import sys

from _shared import HERE, REPO

sys.path.insert(0, str(REPO / "tests"))
from test_method_contract import _doc_scaffold, _lines_of_code  # noqa: E402


def module_doc_lines(code):
    t = ast.parse(code)
    if t.body and isinstance(t.body[0], ast.Expr) and isinstance(t.body[0].value, ast.Constant):
        return t.body[0].end_lineno - t.body[0].lineno + 1
    return 0


after, _ = _doc_scaffold()
before = (HERE / "scratch_scaffold.py").read_text()
builtin = (REPO / "src/fedshift/methods/scaffold.py").read_text()
for name, code in (("before (old API plugin)", before), ("after (docs block)", after), ("built-in scaffold.py", builtin)):
    loc = _lines_of_code(code)
    print(name, "loc incl. module docstring:", loc, "module docstring lines:", module_doc_lines(code),
          "=> code lines:", loc - module_doc_lines(code))
