"""The committed run archive (issue 52, fedshift.archive): where a run's record lives, what it holds,
when it is current or stale against what the grid asks now, what the workflow then plans, and the docs'
generated blocks rendered from records. Fast: plans of the tiny grid and hand-made run folders (the real
run -> archive -> report-from-records cycle is tests/test_workflow.py's archive test)."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scipy import stats

from fedshift import archive
from fedshift.archive import docs
from fedshift.errors import ConfigError
from fedshift.experiments import dump_config, load_experiments
from fedshift.provenance import run_identity
from fedshift.report.collect import load_run
from fedshift.tune import plan_tune
from helpers import tiny_data_params, tiny_grid


def _plan(grid=None):
    grid = copy.deepcopy(grid or tiny_grid())  # planning a tune block writes into the grid's report block
    plan = load_experiments(grid, tiny_data_params())
    return plan, plan_tune(grid, plan)


def _plan_file(grid, overrides=()):
    """Grid file ``grid`` planned as ``fedshift run | archive`` plan it: its merged config with ``overrides``
    applied, on its own data_params file (run from the folder that holds them)."""
    from fedshift.experiments import plan_grid, snakemake_config
    from fedshift.overrides import apply_overrides

    return plan_grid(apply_overrides(snakemake_config([Path(grid)]), list(overrides)))[0]


def _fake_run(folder: Path, cfg: dict, intra: float = 0.5, inter: float = 0.3, rounds: int = 3, inputs=None) -> Path:
    """A finished run folder: the config it trained with, metrics.json, rounds.csv (every participant at
    ``intra`` on its own domain and ``inter`` on the others), a models.pt that must never be archived."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(dump_config(cfg))
    (folder / "metrics.json").write_text(json.dumps({"headline": {}}))
    parts = cfg.get("participants") or [cfg.get("participant")]
    rows = []
    for r in range(rounds + 1):
        for p in parts:
            for d in parts:
                rows.append({"round": r, "participant": p, "arch": "lenet", "domain": d,
                             "kind": "intra" if d == p else "inter", "top1": intra if d == p else inter, "top5": 1.0})
    pd.DataFrame(rows).to_csv(folder / "rounds.csv", index=False)
    (folder / "models.pt").write_bytes(b"weights")
    if inputs is not None:
        (folder / "inputs.json").write_text(json.dumps(inputs))
    return folder


# ----------------------------------------------------------------------------- identity and record paths
def test_run_identity_ignores_paths_and_execution_keys_only():
    plan, _ = _plan()
    cfg = next(iter(plan.federate.values()))
    ident = run_identity(cfg)
    assert len(ident) == 12 and int(ident, 16) >= 0
    moved = {**cfg, "paths": {"partition": "elsewhere"}, "engine": {**cfg["engine"], "threads": 7, "device": "cuda",
                                                                      "checkpoint_min_s": 1.0, "checkpoint_every": 5}}
    assert run_identity(moved) == ident
    assert run_identity({**cfg, "engine": {**cfg["engine"], "lr": cfg["engine"]["lr"] * 2}}) != ident


def test_record_path_keys_on_the_grid_and_the_job():
    plan, _ = _plan()
    job = next(j for j in plan.federate if j.method == "fedavg")
    assert archive.record_path("federate", job, None, Path("records")) == Path(
        "records/main/federate/rotmnist/photo_patches/fedavg/homo_lenet/seed0")
    assert archive.record_path("federate", job.path, "fedh2l_table2") == Path(
        "records/fedh2l_table2/federate") / job.path
    assert archive.group_of_chosen_file("results/tune/s/p/fedavg/homo_lenet/chosen.yaml") == "s/p/fedavg/homo_lenet"
    with pytest.raises(ValueError):
        archive.record_path("weights", job, None)


# ----------------------------------------------------------------------------- comparing an archived config
def test_config_diff_compares_shared_keys_and_fills_new_keys_with_code_defaults():
    plan, _ = _plan()
    cfg = next(c for j, c in plan.federate.items() if j.method == "fedmd")
    assert archive.config_diff(cfg, cfg) == []
    # execution-only keys and the run's label differ without making the record stale
    run = {**cfg, "run_name": "other", "paths": {}, "engine": {**cfg["engine"], "threads": 9, "device": "cuda:1"}}
    assert archive.config_diff(run, cfg) == []
    # a key both know, with another value
    changed = {**cfg, "method_params": {**cfg["method_params"], "digest_epochs": 2}}
    assert archive.config_diff(cfg, changed) == [("method_params.digest_epochs", 1, 2)]
    # an engine lever added after the record was made: equal at its code default, a difference otherwise
    old = {**cfg, "engine": {k: v for k, v in cfg["engine"].items() if k != "malloc_trim"}}
    assert cfg["engine"]["malloc_trim"] is False  # EngineConfig's default
    assert archive.config_diff(old, cfg) == []
    assert archive.config_diff(old, {**cfg, "engine": {**cfg["engine"], "malloc_trim": True}}) == [
        ("engine.malloc_trim", "absent", True)]
    # a method parameter added later: the method's default (its per-scenario default where it has one)
    older = {**cfg, "method_params": {k: v for k, v in cfg["method_params"].items() if k != "transfer_epochs"}}
    assert archive.config_diff(older, cfg) == []
    # keys only the archived config knows (a key since removed) are not compared
    assert archive.config_diff({**cfg, "gone": 1}, cfg) == []
    # a top-level key of the COORD contract: test_protocol absent = clean
    assert archive.config_diff(cfg, {**cfg, "test_protocol": "clean"}) == []
    assert archive.config_diff(cfg, {**cfg, "test_protocol": "authors"}) == [("test_protocol", "absent", "authors")]
    # a top-level key the code names no default for
    assert archive.config_diff(cfg, {**cfg, "new_key": 0}) == [("new_key", "absent", 0)]
    line = archive.describe_diff([("engine.rounds", 3, 5), ("engine.lr", 0.001, 0.01)])
    assert line == "engine.rounds 3 archived, 5 now; engine.lr 0.001 archived, 0.01 now"


