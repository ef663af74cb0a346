"""The method contract is declared on `Method` (issue 35 item 1): every attribute and hook the runner,
engine and resources read has a default there, and nothing reads one with getattr. The engine's side
(issue 49): a method sees the engine only through its round context, every name of which is documented."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import REPO
from fedshift.engine.context import FIELDS, RoundContext
from fedshift.methods import METHODS, create_method
from fedshift.methods.base import Method

CONTRACT = ("supports_sampling", "supports_server_model", "per_client_state", "fused_auto_devices",
            "fused_objective", "run_summary", "artifacts", "init_from", "weight_copies", "requires", "requirements",
            "public_graphs", "steps_on_peer_batches", "requires_homogeneous", "uses_public", "state_dict",
            "load_state_dict", "server_step", "prototype_scores", "setup", "collaborate", "local_update",
            "local_loss", "after_round", "run_round")
# the methods' code (a plugin's own tests drive a federation: they are not method code)
METHOD_FILES = sorted((REPO / "src/fedshift/methods").glob("*.py")) + sorted(
    p for p in (REPO / "examples").rglob("*.py") if not p.name.startswith("test_"))


def test_every_contract_name_has_a_default_on_method():
    missing = [n for n in CONTRACT if not hasattr(Method, n)]
    assert not missing, missing
    m = create_method("base")
    assert (m.supports_sampling, m.supports_server_model, m.per_client_state, m.fused_auto_devices,
            m.fused_objective, m.run_summary(None), m.init_from, m.prototype_scores(None)) == (
        False, False, "", None, None, {}, "scratch", None)
    assert m.server_step(None, {}, {}) is None  # no server: every participant keeps its model
    req = m.requirements()
    assert (req.optimizer, req.momentum, req.public, req.base) == (None, None, False, False)
    assert create_method("fccl").requirements().base and create_method("fedmd").requirements().public
    assert create_method("scaffold").requirements().optimizer == "sgd"


def test_no_getattr_on_a_method_for_a_contract_name():
    pat = re.compile(r"getattr\((method|self\.method)\b")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "src/fedshift").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pat.search(line)]
    assert not hits, hits


def test_built_in_methods_keep_the_declared_types():
    for name in METHODS.names():
        m = create_method(name)
        assert isinstance(m.supports_sampling, bool) and isinstance(m.supports_server_model, bool), name
        assert isinstance(m.per_client_state, str), name
        assert m.init_from in ("scratch", "base"), name


def _ctx_names(path):
    """Every ``<x>.<name>`` of the file whose ``<x>`` is a hook's context (``ctx``, ``self._ctx``), with its line."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = ast.unparse(node.value)
            if base in ("ctx", "self._ctx"):
                yield node.lineno, node.attr


def test_methods_and_examples_read_only_the_documented_round_context():
    """Issue 49: the round context is the only door from the engine to a method. Every name a method of
    fedshift/methods or examples/ reads on it is a documented field (FIELDS, printed in docs/extending.md),
    every field exists on RoundContext, and no file names the federation (``fed.``) or takes it as ``fed``."""
    used, undocumented, fed_names = set(), [], []
    for path in METHOD_FILES:
        for line, name in _ctx_names(path):
            used.add(name)
            if name not in FIELDS:
                undocumented.append(f"{path.relative_to(REPO)}:{line}: ctx.{name}")
    for path in METHOD_FILES + sorted((REPO / "examples").rglob("test_*.py")):  # `grep fed.` finds nothing
        for i, text in enumerate(path.read_text().splitlines(), 1):
            code = text.split("#")[0]
            if re.search(r"\bfed\.\w|\(self, fed\b|\bfed\)|_fed\b", code):
                fed_names.append(f"{path.relative_to(REPO)}:{i}: {text.strip()}")
    assert not undocumented, undocumented
    assert not fed_names, fed_names
    assert used >= {"participants", "trained", "steps", "lr", "train_participants", "to_all", "average"}
    missing = [n for n in FIELDS if not hasattr(RoundContext, n) and n not in ("trained",)]
    assert not missing, missing
    doc = (REPO / "docs/extending.md").read_text()
    table = doc[doc.index("## The round context"):doc.index("## The method hooks")]
    assert [n for n in FIELDS if not re.search(rf"`{n}[`(]", table)] == []


def test_no_method_file_names_a_scoring_protocol():
    """Which models are scored is the grid's (scoring.eval_models): no method file mentions it, nor
    imports FedH2L's pooled metrics (Method knows no paper's metric)."""
    hits = [f"{p.relative_to(REPO)}:{i}" for p in METHOD_FILES for i, line in enumerate(p.read_text().splitlines(), 1)
            if "eval_models" in line or "pooled" in line and "import" in line]
    assert not hits, hits


def _doc_plugin():
    """The FedAvgM block of docs/extending.md, executed as a newcomer would paste it."""
    import re as _re

    text = (REPO / "docs/extending.md").read_text()
    section = text[text.index("### A complete plugin: FedAvgM"):]
    code = _re.search(r"```python\n(.*?)```", section, _re.S).group(1)
    ns: dict = {"__name__": "fedavgm_doc"}
    exec(compile(code, "docs/extending.md", "exec", dont_inherit=True), ns)  # no __future__ of this file
    return code, ns["FedAvgM"]


def _doc_scaffold():
    """The SCAFFOLD block of docs/extending.md (per-participant state and a server step), executed alike."""
    import re as _re

    text = (REPO / "docs/extending.md").read_text()
    section = text[text.index("### Per-participant state and a server step"):]
    code = _re.search(r"```python\n(.*?)```", section, _re.S).group(1)
    ns: dict = {"__name__": "scaffold_doc"}
    exec(compile(code, "docs/extending.md", "exec", dont_inherit=True), ns)
    return code, ns["Scaffold"]


