"""The method contract is declared on `Method` (issue 35 item 1): every attribute and hook the runner,
engine and resources read has a default there, and nothing reads one with getattr."""

from __future__ import annotations

import re

from conftest import REPO
from fedshift.methods import METHODS, create_method
from fedshift.methods.base import Method

CONTRACT = ("supports_sampling", "supports_server_model", "per_client_state", "fused_auto_devices",
            "fused_objective", "run_summary", "artifacts", "init_from", "eval_protocol", "weight_copies",
            "public_graphs", "steps_on_peer_batches", "requires_homogeneous", "uses_public", "state_dict",
            "load_state_dict")


def test_every_contract_name_has_a_default_on_method():
    missing = [n for n in CONTRACT if not hasattr(Method, n)]
    assert not missing, missing
    m = create_method("base")
    assert (m.supports_sampling, m.supports_server_model, m.per_client_state, m.fused_auto_devices,
            m.fused_objective, m.run_summary(None), m.init_from, m.eval_protocol) == (
        False, False, "", None, None, {}, "scratch", "global")


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
        assert m.init_from in ("scratch", "base") and m.eval_protocol in ("global", "local"), name