# ----------------------------------------------------------------------------- writing a record
def test_write_record_copies_no_weights_compresses_long_curves_and_is_idempotent(tmp_path, monkeypatch):
    plan, _ = _plan()
    cfg = next(iter(plan.federate.values()))
    run = _fake_run(tmp_path / "run", cfg, inputs={"inputs": {}, "paths": {}, "code": {"files_sha256": "ab" * 32,
                                                                                      "commit": "c0ffee" * 6}})
    monkeypatch.setattr(archive, "GZIP_ABOVE", 100)  # this run's rounds.csv is longer than 100 bytes
    dest = tmp_path / "records/main/federate/x"
    assert archive.write_record(run, dest, cfg) is True
    assert sorted(p.name for p in dest.iterdir()) == ["config.yaml", "inputs.json", "metrics.json", "record.json",
                                                      "rounds.csv.gz"]
    with gzip.open(dest / "rounds.csv.gz", "rt") as f:
        assert f.read() == (run / "rounds.csv").read_text()
    rec = json.loads((dest / "record.json").read_text())
    assert rec["identity"] == run_identity(cfg) and rec["run_folder"] == str(run)
    first = (dest / "rounds.csv.gz").read_bytes()
    assert archive.write_record(run, dest, cfg) is False  # the same record: nothing written
    assert (dest / "rounds.csv.gz").read_bytes() == first  # gzip without a time stamp: the same bytes
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    # collect reads the record as a run folder, and says where it came from and with which code
    df = load_run(dest)
    pd.testing.assert_frame_equal(df[["round", "participant", "top1"]],
                                  pd.read_csv(run / "rounds.csv")[["round", "participant", "top1"]])
    assert set(df["record"]) == {str(dest)} and set(df["code"]) == {"code abababababab (commit c0ffeec0)"}
    assert set(load_run(run)["record"]) == {""}


# ----------------------------------------------------------------------------- current, stale, absent
def _archive_all(plan, root: Path, change=None):
    for (kind, jobs) in (("federate", plan.federate), ("pretrain", plan.pretrain)):
        for job, cfg in jobs.items():
            cfg = change(job, cfg) if change else cfg
            _fake_run(archive.record_path(kind, job, plan.report.get("name"), root), cfg)
            (archive.record_path(kind, job, plan.report.get("name"), root) / archive.RECORD).write_text("{}")


def test_grid_status_and_targets_leave_out_current_records_and_list_stale_ones(tmp_path):
    plan, tune = _plan()
    root = tmp_path / "records"
    status = archive.grid_status(plan, tune, root, base=tmp_path)
    assert {s.state for s in status.runs.values()} == {"absent"}
    t = archive.plan_targets(plan, tune, status)
    assert len(t.federate) == len(plan.federate) and not t.archived_federate

    def fewer_rounds(job, cfg):
        return {**cfg, "engine": {**cfg["engine"], "rounds": 2}} if getattr(job, "method", "") == "fccl_plus" else cfg

    _archive_all(plan, root, fewer_rounds)
    status = archive.grid_status(plan, tune, root, base=tmp_path)
    stale = status.stale()
    assert [s.job.method for s in stale] == ["fccl_plus"]
    assert stale[0].why == "engine.rounds 2 archived, 3 now"
    assert stale[0].line().endswith("fccl_plus/homo_lenet/seed0: stale (engine.rounds 2 archived, 3 now)")
    t = archive.plan_targets(plan, tune, status)
    assert [j.method for j in t.federate] == ["fccl_plus"]
    # fccl_plus starts from the BASE checkpoints: its pretrain runs are planned although their records are current
    assert sorted(j.participant for j in t.pretrain) == sorted(plan.federate[t.federate[0]]["participants"])
    assert len(t.archived_federate) == len(plan.federate) - 1 and not t.archived_pretrain
    js = status.as_json()
    assert [r["state"] for r in js["records"] if r["run"].startswith("rotmnist/photo_patches/fccl_plus")] == ["stale"]


