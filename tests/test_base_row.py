"""The report's base_pretrain row: the papers' SOLO/BASE (pretrain runs, final epoch) beside the
federated `base` method."""

from __future__ import annotations

import pandas as pd
import yaml

from fedshift.report.collect import PRETRAIN_METHOD, collect
from fedshift.report.report import make_report

PARTS, ARCHS = ["m0", "m20"], ["lenet", "simple_cnn"]


def _rows(rounds, participants, value):
    out = []
    for r in rounds:
        for p in participants:
            for d in PARTS:
                out.append({"round": r, "participant": p, "arch": "a", "domain": d,
                            "kind": "intra" if d == p else "inter", "top1": value(r, p, d), "top5": 1.0})
    return pd.DataFrame(out)


def _run(folder, cfg, df):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    df.to_csv(folder / "rounds.csv", index=False)
    return folder


def test_pretrain_runs_become_the_base_pretrain_row(tmp_path):
    fed = _run(tmp_path / "fed", {"scenario": "rotmnist", "public": "photo_patches", "method": "base",
                                  "base_method": "base", "structure": "demo", "seed": 0, "participants": PARTS,
                                  "archs": ARCHS}, _rows(range(4), PARTS, lambda r, p, d: 0.1 * r))
    pre = [_run(tmp_path / p, {"scenario": "rotmnist", "participant": p, "arch": a, "seed": 0},
                _rows([2, 4], [p], lambda r, p_, d: 0.5 if r == 4 else 0.0))
           for p, a in zip(PARTS, ARCHS)]
    df = collect([fed], tmp_path / "runs.csv", pre)
    solo = df[df["method"] == PRETRAIN_METHOD]
    assert sorted(solo["participant"].unique()) == PARTS
    assert set(solo["round"]) == {3}  # placed at the federated runs' last round, final epoch only
    assert (solo["top1"] == 0.5).all()
    assert (solo["structure"] == "demo").all() and (solo["public"] == "photo_patches").all()
    written = make_report(tmp_path / "runs.csv", tmp_path / "report", tracking=False)
    md = (tmp_path / "report/report.md").read_text()
    assert "| base_pretrain | 50.00" in md and "`base_pretrain` is the papers' SOLO/BASE row" in md
    assert "| **" not in md  # the best mean of one seed is not separated: no bold (issue 50)
    assert any(p.suffix == ".png" for p in written)


def test_missing_pretrain_runs_add_no_row(tmp_path):
    fed = _run(tmp_path / "fed", {"scenario": "rotmnist", "public": "none", "method": "base", "base_method": "base",
                                  "structure": "demo", "seed": 0, "participants": PARTS, "archs": ARCHS},
               _rows(range(2), PARTS, lambda r, p, d: 0.2))
    pre = [_run(tmp_path / "m0", {"scenario": "rotmnist", "participant": "m0", "arch": "lenet", "seed": 0},
                _rows([1], ["m0"], lambda *a: 0.5))]
    df = collect([fed], tmp_path / "runs.csv", pre)
    assert PRETRAIN_METHOD not in set(df["method"])  # m20's run is missing: no partial BASE row
