"""Dotted overrides from the command line (issue 39 point 1): `fedshift run GRID KEY=VALUE -- ARGS`
and the typing of Snakemake's `--config` strings (fedshift.overrides)."""

from __future__ import annotations

import shutil
import sys

import pytest
import yaml

from conftest import REPO
from fedshift import cli
from fedshift.cli import grid as cli_grid  # where `fedshift run` execs Snakemake
from fedshift.errors import ConfigError
from fedshift.overrides import apply_overrides, coerce_cli_strings, parse_override, parse_value


@pytest.mark.parametrize("text, value", [("3", 3), ("0.1", 0.1), ("1e-4", 1e-4), ("true", True), ("[0, 1]", [0, 1]),
                                         ("cpu", "cpu"), ("{mu: 0.1}", {"mu": 0.1}), ("null", None)])
def test_values_are_typed_as_in_a_grid_file(text, value):
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


def test_overrides_set_nested_keys_create_mappings_and_index_lists():
    grid = {"engine": {"rounds": 12, "lr": 0.01}, "grid": [{"methods": ["fedavg", "fedprox"], "seeds": [0]}]}
    out = apply_overrides(grid, ["engine.rounds=3", "methods.fedprox.mu=0.1", "grid.0.seeds=[0, 1, 2]"])
    assert out["engine"] == {"rounds": 3, "lr": 0.01}
    assert out["methods"] == {"fedprox": {"mu": 0.1}}
    assert out["grid"][0]["seeds"] == [0, 1, 2]
    assert grid["engine"]["rounds"] == 12 and "methods" not in grid  # the input is left alone


@pytest.mark.parametrize("item, message", [
    ("engin.rounds=3", "unknown grid key 'engin' (did you mean 'engine'?)"),
    ("engine.rounds", "expected KEY=VALUE with a dotted key"),
    ("engine..rounds=3", "expected KEY=VALUE with a dotted key"),
    ("grid.4.seeds=[1]", "grid.4: '4' is not an index of this list (0..0)"),
    ("engine.rounds.x=3", "engine.rounds is 12, not a mapping"),
    ("engine.lr=[1", "is not valid YAML"),
])
def test_bad_overrides_fail_in_one_line_naming_the_key(item, message):
    with pytest.raises(ConfigError, match=".*") as err:
        apply_overrides({"engine": {"rounds": 12}, "grid": [{"seeds": [0]}]}, [item])
    assert message in str(err.value) and "\n" not in str(err.value)


GRID = {"grid": [{"scenarios": ["rotmnist"], "methods": ["base", "fedavg", "avg_v"], "seeds": [0]}],
        "variants": {"avg_v": {"method": "fedprox"}}}


@pytest.mark.parametrize("item, message", [
    # the README's own example on a grid without FedProx planned without a word (issue 50)
    ("methods.fedmd.epochs=3", "override 'methods.fedmd.epochs=3': the grid runs no method 'fedmd', so methods.fedmd "
                               "would change nothing; the grid's methods: base, fedavg, fedprox"),
    ("methods.fedavgg.lr=3", "the grid runs no method 'fedavgg' (did you mean 'fedavg'?)"),
    ("variants.avg_w.params={mu: 1}", "the grid runs no method 'avg_w' (did you mean 'avg_v'?), so variants.avg_w "
                                      "would change nothing; the grid's methods: base, fedavg, avg_v"),
    ("scenario_overrides.digits_offline.engine={rounds: 2}", "the grid runs no scenario 'digits_offline', so "
     "scenario_overrides.digits_offline would change nothing; the grid's scenarios: rotmnist"),
    ("scenario_overrides.rotmnist.methods.moon.mu=2", "the grid runs no method 'moon'"),
])
def test_overrides_of_what_the_grid_does_not_run_are_refused_in_one_line(item, message):
    with pytest.raises(ConfigError) as err:
        apply_overrides(GRID, [item])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_overrides_of_what_the_grid_runs_pass_including_a_variants_base_method():
    out = apply_overrides(GRID, ["methods.fedprox.mu=0.1", "variants.avg_v.engine={lr: 0.1}",
                                 "scenario_overrides.rotmnist.methods.fedavg.weighting=uniform",
                                 "grid.0.methods=[base, fedavg, avg_v, moon]", "methods.moon.mu=2"])  # the grid after all
    assert out["methods"] == {"fedprox": {"mu": 0.1}, "moon": {"mu": 2}}