def test_record_with_other_data_is_stale_and_unbuilt_data_is_not_checked(tmp_path):
    plan, tune = _plan()
    job, cfg = next((j, c) for j, c in plan.federate.items() if j.method == "fedavg")
    manifest = tmp_path / "build/partitions/rotmnist/manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("v1")
    import hashlib

    old = hashlib.sha256(b"v1").hexdigest()
    folder = _fake_run(tmp_path / "rec", cfg, inputs={"inputs": {"partition": old, "public": "0" * 64},
                                                      "paths": {"partition": "build/partitions/rotmnist/manifest.json",
                                                                "public": "build/public/none/manifest.json"}})
    s = archive.record_state("federate", job, cfg, folder, base=tmp_path)
    assert s.state == "current" and s.unbuilt == 1  # the public set is not built here: not checked
    manifest.write_text("v2")
    s = archive.record_state("federate", job, cfg, folder, base=tmp_path)
    assert s.state == "stale" and s.why == (f"input partition (build/partitions/rotmnist/manifest.json) sha256 "
                                            f"{old[:12]} archived, {hashlib.sha256(b'v2').hexdigest()[:12]} now")


def test_tuned_record_is_current_with_its_archived_selection_and_stale_when_the_search_changes(tmp_path):
    grid = tiny_grid(tune={"budget": {"rounds": 2, "seeds": [100]}, "methods": {"fedavg": {"engine.lr": [0.001, 0.01]}}})
    plan, tune = _plan(grid)
    job, cfg = next((j, c) for j, c in plan.federate.items() if j.method == "fedavg")
    group = archive.group_of_chosen_file(cfg["tuned"]["file"])
    chosen = {"scenario": job.scenario, "public": job.public, "method": "fedavg", "structure": job.structure,
              "metric": tune.metric, "rounds": 2, "patience": 0, "seeds": [100], "chosen": {"engine.lr": 0.01},
              "score": 0.5, "candidate": "c1", "candidates": [
                  {"id": "c0", "values": {"engine.lr": 0.001}, "per_seed": {100: 0.4}, "status": "ok", "score": 0.4},
                  {"id": "c1", "values": {"engine.lr": 0.01}, "per_seed": {100: 0.5}, "status": "ok", "score": 0.5}]}
    root = tmp_path / "records"
    path = archive.tune_record_path(group, None, root)
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(chosen))
    ran = archive.wanted_config(cfg, chosen)  # what the seeded run trained with
    assert ran["engine"]["lr"] == 0.01 and ran["tuned"]["chosen"] == {"engine.lr": 0.01}
    _fake_run(archive.record_path("federate", job, None, root), ran)
    status = archive.grid_status(plan, tune, root, base=tmp_path)
    assert status.runs[("federate", job)].state == "current" and status.tune[group] == "current"
    t = archive.plan_targets(plan, tune, status)
    assert t.chosen_files[group] == str(path) and group not in t.tune_groups  # the table reads the record
    # a third candidate in the grid: the selection is stale, and so is the run trained on it
    grid["tune"]["methods"]["fedavg"]["engine.lr"].append(0.1)
    plan, tune = _plan(grid)
    status = archive.grid_status(plan, tune, root, base=tmp_path)
    assert status.tune[group].startswith("stale: candidates 2 archived, 3 now")
    s = status.runs[("federate", job)]
    assert s.state == "stale" and s.why.startswith("its tuning record stale: candidates 2 archived, 3 now")
    t = archive.plan_targets(plan, tune, status)
    assert group in t.tune_groups and t.chosen_files[group] == tune.chosen_file(next(iter(tune.groups)))


def test_archive_grid_skips_unfinished_and_other_settings_with_a_line_each(tmp_path):
    plan, tune = _plan()
    results, root = tmp_path / "results", tmp_path / "records"
    jobs = list(plan.federate.items())
    (done_job, done_cfg), (other_job, other_cfg), (part_job, _) = jobs[0], jobs[1], jobs[2]
    _fake_run(results / "federate" / plan.folder(done_job), done_cfg)  # <slot>-<identity> (issue 50)
    _fake_run(results / "federate" / plan.folder(other_job), {**other_cfg, "engine": {**other_cfg["engine"], "rounds": 500}})
    (results / "federate" / f"{plan.folder(part_job)}.partial").mkdir(parents=True)
    out = io.StringIO()
    counts = archive.archive_grid(plan, tune, root, str(results), out=out)
    lines = out.getvalue().splitlines()
    assert counts == {"archived": 1, "unchanged": 0, "skipped": len(plan.federate) + len(plan.pretrain) - 1}
    assert f"archived federate/{done_job.path} -> {archive.record_path('federate', done_job, None, root)}" in lines
    assert (f"skipped federate/{other_job.path}: ran with other settings than the grid asks (engine.rounds 500 "
            "archived, 3 now)") in lines
    assert any(line.startswith(f"skipped federate/{part_job.path}: not finished (no metrics.json; a checkpoint waits")
               for line in lines)
    assert not (archive.record_path("federate", done_job, None, root) / "models.pt").exists()


# ----------------------------------------------------------------------------- the docs' generated blocks
def _grid_file(tmp_path, name: str) -> str:
    grid = tiny_grid(methods=["fedavg"], report={"name": name, "title": name})
    grid["grid"][0]["seeds"] = [0, 1, 2]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(grid))
    (tmp_path / "params").mkdir(exist_ok=True)
    (tmp_path / "params/data.yaml").write_text(yaml.safe_dump(tiny_data_params()))
    return str(path)


