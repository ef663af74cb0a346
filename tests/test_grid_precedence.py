"""A grid's own `methods:` block outranks the base file's scenario_overrides (issue 34 item 6); its own
`scoring:` block likewise (tests/test_protocols.py)."""

from __future__ import annotations

import yaml

from conftest import REPO
from fedshift.experiments import load_experiments, snakemake_config, user_methods_win


def _grid(tmp_path, methods):
    f = tmp_path / "grid.yaml"
    f.write_text(yaml.safe_dump({
        "methods": methods,
        "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedrs", "fedprox"],
                  "structures": ["homo_lenet"], "seeds": [0]}]}))
    return f


def _params(plan, method):
    return next(c for j, c in plan.federate.items() if j.method == method)["method_params"]


def test_grid_methods_block_replaces_the_base_scenario_override_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = snakemake_config([_grid(tmp_path, {"fedrs": {"restriction": "missing", "alpha": 0.3}})])
    assert "methods.fedrs.restriction: 'missing' (this grid) replaces the base file's " \
           "scenario_overrides.rotmnist.methods.fedrs.restriction: 'count'" in capsys.readouterr().err
    plan = load_experiments(cfg, REPO / "params/data.yaml")
    assert _params(plan, "fedrs")["restriction"] == "missing" and _params(plan, "fedrs")["alpha"] == 0.3


def test_without_a_methods_block_the_base_override_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = load_experiments(snakemake_config([_grid(tmp_path, {})]), REPO / "params/data.yaml")
    assert _params(plan, "fedrs")["restriction"] == "count"


def test_the_grids_own_scenario_override_still_wins():
    merged = {"methods": {"fedrs": {"restriction": "missing"}},
              "scenario_overrides": {"rotmnist": {"methods": {"fedrs": {"restriction": "count"}}}}}
    own = dict(merged)  # the user's file sets both: its own scenario override is meant
    out, notes = user_methods_win(merged, own)
    assert out == merged and notes == []