def test_a_misspelt_key_of_a_method_the_grid_runs_names_the_valid_keys(project, monkeypatch, capsys):
    monkeypatch.setattr(cli_grid, "_snakemake", lambda cmd: pytest.fail("snakemake started"))
    assert cli.main(["run", "grid.1.methods=[fedavg, fedprox]", "methods.fedprox.muu=0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fedshift: error: methods.fedprox.muu: unknown key (did you mean 'mu'?); valid keys: init, mu")
    # (issue 49: eval_models and weighting are the grid's scoring:, no method's keys)
    assert cli.main(["run", "engine.rounds=3", "methods.fedprox.mu=0.1"]) == 2  # the README's example, default grid
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the grid runs no method 'fedprox'" in err[0] and "base, fedmd, feddf, fccl" in err[0]


def test_snakemake_config_strings_are_typed_in_place():
    """Snakemake's --config engine='{rounds: 3, targets: [0.5]}' (YAML BaseLoader): all strings."""
    config = {"engine": {"rounds": "3", "lr": "1e-4", "device": "cpu", "targets": ["0.5"], "local_batch": 64},
              "report": {"title": "kept: as is"}}
    done = coerce_cli_strings(config, {"engine": {"rounds": "3", "lr": "1e-4", "device": "cpu", "targets": ["0.5"]}})
    assert config["engine"] == {"rounds": 3, "lr": 1e-4, "device": "cpu", "targets": [0.5], "local_batch": 64}
    assert config["report"] == {"title": "kept: as is"}  # not given on the command line: untouched
    assert sorted(done) == ["engine.device", "engine.lr", "engine.rounds", "engine.targets"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "params").mkdir()
    shutil.copy(REPO / "params/experiments.yaml", tmp_path / "params/experiments.yaml")
    shutil.copy(REPO / "params/data.yaml", tmp_path / "params/data.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_run_writes_the_merged_grid_and_runs_snakemake_on_it(project, monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(cli_grid, "_snakemake", lambda cmd: seen.update(cmd=cmd) or 0)
    assert cli.main(["run", "engine.rounds=3", "methods.fccl_plus.omega=0.5", "--", "-n", "--cores", "1"]) == 0
    cmd = seen["cmd"]
    assert cmd[:3] == [sys.executable, "-m", "snakemake"] and cmd[3] == "--configfile" and cmd[5:] == ["-n", "--cores", "1"]
    grid = yaml.safe_load((project / cmd[4]).read_text())
    assert grid["engine"]["rounds"] == 3 and grid["engine"]["local_batch"] == 64  # the rest of the default grid kept
    assert grid["methods"]["fccl_plus"]["omega"] == 0.5
    assert "engine.rounds=3, methods.fccl_plus.omega=0.5 on params/experiments.yaml" in capsys.readouterr().err


def test_run_says_where_the_report_went_and_returns_snakemakes_status(project, monkeypatch, capsys):
    def snakemake(cmd):  # what a finished workflow leaves: the named grid's report
        (project / "results/ablations/mine/report").mkdir(parents=True)
        (project / "results/ablations/mine/report/report.md").write_text("# report")
        return 0

    monkeypatch.setattr(cli_grid, "_snakemake", snakemake)
    assert cli.main(["run", "report.name=mine"]) == 0
    err = capsys.readouterr().err
    assert "fedshift run: report: results/ablations/mine/report/report.md" in err.splitlines()[-1]
    assert err.count("fedshift: note:") == 0  # Snakemake prints the grid's notes; they were printed twice
    monkeypatch.setattr(cli_grid, "_snakemake", lambda cmd: 1)
    assert cli.main(["run", "report.name=mine"]) == 1 and "report:" not in capsys.readouterr().err


def test_run_refuses_bad_input_before_snakemake(project, monkeypatch, capsys):
    monkeypatch.setattr(cli_grid, "_snakemake", lambda *a: pytest.fail("snakemake started"))
    assert cli.main(["run", "engine.rouns=3"]) == 2  # checked against the dataclasses, as validate does
    assert "engine (base on rotmnist).rouns: unknown key (did you mean 'rounds'?)" in capsys.readouterr().err
    assert cli.main(["run", "nogrid.yaml"]) == 2
    assert "nogrid.yaml: no such grid file, and not a KEY=VALUE override" in capsys.readouterr().err
    assert cli.main(["run", "engine.rounds=3", "--", "--configfile", "x.yaml"]) == 2
    assert "--configfile after `--`" in capsys.readouterr().err