def test_generated_table_renders_records_and_the_check_catches_a_hand_edit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = _grid_file(tmp_path, "docgrid")
    rec = docs.grid_records(grid)
    assert len(rec.missing) == 3 and rec.runs.empty
    exp = yaml.safe_load(Path(grid).read_text())
    plan = _plan_file(grid)
    assert exp["report"]["name"] == plan.report["name"]
    for job, cfg in plan.federate.items():  # seeds 0, 1, 2: intra 50/51/52 %, inter 30/32/34 %
        folder = archive.record_path("federate", job, "docgrid")
        _fake_run(folder, cfg, intra=0.50 + 0.01 * job.seed, inter=0.30 + 0.02 * job.seed,
                  inputs={"inputs": {}, "paths": {}, "code": {"files_sha256": "f" * 64, "commit": "1234abcd" * 5}})
        (folder / archive.RECORD).write_text("{}")
    page = tmp_path / "page.md"
    page.write_text(f"intro\n<!-- generated: table {grid} -->\n| typed | 99.99 |\n<!-- end generated -->\nend\n")
    changed = docs.check_or_write([page], write=False)
    assert changed == [f"{page}: block `table {grid}` differs from its records"]
    assert docs.check_or_write([page]) and not docs.check_or_write([page], write=False)  # written, then current
    text = page.read_text()
    t = stats.t.ppf(0.975, 2)
    inter = f"32.00 ± {t * 2.0 / math.sqrt(3):.2f}"  # sd of 30, 32, 34 = 2
    intra = f"51.00 ± {t * 1.0 / math.sqrt(3):.2f}"
    assert f"| rotmnist | fedavg | {inter} | {intra} | 3 | 1234abcd |" in text
    assert "n < 3" not in text and "paper in brackets" not in text  # n = 3 everywhere, no published file
    assert text.startswith("intro\n") and text.endswith("<!-- end generated -->\nend\n")
    # a number typed over the rendering is caught
    page.write_text(text.replace(intra, "51.10 ± 2.48"))
    assert docs.check_or_write([page], write=False) == [f"{page}: block `table {grid}` differs from its records"]


def test_generated_block_heads_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="first word must be one of table, claims, tuned"):
        docs.render_file("<!-- generated: tabel x.yaml -->\n<!-- end generated -->", "doc.md")
    with pytest.raises(ConfigError, match="names no grid file"):
        docs.render_file("<!-- generated: table ids=a -->\n<!-- end generated -->", "doc.md")
    with pytest.raises(ConfigError, match="grid file nope.yaml not found"):
        docs.render_file("<!-- generated: table nope.yaml -->\n<!-- end generated -->", "doc.md")


@pytest.mark.parametrize("verdict, word", [
    ("held (CI-separated)", "held"), ("NOT held (CI-separated)", "not held"),
    ("held by the means only: inconclusive", "inconclusive (the means hold it; the intervals do not separate it)"),
    ("NOT held by the means only: inconclusive",
     "inconclusive (the means do not hold it; the intervals do not separate it)"),
    ("partly evaluable: 1 of 2", "not evaluable yet (1 of 2 comparisons have records)")])
def test_claim_verdicts_read_as_held_not_held_or_inconclusive(verdict, word):
    assert docs.word(verdict) == word


def test_cli_archive_refuses_a_missing_grid_and_docs_tables_check_fails_on_a_typed_number(tmp_path, monkeypatch,
                                                                                         capsys):
    from fedshift.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["archive", "nope.yaml"]) == 2
    assert capsys.readouterr().err.strip() == ("fedshift: error: fedshift archive: nope.yaml: no such grid file, "
                                               "and not a KEY=VALUE override")
    grid = _grid_file(tmp_path, "cligrid")
    page = tmp_path / "page.md"
    page.write_text(f"<!-- generated: table {grid} -->\n| fedavg | 51.00 |\n<!-- end generated -->\n")
    assert main(["docs-tables", "--check", str(page)]) == 1
    err = capsys.readouterr().err
    assert f"{page}: block `table {grid}` differs from its records" in err
    assert "1 generated block(s) differ from the records" in err
    assert "51.00" in page.read_text()  # --check writes nothing
    assert main(["docs-tables", str(page)]) == 0
    assert "No committed record backs this table yet." in page.read_text()
    assert main(["docs-tables", "--check", str(page)]) == 0


