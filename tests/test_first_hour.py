"""A researcher's first hour (issue 39 point 7): the CLI explains itself without a manual."""

from __future__ import annotations

import warnings

import pytest

from fedshift.cli import main


def test_list_alone_prints_the_kinds(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out.split()
    assert {"datasets", "methods", "models", "public", "scenarios", "structures"} <= set(out)


def test_list_methods_long_says_what_each_needs_and_what_it_is(capsys):
    assert main(["list", "methods", "--long"]) == 0
    lines = dict(line.split("\t", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["fedmd"].startswith("needs: public set\tFedMD:")
    assert lines["fccl"].startswith("needs: public set, BASE checkpoints (pretrain)\t")  # init: base by default
    assert lines["fedavg"].startswith("needs: a homo_<model> structure\tFedAvg:")
    assert lines["base"].startswith("needs: private data only\tSOLO/BASE")
    assert lines["scaffold"].startswith("needs: engine.optimizer: sgd, engine.momentum: 0, a homo_<model> structure\t")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["ui-url", "--help"], ["list", "--help"]])
def test_help_has_no_rst_backticks(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    out = capsys.readouterr().out
    assert out and "`" not in out


def test_gradient_layout_warning_is_silenced_under_channels_last():
    from fedshift.engine.federation import quiet_layout_warning

    msg = "grad and param do not obey the gradient layout contract. This is not an error, but may impair performance."
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_layout_warning()
        warnings.warn(msg, UserWarning)
        warnings.warn("another warning", UserWarning)
    assert [str(w.message) for w in seen] == ["another warning"]