def _lines_of_code(code):
    import ast
    import io
    import tokenize

    doc = {n.body[0].lineno for n in ast.walk(ast.parse(code)) if isinstance(n, (ast.ClassDef, ast.FunctionDef))
           and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    lines = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(code).readline)
             if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                               tokenize.ENDMARKER)}
    return len(lines - doc)


def _fed64(monkeypatch):
    from fedshift.engine import federation
    from fedshift.testing import synthetic_federation

    monkeypatch.setattr(federation, "normalize", lambda x: (x.double() / 255.0 - 0.5) / 0.5)
    fed = synthetic_federation(4, local_epochs=1, lr=0.05)
    fed.clients[0].model.double()  # server_model: one shared model
    return fed


def _rounds(method, fed, n):
    from fedshift.engine import fused

    fed.setup(method)
    fused.decide_for_run(fed, method)
    out = []
    for r in range(1, n + 1):
        fed.round = r
        fed.run_round(r)
        out.append({k: v.clone() for k, v in fed.clients[0].model.state_dict().items()})
    return out


def test_the_fedavgm_of_extending_md_is_20_lines_and_computes_server_momentum(monkeypatch):
    """Issue 35: a FedAvgM plugin of <= 20 lines of code, written from docs/extending.md alone. beta = 0 is
    FedAvg; with beta = 0.9, round 2's global model is FedAvg's w2 - 0.9 (w0 - w1) (w1 = FedAvg's first
    average, the momentum's first step), computed here from plain FedAvg runs; its state round-trips."""
    import io

    import torch

    from fedshift.config import resolve

    code, FedAvgM = _doc_plugin()
    assert _lines_of_code(code) <= 20
    w0 = {k: v.clone() for k, v in _fed64(monkeypatch).clients[0].model.state_dict().items()}
    avg = _rounds(create_method("fedavg"), _fed64(monkeypatch), 2)
    m0 = _rounds(FedAvgM(resolve(FedAvgM.Params, {"beta": 0.0}, "methods.fedavgm")), _fed64(monkeypatch), 2)
    m = FedAvgM(resolve(FedAvgM.Params, {"beta": 0.9}, "methods.fedavgm"))
    mom = _rounds(m, _fed64(monkeypatch), 2)
    for k, v in avg[1].items():
        torch.testing.assert_close(m0[1][k], v, rtol=1e-12, atol=1e-12)
        if torch.is_floating_point(v):
            torch.testing.assert_close(mom[0][k], avg[0][k], rtol=1e-12, atol=1e-12)  # v1 = w0 - w1: w1 alike
            torch.testing.assert_close(mom[1][k], v - 0.9 * (w0[k] - avg[0][k]), rtol=1e-9, atol=1e-11)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh = FedAvgM(resolve(FedAvgM.Params, {"beta": 0.9}, "methods.fedavgm"))
    _fed64(monkeypatch).setup(fresh)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.v.keys() == m.v.keys() and all(torch.equal(fresh.v[k], m.v[k]) for k in m.v)


@pytest.mark.parametrize("eval_models", ["global", "local"])
def test_the_scaffold_of_extending_md_runs_and_resumes_under_either_protocol(tiny_data, tmp_path, eval_models):
    """Issue 49: a plugin written from the docs alone (per-participant state, a server step), with no branch
    on the protocol, runs under eval_models global and local and resumes bit-identically from its state."""
    from fedshift.testing import resumed_round_three, tiny_federation

    code, Scaffold = _doc_scaffold()
    assert _lines_of_code(code) <= 30 and "eval_models" not in code

    def build():
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), rounds=3, public_aug="none", optimizer="sgd",
                              momentum=0.0, lr=0.05, weight_decay=0.0, scoring={"eval_models": eval_models})
        m = Scaffold(Scaffold.Params())
        fed.setup(m)
        return fed, m

    (fed, m), _ = resumed_round_three(build, tmp_path / "state.pt")
    assert any(float(v.abs().sum()) > 0 for v in m.c.values())  # the server moved the controls
    assert (fed.pending is not None) == (eval_models == "local")  # the engine timed the delivery


def test_the_scaffold_of_extending_md_computes_what_the_built_in_scaffold_does(monkeypatch):
    """In float64, two rounds of three sampled clients of five: the doc plugin's models and controls equal the
    built-in scaffold's (tests/test_scaffold_fednova.py holds that one against Algorithm 1 written as a loop)."""
    import torch

    from fedshift.testing import synthetic_federation

    _, Scaffold = _doc_scaffold()
    from fedshift.engine import federation

    monkeypatch.setattr(federation, "normalize", lambda x: (x.double() / 255.0 - 0.5) / 0.5)
    out = []
    for make in (lambda: Scaffold(Scaffold.Params()), lambda: create_method("scaffold")):
        fed = synthetic_federation(5, server_model=False, local_epochs=2, local_batch=4, lr=0.1, momentum=0.0,
                                   clients_per_round=3, scoring={"weighting": "uniform"})
        for c in fed.clients:
            c.model.double()
        m = make()
        fed.setup(m)
        for r in (1, 2):
            fed.run_round(r)
        out.append((fed, m))
    (fa, ma), (fb, mb) = out
    for k, v in fa.clients[0].model.state_dict().items():
        torch.testing.assert_close(v, fb.clients[0].model.state_dict()[k], rtol=1e-10, atol=1e-12)
    for name in ma.c_i:
        for k, v in ma.c_i[name].items():
            torch.testing.assert_close(v, mb.c_i[name][k], rtol=1e-9, atol=1e-11)
    assert any(float(v.abs().sum()) > 0 for v in mb.c.values())