def _pooled_run(folder: Path, cfg: dict, acc: float, inputs=None) -> None:
    """A finished FedH2L-style run: pooled ACC / WDP / CDP rows and validation ACC at rounds 50 and 100
    (and ``inputs`` as its inputs.json)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(dump_config(cfg))
    if inputs is not None:
        (folder / "inputs.json").write_text(json.dumps(inputs))
    (folder / "metrics.json").write_text("{}")
    (folder / archive.RECORD).write_text("{}")
    rows = [{"round": r, "participant": p, "arch": "lenet", "domain": "pooled", "kind": k, "top1": v, "top5": 1.0}
            for r in (50, 100) for p in cfg["participants"]
            for k, v in (("val_acc", 0.5), ("acc", acc), ("wdp", acc), ("cdp", acc))]
    pd.DataFrame(rows).to_csv(folder / "rounds.csv", index=False)


def test_table2_conclusions_render_held_or_not_evaluable_from_records(tmp_path, monkeypatch):
    """Conclusion (3) on records of FedH2L, AGG and IND at every α (ACC 88/89/90, 80/81/82, 67/68/69 % over
    seeds 0-2): held, with the numbers; conclusion (4) has no FedMD record: not evaluable yet."""
    from conftest import REPO

    monkeypatch.chdir(REPO)
    grid = "params/papers/fedh2l_table2.yaml"
    rec = docs.grid_records(grid, tmp_path)
    plan = _plan_file(grid)
    base = {"fedh2l": 0.88, "agg": 0.80, "ind": 0.67}
    for job, cfg in plan.federate.items():
        if job.method in base:
            _pooled_run(archive.record_path("federate", job, "fedh2l_table2", tmp_path), cfg,
                        base[job.method] + 0.01 * job.seed)
    text = "\n".join(docs.render_claims([docs.grid_records(grid, tmp_path)], {"ids": "fedh2l_gt_agg_ind,fedh2l_gt_fedmd"}))
    assert len(rec.missing) == len(plan.federate)
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    for scen in ("rotmnist_a05", "rotmnist_a10", "rotmnist_a15"):
        assert (f"  * `{grid}`, {scen}: **held** — fedh2l 89.00 ± {half:.2f} (n=3) > agg 81.00 ± {half:.2f} (n=3): "
                f"yes (intervals apart); fedh2l 89.00 ± {half:.2f} (n=3) > ind 68.00 ± {half:.2f} (n=3): "
                f"yes (intervals apart)") in text
    assert f"  * `{grid}`: not evaluable yet: no record of fedmd at rotmnist_a05, rotmnist_a10, rotmnist_a15" in text
    assert "What the intervals cover: every seed trained and was evaluated on one data draw" in text


def test_a_reading_takes_the_rows_it_shares_from_the_other_grid_only_where_the_records_match(tmp_path, monkeypatch):
    """The private+seed grid runs FedH2L and IND only; with ``shared=agg,...`` its conclusion (3) compares
    them with the paper grid's AGG records, per scenario, only where both grids' records read the same
    partitions: at α = 15 % this test gives AGG another partition hash, so there AGG is not taken and the
    line says so instead of "not evaluable yet". A shared method no grid of the block runs is refused."""
    from conftest import REPO

    monkeypatch.chdir(REPO)
    paper, reading = "params/papers/fedh2l_table2.yaml", "params/papers/fedh2l_table2_seedlocal.yaml"

    def inputs(scen, digest="a"):  # a path not built here: the status does not check it, the claims block does
        return {"inputs": {f"partition/{scen}": digest * 64},
                "paths": {f"partition/{scen}": f"build/not-built-{digest}/{scen}/manifest.json"}}

    for grid, name, base in ((paper, "fedh2l_table2", {"agg": 0.80}),
                             (reading, "fedh2l_table2_seedlocal", {"fedh2l_seedlocal": 0.88, "ind_seedlocal": 0.67})):
        for job, cfg in _plan_file(grid).federate.items():
            if job.method in base:
                other = job.method == "agg" and job.scenario == "rotmnist_a15"
                _pooled_run(archive.record_path("federate", job, name, tmp_path), cfg, base[job.method] + 0.01 * job.seed,
                            inputs(job.scenario, "b" if other else "a"))
    recs = [docs.grid_records(paper, tmp_path), docs.grid_records(reading, tmp_path)]
    text = "\n".join(docs.render_claims(recs, {"ids": "fedh2l_gt_agg_ind,fedh2l_gt_fedmd",
                                               "shared": "agg,fedmd,fedavg,fedprox"}))
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    for scen in ("rotmnist_a05", "rotmnist_a10"):
        assert (f"  * `{reading}`, {scen}: **held** — fedh2l 89.00 ± {half:.2f} (n=3) > agg 81.00 ± {half:.2f} "
                f"(n=3): yes (intervals apart); fedh2l 89.00 ± {half:.2f} (n=3) > ind 68.00 ± {half:.2f} (n=3): "
                "yes (intervals apart)") in text
    assert f"  * `{reading}`, rotmnist_a15: **not evaluated as a whole: agg not shared here (below)** — " in text
    assert (f"`{reading}` does not run agg, fedmd, fedavg, fedprox: their rows are those of `{paper}` at "
            "rotmnist_a05, rotmnist_a10") not in text  # fedmd has no record: only agg was taken
    assert f"`{reading}` does not run agg: its rows are those of `{paper}` at rotmnist_a05, rotmnist_a10 " in text
    assert f"`{reading}` does not take agg's rows from `{paper}` at rotmnist_a15 (differs in partitions" in text
    # FedMD is shared but has no record yet: a sitting can change that, so "not evaluable yet"
    assert f"  * `{reading}`: not evaluable yet: no record of fedmd at rotmnist_a05, rotmnist_a10, rotmnist_a15" in text
    without = "\n".join(docs.render_claims(recs, {"ids": "fedh2l_gt_fedmd"}))
    assert f"  * `{reading}`: not evaluated: the grid does not run fedmd" in without
    with pytest.raises(ConfigError, match="shared=agg,moon: no grid of the block runs 'moon'"):
        docs.render_claims(recs, {"ids": "fedh2l_gt_agg_ind", "shared": "agg,moon"})


def test_report_lists_records_with_their_code_and_the_stale_ones_left_out(tmp_path):
    from fedshift.provenance import code_version
    from fedshift.report.records import records_section

    here = str(code_version()["files_sha256"])[:12]
    runs = pd.DataFrame([
        {"scenario": "s", "public": "p", "method": "fedavg", "structure": "homo", "seed": 0, "round": 1,
         "record": "records/g/federate/s/p/fedavg/homo/seed0", "code": "code 0123456789ab (commit deadbeef)"},
        {"scenario": "s", "public": "p", "method": "fedmd", "structure": "homo", "seed": 0, "round": 1,
         "record": "", "code": f"code {here} (commit cafe0000)"}])
    status = tmp_path / "archive.json"
    status.write_text(json.dumps({"grid": "g", "records": [
        {"kind": "federate", "run": "s/p/fedmd/homo/seed0", "record": "records/g/federate/s/p/fedmd/homo/seed0",
         "state": "stale", "why": "engine.rounds 3 archived, 5 now", "unbuilt_inputs": 0}]}))
    md = "\n".join(records_section({"archive": str(status)}, runs))
    assert "1 of 2 federated runs were read from committed records" in md
    assert ("| s/p/fedavg/homo/seed0 | `records/g/federate/s/p/fedavg/homo/seed0` | code 0123456789ab (commit "
            "deadbeef) — *other code* |") in md
    assert "**Stale records, left out** (1)" in md
    assert "| federate/s/p/fedmd/homo/seed0 | `records/g/federate/s/p/fedmd/homo/seed0` | engine.rounds 3 archived, 5 now |" in md
    assert records_section({}, runs.assign(record="")) == []  # no archive, no record: no section


def test_table2_pieces_plan_the_full_grids_own_runs(monkeypatch):
    """docs/fedh2l.md's pieces (a seed per sitting, or one method's rows) plan exactly runs of the full Table II
    grid with its configs, so `fedshift archive params/papers/fedh2l_table2.yaml` takes each piece's runs as
    the full grid's and the final report reads them all."""
    from conftest import REPO

    monkeypatch.chdir(REPO)

    def plan(overrides=()):
        return _plan_file("params/papers/fedh2l_table2.yaml", overrides).federate

    full = plan()
    assert len(full) == 57  # 3 alphas x (FedH2L, AGG, IND, FedMD, FedAvg, FedProx) x 3 seeds + async x 3 seeds
    seed1 = plan(["grid.0.seeds=[1]", "grid.1.seeds=[1]", "grid.2.seeds=[1]"])
    fedmd = plan(["grid=[{name: fedmd, scenarios: [rotmnist_a05, rotmnist_a10, rotmnist_a15], methods: [fedmd], "
                  "structures: [homo_lenet], seeds: [0, 1, 2]}]"])
    assert len(seed1) == 19 and {j.seed for j in seed1} == {1} and len(fedmd) == 9
    for piece in (seed1, fedmd):
        for job, cfg in piece.items():
            assert archive.config_diff(cfg, full[job]) == [], job


