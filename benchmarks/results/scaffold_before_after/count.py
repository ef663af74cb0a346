import ast, io, re, tokenize
from pathlib import Path

def loc(code):  # tests/test_method_contract.py:123-132 (_lines_of_code), copied
    doc = {n.body[0].lineno for n in ast.walk(ast.parse(code)) if isinstance(n, (ast.ClassDef, ast.FunctionDef))
           and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    lines = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(code).readline)
             if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                               tokenize.ENDMARKER)}
    return len(lines - doc)

def module_doc_lines(code):
    t = ast.parse(code)
    if t.body and isinstance(t.body[0], ast.Expr) and isinstance(t.body[0].value, ast.Constant):
        return t.body[0].end_lineno - t.body[0].lineno + 1
    return 0

after = re.search(r"```python\n(.*?)```", Path("/work/main/docs/extending.md").read_text().split(
    "### Per-participant state and a server step")[1], re.S).group(1)
before = Path("/tmp/scaffold_before_after/scratch_scaffold.py").read_text()
builtin = Path("/work/main/src/fedshift/methods/scaffold.py").read_text()
for name, code in (("before (old API plugin)", before), ("after (docs block)", after), ("built-in scaffold.py", builtin)):
    print(name, "loc incl. module docstring:", loc(code), "module docstring lines:", module_doc_lines(code),
          "=> code lines:", loc(code) - module_doc_lines(code))
