"""The `fedshift` command: registry listings and one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedshift.cli import main


@pytest.mark.parametrize("kind,expected", [
    ("methods", {"base", "fedavg", "fedmd", "fccl_plus"}),
    ("models", {"lenet", "simple_cnn", "resnet10", "resnet12"}),
    ("scenarios", {"rotmnist"}),
    ("public", {"photo_patches"}),
    ("datasets", {"mnist5k", "uci_digits", "photo_patches"}),
    ("structures", {"demo_mixed", "homo_lenet"}),
])
def test_list(capsys, kind, expected):
    assert main(["list", kind]) == 0
    names = capsys.readouterr().out.split()
    assert expected <= set(names)
    assert names == sorted(names)


def test_bad_name_is_one_line_error(capsys, tmp_path):
    code = main(["partition", "rotmnst", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "unknown scenario 'rotmnst'" in err and "rotmnist" in err
    assert not (tmp_path / "x").exists()


def test_validate_reports_mistyped_grid_key(tmp_path, capsys):
    (tmp_path / "e.yaml").write_text("grid:\n  - scenarios: [rotmnist]\n    methods: [base]\n    structures: [homo_lenet]\n    seed: [0]\n")
    code = main(["validate", "--experiments", str(tmp_path / "e.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "grid.0" in err and "'seed' was unexpected" in err


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "fedshift.cli", "list", "methods"], capture_output=True, text=True)
    assert out.returncode == 0 and "fccl_plus" in out.stdout


def test_version(capsys):
    from importlib import metadata

    from fedshift import __version__

    assert metadata.version("fedshift") == __version__  # pyproject.toml and the package agree

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedshift {__version__}"


def test_every_positional_has_help():
    """Issue 22 point 10: `fedshift SUB -h` explains each positional, not just names it."""
    import argparse

    import fedshift.cli as cli

    captured = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self, *a, **k):
        captured["parser"] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab
    try:
        with pytest.raises(SystemExit):
            cli.main(["list", "methods"])
    finally:
        argparse.ArgumentParser.parse_args = real
    subs = next(a for a in captured["parser"]._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {act.dest}" for name, sp in subs.choices.items() for act in sp._actions
               if not act.option_strings and not act.help]
    assert subs.choices and not missing, f"positionals without help: {missing}"