def test_a_one_method_piece_of_the_private_seed_grid_plans_its_full_grids_runs(monkeypatch):
    """docs/fedh2l.md: the private+seed grid maps both its methods in report.published_methods, so a piece of
    one method is refused by name; with 'report.published_methods={}' it plans runs whose configs are the full
    grid's (the same records, the same identities)."""
    from conftest import REPO

    monkeypatch.chdir(REPO)

    def plan(overrides=()):
        return _plan_file("params/papers/fedh2l_table2_seedlocal.yaml", overrides).federate

    full = plan()
    piece = ["grid=[{name: table2_seedlocal, scenarios: [rotmnist_a05, rotmnist_a10, rotmnist_a15], "
             "methods: [ind_seedlocal], structures: [homo_lenet], seeds: [0, 1, 2]}]"]
    with pytest.raises(ConfigError, match=r"report.published_methods: \['fedh2l_seedlocal'\] not run by the grid"):
        plan(piece)
    ind = plan(piece + ["report.published_methods={}"])
    assert len(full) == 18 and len(ind) == 9 and {j.method for j in ind} == {"ind_seedlocal"}
    for job, cfg in ind.items():
        assert archive.config_diff(cfg, full[job]) == [] and cfg["identity"] == full[job]["identity"], job


def test_generated_table_carries_the_solo_row_from_pretrain_records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = tiny_grid(methods=["base", "fedavg"], report={"name": "solo", "title": "solo"})
    (tmp_path / "params").mkdir()
    (tmp_path / "params/data.yaml").write_text(yaml.safe_dump(tiny_data_params()))
    Path("solo.yaml").write_text(yaml.safe_dump(grid))
    plan, _ = _plan(grid)
    assert plan.pretrain
    for kind, jobs in (("federate", plan.federate), ("pretrain", plan.pretrain)):
        for job, cfg in jobs.items():
            folder = _fake_run(archive.record_path(kind, job, "solo"), cfg, intra=0.9 if kind == "pretrain" else 0.5)
            (folder / archive.RECORD).write_text("{}")
    text = "\n".join(docs.render_table([docs.grid_records("solo.yaml")], {}))
    assert "| rotmnist | fedavg | 30.00 | 50.00 | 1 | unrecorded code |" in text
    assert "| rotmnist | base_pretrain | – | 90.00 | 1 | unrecorded code |" in text  # SOLO: own domain only here
    assert "A row with n < 3 gives no verdict" in text  # one seed: the caption says the rows rank nothing


