"""Issue 22 point 8: one progress line per finished round on stderr (the rules tee stderr
to Snakemake's terminal), naming the resolved device; a CUDA request that runs on the CPU
says so."""

import subprocess

import pytest
import torch

from fedshift import runner


def test_progress_line_on_stderr_with_device(capsys):
    prog = runner.Progress("federate/x", 3, "cpu")
    prog(1, "inter top1 0.5")
    prog(2, "inter top1 0.6")
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert lines[0] == "[federate/x] starting 3 steps on cpu"
    assert lines[1].startswith("[federate/x] 1/3 inter top1 0.5 |") and lines[1].endswith(" on cpu")
    assert lines[2].startswith("[federate/x] 2/3 ")


@pytest.mark.parametrize("requested, env, fell_back", [
    ("cpu", {}, False),
    ("auto", {}, False),                              # no GPU asked for: CPU is what was meant
    ("auto", {"SLURM_JOB_GPUS": "0"}, True),          # the scheduler gave a GPU, torch sees none
    ("auto", {"CUDA_VISIBLE_DEVICES": "0"}, True),
    ("auto", {"CUDA_VISIBLE_DEVICES": "-1"}, False),
    ("cuda", {}, True),
])
def test_device_note_names_cpu_fallback(monkeypatch, requested, env, fell_back):
    for key in ("SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    note = runner.device_note(requested, torch.device("cpu"))
    assert note.startswith("cpu")
    assert ("FELL BACK" in note) is fell_back
    if fell_back:
        assert repr(requested) in note
    assert runner.device_note("auto", torch.device("cuda", 0)) == "cuda:0"


@pytest.mark.parametrize("rule", ["federate", "pretrain"])
def test_rule_shows_stderr_and_keeps_log(tmp_path, rule):
    """The rule's shell line (as Snakemake runs it, under bash) puts stdout in the log only and
    stderr in both the log and the terminal."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "workflow" / "rules" / f"{rule}.smk").read_text()
    line = re.search(r'^\s*"(: > \{log\}; (?:exec )?fedshift ' + rule + r' .*)"\s*$', text, re.M).group(1)
    log = tmp_path / "job.log"
    fake = "echo INFO-line; echo '[job] 1/2 ... on cpu' >&2"
    cmd = line.replace("{log}", str(log))
    cmd = re.sub(r"(?:exec )?fedshift " + rule + r" [^>]*>>", "{ " + fake + "; } >>", cmd)
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert res.stderr.strip() == "[job] 1/2 ... on cpu"
    import time
    for _ in range(50):  # tee of the process substitution may finish a moment after bash
        if "[job]" in log.read_text():
            break
        time.sleep(0.05)
    assert log.read_text().splitlines() == ["INFO-line", "[job] 1/2 ... on cpu"]
