"""FCCL (CVPR 2022) Table 3 (issue 34 item 4): the real grid params/papers/fccl_table3.yaml plans
the table's eight rows under the authors' protocol, and its offline twin's plan maps onto the
published table as a labelled proxy. Planning only: no training here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from fedshift.cli import main
from fedshift.cli.grid import _data_not_built
from fedshift.experiments import load_experiments, snakemake_config
from fedshift.report.published import PublishedSpec, check_printed, load_published
from fedshift.report.verdicts import compare

REAL = "params/papers/fccl_table3.yaml"
OFFLINE = "params/papers/fccl_table3_offline.yaml"
ROWS = {"base", "fedavg", "fedmd", "fml", "rcfl", "feddf", "fedmatch", "fccl"}  # CVPR Table 3, top to bottom


def _plan(grid: str, build: str = "build"):
    exp = snakemake_config([Path(grid)])  # what `snakemake --configfile <grid>` runs
    data = Path(exp.pop("data_params", None) or "params/data.yaml")
    return exp, data, load_experiments(exp, data, build=build)


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_the_published_table_names_what_the_grid_runs(in_repo):
    exp, _, plan = _plan(REAL)
    pub = load_published("fccl_table3")
    assert set(pub["method"]) == ROWS == {j.method for j in plan.federate}
    assert set(pub["scenario"]) == {"office_home"} == {j.scenario for j in plan.federate}
    assert set(pub["participant"]) - {"avg"} == set(next(iter(plan.federate.values()))["participants"])
    assert exp["report"]["published"] == ["fccl_table3"]
    # the added AVG rows are the exact mean of the printed cells, and say they were not printed
    avg = pub[pub["participant"] == "avg"]
    assert len(avg) == 2 * len(ROWS) and avg["note"].str.startswith("not printed").all()
    assert (check_printed(pub) == "").all()


def test_real_grid_plans_the_authors_protocol(in_repo):
    _, data, plan = _plan(REAL)
    assert data == Path("params/papers/fccl_cvpr_data.yaml")  # the grid names its own data file (issue 47)
    assert len(plan.federate) == 24 and len(plan.needed_pretrain()) == 12  # 8 rows x 3 seeds; 4 SOLO x 3
    for job, cfg in plan.federate.items():
        assert (job.public, job.structure) == ("cifar100", "homo_resnet18") and job.seed in (0, 1, 2)
        assert cfg["archs"] == ["resnet18"] * 4
        e = cfg["engine"]
        # CVPR § 4.1 and fccl/Idea/params.py: 40 rounds, Adam 1e-3 / batch 512 in both phases,
        # 2 public passes, one local count for all (the code's [10, 6, 6, 6]), no decay, no wd
        assert (e["rounds"], e["local_epochs"], e["public_epochs"]) == (40, 6, 2)
        assert (e["optimizer"], e["lr"], e["public_lr"], e["weight_decay"], e["lr_decay"]) == ("adam", 1e-3, 1e-3, 0.0,
                                                                                           False)
        assert (e["local_batch"], e["public_batch"], e["public_aug"]) == (512, 512, "weak_code")
    by_method = {j.method: c["method_params"] for j, c in plan.federate.items()}
    scoring = {(c["scoring"]["eval_models"], c["scoring"]["weighting"]) for c in plan.federate.values()}
    assert scoring == {("local", "uniform")}  # the table's protocol, every row alike
    for m in ROWS - {"base", "fedavg"}:  # averaging between collaborative and local updating (§ 4.1)
        assert by_method[m]["homogeneous_averaging"] == "auto", m
    assert by_method["fccl"]["init"] == "base"  # FCCL starts from SOLO (§ 4.1)
    pre = next(iter(plan.needed_pretrain().values()))["pretrain"]
    assert (pre["epochs"], pre["batch"], pre["lr"], pre["weight_decay"]) == (50, 256, 1e-3, 0.0)


def test_data_not_built_is_one_line_naming_what_is_missing(in_repo, tmp_path):
    _, data, plan = _plan(REAL, build=str(tmp_path / "build"))
    line = _data_not_built(plan, data)
    assert line is not None and "\n" not in line
    assert f"{tmp_path}/build/partitions/office_home" in line and f"{tmp_path}/build/public/cifar100" in line
    assert "office_home under data/" in line and "params/papers/fccl_cvpr_data.yaml" in line
    for f in ("partitions/office_home", "public/cifar100"):
        (tmp_path / "build" / f).mkdir(parents=True)
        (tmp_path / "build" / f / "manifest.json").write_text("{}")
    assert _data_not_built(plan, data) is None


def test_validate_prints_the_data_line_on_stderr_only(in_repo, capsys):
    _, data, plan = _plan(REAL)
    assert main(["validate", "--experiments", REAL]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("ok: 12 pretrain and 24 federate jobs\n")
    expected = _data_not_built(plan, data)  # this checkout may or may not have Office-Home built
    assert out.err.strip() == (expected or "")


def test_offline_twin_runs_the_same_rows_and_maps_onto_the_published_table(in_repo):
    exp, data, plan = _plan(OFFLINE)
    assert data == Path("params/data.yaml")  # shipped data only
    assert {j.method for j in plan.federate} == ROWS and len(plan.federate) == 8
    assert {(j.scenario, j.public, j.structure) for j in plan.federate} == {("digits_offline", "photo_patches",
                                                                              "homo_lenet")}
    assert all(c["engine"]["rounds"] <= 3 for c in plan.federate.values())
    report = exp["report"]
    assert report["published"] == ["fccl_table3"]
    assert report["published_scenarios"]["digits_offline"] == "office_home"
    # what the report would compare: every planned group's AVG cells (SOLO = base_pretrain) against Table 3
    rows = [dict(scenario=j.scenario, public=j.public, structure=j.structure, method=m, participant="avg",
                 metric=k, mean=50.0, ci=float("nan"), n=1, reached=1)
            for j in plan.federate for m in ({"base_pretrain", "base"} if j.method == "base" else {j.method})
            for k in ("inter/top5", "intra/top5")]
    cells = compare(pd.DataFrame(rows), load_published("fccl_table3"), report["published_scenarios"],
                        PublishedSpec("fccl_table3"))
    matched = cells[cells["published"].notna()]
    assert set(matched["method"]) == ROWS and len(matched) == 2 * len(ROWS)
    assert matched["proxy"].all() and (matched["scenario"] == "office_home").all()
    assert matched["verdict"].str.startswith("no verdict").all()  # a proxy never gives a verdict
    assert matched.set_index("method").loc["base", "ours_method"].eq("base_pretrain").all()