def test_generated_table_of_a_global_model_grid_shows_the_global_model(tmp_path, monkeypatch):
    """FedMMD's grids score one global model (rows participant/kind `global`): the table carries its top1
    (it once rendered an empty header, every row dropped for not being the participants' average)."""
    monkeypatch.chdir(tmp_path)
    grid = tiny_grid(methods=["fedavg"], report={"name": "glob", "title": "glob"})
    grid["grid"][0]["seeds"] = [0, 1, 2]
    (tmp_path / "params").mkdir()
    (tmp_path / "params/data.yaml").write_text(yaml.safe_dump(tiny_data_params()))
    Path("glob.yaml").write_text(yaml.safe_dump(grid))
    plan, _ = _plan(grid)
    for job, cfg in plan.federate.items():  # global top1 at the last rounds: 90 / 92 / 94 % over seeds 0-2
        folder = _fake_run(archive.record_path("federate", job, "glob"), cfg)
        rows = [{"round": r, "participant": "global", "arch": "lenet", "domain": "all", "kind": "global",
                 "top1": 0.90 + 0.02 * job.seed, "top5": 1.0} for r in range(4)]
        pd.DataFrame(rows).to_csv(folder / "rounds.csv", index=False)
        (folder / archive.RECORD).write_text("{}")
    text = "\n".join(docs.render_table([docs.grid_records("glob.yaml")], {}))
    half = stats.t.ppf(0.975, 2) * 2.0 / math.sqrt(3)
    assert "| scenario | method | global top1 | n | code |" in text
    assert f"| rotmnist | fedavg | 92.00 ± {half:.2f} | 3 | unrecorded code |" in text
    assert "percent, the global model;" in text and "n < 3" not in text


def test_generated_table_caption_states_each_methods_schedule_score_and_protocols_from_the_records():
    """The caption says what ran, from the records: rounds x local epochs (grouped where methods differ), a
    stepwise method's rounds as minibatch steps (engine.local_epochs is not its schedule), the SOLO row as
    pretraining only, the reported score, the scoring and test protocols, and what the intervals cover."""
    def rows(method, base, rounds, epochs, select="best_val", test="clean"):
        return [{"method": method, "base_method": base, "round": r, "local_epochs": epochs, "select": select,
                 "protocol": "eval_models global, weighting samples", "test_protocol": test, "data_seed": "fixed",
                 "redrawn": ""} for r in range(rounds + 1)]

    runs = pd.DataFrame(rows("fedh2l", "fedh2l", 10000, 1) + rows("fedh2l_async", "fedh2l", 10000, 1)
                        + rows("fedavg", "fedavg", 85, 6) + rows("fedmd", "fedmd", 500, 1)
                        + rows("base_pretrain", "base_pretrain", 85, float("nan")))
    text = docs.run_conditions(runs)
    assert ("Schedule, from the records: 10,000 rounds of one minibatch step (fedh2l, fedh2l_async); "
            "85 rounds x 6 local epochs (fedavg); 500 rounds x 1 local epoch (fedmd); "
            "pretraining only, no federated round (base_pretrain).") in text
    assert "Reported: each participant's test score at its best validation round (engine.select: best_val)." in text
    assert "eval_models global, weighting samples. Test protocol: clean. Every seed trained" in text
    assert "training noise (initialisation, batch order) only" in text
    mixed = pd.DataFrame(rows("fccl", "fccl", 3, 2.0, select="last_k", test="authors")
                         + rows("fedavg", "fedavg", 3, 2.0, select="last_k", test="clean"))
    text = docs.run_conditions(mixed)
    assert "3 rounds x 2 local epochs." in text  # one schedule: no per-method list, 2 not 2.0
    assert "Test protocol: authors (fccl); clean (fedavg)." in text


def test_a_diverged_seed_is_archived_as_its_outcome_counted_beside_the_mean_and_never_averaged(tmp_path, monkeypatch):
    """A seeded run stopped by a non-finite loss leaves its outcome in <run>.partial/diverged/
    (runner.record_divergence): `fedshift archive` commits it, the workflow then plans it no more (current),
    the generated table counts it beside n (`2 + 1 diverged`) with no verdict, the 'no record yet' list no longer
    asks for it, and collect leaves it out of runs.csv, lists it in diverged.csv and the report says so."""
    from fedshift.report.collect import collect
    from fedshift.report.records import diverged_section

    monkeypatch.chdir(tmp_path)
    grid = _grid_file(tmp_path, "divgrid")
    plan = _plan_file(grid)
    results = tmp_path / "results"
    jobs = sorted(plan.federate.items(), key=lambda kv: kv[0].seed)
    for job, cfg in jobs[:2]:  # seeds 0 and 1 finished at 50 / 52 % intra
        _fake_run(results / "federate" / plan.folder(job), cfg, intra=0.50 + 0.02 * job.seed)
    div_job, div_cfg = jobs[2]  # seed 2 diverged in round 2 (what record_divergence writes)
    div = results / "federate" / f"{plan.folder(div_job)}.partial" / "diverged"
    _fake_run(div, div_cfg, rounds=1)
    (div / "models.pt").unlink()
    (div / "metrics.json").write_text(json.dumps({"run": div_cfg["run_name"], "diverged": True, "diverged_round": 2,
                                                  "error": "fedshift: error: non-finite loss nan in method fedavg, "
                                                           "participant m0, round 2, term local_loss"}))
    out = io.StringIO()
    counts = archive.archive_grid(plan, None, Path("records"), str(results), out=out)
    assert counts["archived"] == 3, out.getvalue()
    assert f"archived federate/{div_job.path} (diverged) -> records/divgrid/" in out.getvalue()
    status = archive.grid_status(plan, None, Path("records"))
    assert status.runs[("federate", div_job)].state == "current"  # recorded: the workflow does not rerun it

    rec = docs.grid_records(grid)
    assert rec.missing == [] and len(rec.diverged) == 1 and rec.diverged[0]["seed"] == 2
    assert set(rec.runs["seed"]) == {0, 1}  # the diverged seed's evaluated rounds are in no mean
    text = "\n".join(docs.render_table([rec], {}))
    assert "| rotmnist | fedavg | 30.00 ± 0.00‡ | 51.00 ± 12.71 | 2 + 1 diverged |" in text
    assert "a row with a diverged seed gives no verdict" in text
    assert "No committed record yet" not in text
    assert ("Diverged, recorded as their outcome (a non-finite loss or weight stopped them: rerunning repeats it; no "
            "score, in no mean): 1 of the 3 runs of") in text
    assert "fedavg on rotmnist, seed 2: round 2, non-finite loss nan in method fedavg" in text

    runs_csv = tmp_path / "collect" / "runs.csv"
    df = collect([archive.record_path("federate", j, "divgrid", Path("records")) for j, _ in jobs], runs_csv)
    assert set(df["seed"]) == {0, 1}
    listed = pd.read_csv(runs_csv.with_name("diverged.csv"))
    assert listed[["method", "seed", "round"]].values.tolist() == [["fedavg", 2, 2]]
    section = "\n".join(diverged_section(runs_csv))
    assert section.startswith("## Diverged runs (in no mean)") and "fedavg on rotmnist, seed 2: round 2" in section


def test_generated_cost_block_reads_each_records_timings_and_sizes_the_runs_still_missing(tmp_path, monkeypatch):
    """The cost block: per method, CPU kind and threads, the median (min-max) of train_s + eval_s over the
    records, and what the runs without a record would take at those medians."""
    monkeypatch.chdir(tmp_path)
    grid = _grid_file(tmp_path, "costgrid")
    plan = _plan_file(grid)
    for job, cfg in sorted(plan.federate.items(), key=lambda kv: kv[0].seed)[:2]:  # seeds 0, 1: 100 s and 300 s
        folder = archive.record_path("federate", job, "costgrid")
        _fake_run(folder, {**cfg, "engine": {**cfg["engine"], "threads": 1}})
        (folder / "metrics.json").write_text(json.dumps({"timings": {"train_s": 90.0 + 200 * job.seed, "eval_s": 10.0},
                                                         "numerics": {"cpu_kind": "avx512"}}))
        (folder / archive.RECORD).write_text("{}")
    text = "\n".join(docs.render_cost([docs.grid_records(grid)], {}))
    assert "| fedavg | avx512 | 1 | 2 | 200 (100-300) |" in text
    assert "The 1 run(s) without a record of fedavg would take about 200 CPU-s at these medians." in text
    rec = docs.grid_records(grid)  # runs of a method no record sizes: named, never "about 0 CPU-s"
    other = [(k, "fedprox", s, st) for k, _, s, st in rec.missing] * 2
    text = "\n".join(docs.render_cost([dataclasses.replace(rec, missing=other)], {}))
    assert "The 2 run(s) without a record are of fedprox, which no record sizes yet." in text
    text = "\n".join(docs.render_cost([dataclasses.replace(rec, missing=rec.missing + other)], {}))
    assert ("The 1 run(s) without a record of fedavg would take about 200 CPU-s at these medians, plus the 2 of "
            "fedprox (no record yet to size them).") in text


def test_a_cell_whose_seeds_all_agree_is_marked_unmeasured_not_zero(tmp_path, monkeypatch):
    """FedH2L at 88 % in every seed prints 88.00 ± 0.00 with ‡ and the caption says the spread is unmeasured
    (no test size in the records: no coarser resolution assumed); AGG's seeds differ and carry no mark."""
    from conftest import REPO

    monkeypatch.chdir(REPO)
    grid = "params/papers/fedh2l_table2.yaml"
    plan = _plan_file(grid)
    for job, cfg in plan.federate.items():
        if job.method in ("fedh2l", "agg") and job.scenario == "rotmnist_a15":
            acc = 0.88 if job.method == "fedh2l" else 0.80 + 0.01 * job.seed
            _pooled_run(archive.record_path("federate", job, "fedh2l_table2", tmp_path), cfg, acc)
    text = "\n".join(docs.render_table([docs.grid_records(grid, tmp_path)], {}))
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    row = {r.split(" | ")[1]: r for r in text.splitlines() if r.startswith("| rotmnist_a15 |")}
    assert "| 88.00 ± 0.00‡ (" in row["fedh2l"]  # the paper's value in brackets after the mark
    assert f"| 81.00 ± {half:.2f} (" in row["agg"] and "‡" not in row["agg"]
    assert ("‡: every seed gave the same number (the records do not say the test size, so no coarser resolution "
            "is assumed): the spread is unmeasured, not zero") in text
