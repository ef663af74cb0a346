"""Issue 47: the authors' test sets and data draws.

Office-style folders in the real format (domain/class/JPEG files, built here: the real sets cannot be
downloaded) go through the real manual fetch; the partitions, public sets and plans are built by the
real stages (`fedshift partition` / `fedshift public`, fedshift.experiments, fedshift.tune).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedshift.cli import main
from fedshift.data import build, manual, store
from fedshift.data.registry import FetchContext
from fedshift.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _jpeg_folders(data_dir: Path, name: str, per_class, seed: int) -> None:
    """``data/<name>/<domain folder>/<class>/<k>.jpg``: random 24x24 JPEGs, ``per_class(c)`` per class."""
    from PIL import Image

    spec = manual.SETS[name]
    g = np.random.default_rng(seed)
    for folder in spec.domains.values():
        for c, cls in enumerate(spec.classes):
            d = data_dir / name / folder / cls
            d.mkdir(parents=True)
            for k in range(per_class(c)):
                Image.fromarray(g.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(d / f"img_{k:03d}.jpg",
                                                                                       quality=95)


@pytest.fixture(scope="module")
def office(tmp_path_factory):
    """Fetched office31 (3 to 7 images per class) and office_home (3 to 6 per class) datasets."""
    root = tmp_path_factory.mktemp("office")
    _jpeg_folders(root / "data", "office31", lambda c: 3 + c % 5, 0)
    _jpeg_folders(root / "data", "office_home", lambda c: 3 + c % 4, 1)
    ctx = FetchContext(data_dir=root / "data", cache_dir=root / "cache")
    for name in ("office31", "office_home"):
        build.fetch_dataset(name, root / "datasets" / name, ctx, {"check_counts": False})
    return root


def _split(folder: Path, participant: str, split: str):
    x, y = store.load_split(folder / participant, split)
    return x, y, np.load(folder / participant / f"{split}_index.npy")


def test_stored_order_is_torchvisions_imagefolder_order(office):
    """The authors' positions index a torchvision ImageFolder of the domain folder: the fetched split
    lists the same files in the same order (so position i is the authors' image i)."""
    from torchvision.datasets import ImageFolder

    for name, folder in (("office31", "amazon"), ("office_home", "Real World")):
        split = next(k for k, v in manual.SETS[name].domains.items() if v == folder)
        theirs = [Path(p).relative_to(office / "data" / name).as_posix()
                  for p, _ in ImageFolder(str(office / "data" / name / folder)).samples]
        ours = (office / "datasets" / name / f"{split}_files.txt").read_text().splitlines()
        assert ours == theirs


def test_authors_protocol_tests_on_the_whole_folder_clean_holds_out(office, tmp_path):
    dirs = {"office31": office / "datasets/office31"}
    authors = build.partition("office31", dirs, tmp_path / "authors", {"test_protocol": "authors"})
    clean = build.partition("office31", dirs, tmp_path / "clean", {})
    assert authors["params"]["test_protocol"] == "authors" and "test_protocol" not in clean["params"]
    for d in ("amazon", "dslr", "webcam"):
        x, y = store.load_split(office / "datasets/office31", d)
        n = len(y)
        n_train = sum(1 for i in range(n) if i % 10 <= 7)  # ImageFolder_Custom: i % 10 <= 7 (office31.py:27-31)
        px, py, pi = _split(tmp_path / "authors", d, "private")
        tx, ty, ti = _split(tmp_path / "authors", d, "test")
        assert np.array_equal(ti, np.arange(n)) and np.array_equal(tx, x)  # the whole folder
        assert set(pi.tolist()) <= set(ti.tolist())  # test ⊇ private, by row ...
        assert set(store.image_hashes(px).tolist()) <= set(store.image_hashes(tx).tolist())  # ... and by pixels
        assert len(pi) == int(0.48 * n_train) and pi.max() < n_train  # the class-sorted prefix
        tail = [c for c in np.unique(y) if np.flatnonzero(y == c).min() >= n_train]
        assert tail and not set(tail) & set(py.tolist())  # the last classes never reach private data
        px, py, pi = _split(tmp_path / "clean", d, "private")
        tx, ty, ti = _split(tmp_path / "clean", d, "test")
        assert not set(pi.tolist()) & set(ti.tolist())  # disjoint by row ...
        assert not set(store.image_hashes(px).tolist()) & set(store.image_hashes(tx).tolist())  # ... and pixels
        assert len(ti) == round(0.2 * n) and set(ty.tolist()) <= set(y.tolist())
    assert authors["audit"]["test_protocol"] == "authors" and not authors["audit"]["disjoint_by_index"]
    assert clean["audit"]["disjoint_by_index"] and clean["audit"]["disjoint_by_hash"]


def test_cvpr_draw_is_the_first_k_of_a_random_70_percent(office, tmp_path):
    """FCCL (CVPR) Office-Home: per class int(0.3 n_c) positions set apart, private = the first k of the
    rest in ascending order (fccl/Dataset/utils_dataset.py:286-293), test = the whole folder (l. 295)."""
    sizes = [90, 110, 100, 95]
    build.partition("office_home", {"office_home": office / "datasets/office_home"}, tmp_path / "p",
                    {"test_protocol": "authors", "authors_code": "fccl", "private": sizes})
    for k, d in enumerate(("art", "clipart", "product", "real_world")):
        _, y = store.load_split(office / "datasets/office_home", d)
        _, _, pi = _split(tmp_path / "p", d, "private")
        _, _, ti = _split(tmp_path / "p", d, "test")
        assert np.array_equal(ti, np.arange(len(y))) and len(pi) == sizes[k]
        skipped = np.setdiff1d(np.arange(pi.max() + 1), pi)  # positions before the last private one, not drawn
        for c in np.unique(y):
            rows = np.flatnonzero(y == c)
            if rows.max() < pi.max():  # a class wholly inside the prefix: exactly its 30 % is missing
                assert np.isin(rows, skipped).sum() == int(0.3 * len(rows))
        assert y[pi].max() < y.max()  # the folder's last class is beyond the prefix


def test_digits_offline_authors_is_the_office_protocol_on_each_domains_drawn_images(tiny_data, tmp_path):
    """The offline twins' stand-in: under authors a domain's folder is its drawn images (clean private + test),
    sorted by class; test = all of them, private = random positions of the class-sorted first 80 %."""
    build.fetch_dataset("uci_digits", tmp_path / "uci_digits", FetchContext())
    dirs = {"mnist5k": tiny_data / "datasets/mnist5k", "uci_digits": tmp_path / "uci_digits",
            "photo_patches": tiny_data / "datasets/photo_patches"}
    sizes = {"private": [20, 20, 40, 30], "test": [30, 30, 30, 30]}
    build.partition("digits_offline", dirs, tmp_path / "clean", sizes)
    build.partition("digits_offline", dirs, tmp_path / "authors", {**sizes, "test_protocol": "authors"})
    for k, d in enumerate(("mnist", "uci", "mnistm", "mnist_inv")):
        cx = np.concatenate([_split(tmp_path / "clean", d, s)[0] for s in ("private", "test")])
        ci = np.concatenate([_split(tmp_path / "clean", d, s)[2] for s in ("private", "test")])
        px, _, pi = _split(tmp_path / "authors", d, "private")
        tx, ty, ti = _split(tmp_path / "authors", d, "test")
        assert sorted(ti.tolist()) == sorted(ci.tolist())  # the folder: the clean draw's images, all of them
        assert sorted(store.image_hashes(tx).tolist()) == sorted(store.image_hashes(cx).tolist())
        assert np.all(np.diff(ty) >= 0)  # class-sorted, as an ImageFolder lists it
        n = len(ti)
        n_train = sum(1 for i in range(n) if i % 10 <= 7)
        pos = [int(np.flatnonzero(ti == i)[0]) for i in pi]  # where each private image sits in the folder
        assert len(pi) == sizes["private"][k] and max(pos) < n_train
        assert set(store.image_hashes(px).tolist()) <= set(store.image_hashes(tx).tolist())


def test_data_seed_run_redraws_private_and_public_keeps_the_office_test(office, tiny_data, tmp_path):
    """Seeds 0 and 1 through the commands the Snakemake rules run (`fedshift partition --seed --test-protocol`,
    `fedshift public --seed`): other private and public subsets, the same Office test split, as the authors'
    code (its i % 10 split and whole-folder test are fixed; np.random redraws the rest per seed)."""
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"scenarios": {"office31": {}}, "public": {"photo_patches": {"n": 200}}}))
    for protocol in ("authors", "clean"):
        for k in (0, 1):
            assert main(["partition", "office31", "--seed", str(k), "--test-protocol", protocol, "--params", str(data),
                         "--datasets", str(office / "datasets"), "--out", str(tmp_path / protocol / f"seed{k}")]) == 0
        for d in ("amazon", "dslr", "webcam"):
            t0, t1 = (np.load(tmp_path / protocol / f"seed{k}" / d / "test_index.npy") for k in (0, 1))
            p0, p1 = (np.load(tmp_path / protocol / f"seed{k}" / d / "private_index.npy") for k in (0, 1))
            assert np.array_equal(t0, t1), (protocol, d)
            assert not np.array_equal(p0, p1), (protocol, d)
    for k in (0, 1):
        assert main(["public", "photo_patches", "--seed", str(k), "--params", str(data), "--datasets",
                     str(tiny_data / "datasets"), "--out", str(tmp_path / f"public{k}")]) == 0
    i0, i1 = (np.load(tmp_path / f"public{k}" / "train_index.npy") for k in (0, 1))
    assert len(i0) == len(i1) == 200 and not np.array_equal(i0, i1)
    assert [store.read_manifest(tmp_path / f"public{k}")["params"]["seed"] for k in (0, 1)] == [0, 1]


def _grid(**top):
    g = {"engine": {"rounds": 1, "data_seed": "run"}, "methods": {},
         "grid": [{"name": "g", "scenarios": ["office31"], "public": ["photo_patches"], "methods": ["fedmd"],
                   "structures": ["homo_lenet"], "seeds": [0, 1]}]}
    g.update(top)
    return g


def test_plan_reads_each_seeds_draw_and_records_protocol_and_redraw():
    from fedshift.experiments import load_experiments

    data = {"scenarios": {"office31": {}}, "public": {"photo_patches": {}}}
    plan = load_experiments(_grid(test_protocol="authors"), data)
    cfgs = sorted(plan.federate.values(), key=lambda c: c["seed"])
    for k, cfg in enumerate(cfgs):
        assert cfg["paths"]["partition"] == f"build/partitions_authors/office31/seed{k}"
        assert cfg["paths"]["public"] == f"build/public_seeded/photo_patches/seed{k}"
        assert cfg["test_protocol"] == "authors"
        assert cfg["data_draw"] == {"redrawn": ["private", "public set"]}  # the Office test is the same
    clean = load_experiments(_grid(), data)
    cfg = next(iter(clean.federate.values()))
    assert "test_protocol" not in cfg and cfg["paths"]["partition"].startswith("build/partitions_seeded/office31/")
    fixed = load_experiments(_grid(engine={"rounds": 1}, test_protocol="authors"), data)
    cfg = next(iter(fixed.federate.values()))
    assert cfg["paths"]["partition"] == "build/partitions_authors/office31/seed0" and "data_draw" not in cfg
    assert cfg["paths"]["public"] == "build/public/photo_patches"
    with pytest.raises(ConfigError, match="scenario 'rotmnist' has no authors' test set"):
        load_experiments({**_grid(test_protocol="authors"), "grid": [
            {"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedavg"], "structures": ["homo_lenet"]}]},
            {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}})


# ----------------------------------------------------------------------------- the leak guard
def _tune_grid(scenario, seeds, tuning, data_seed="run", **top):
    g = {"engine": {"rounds": 2, "data_seed": data_seed}, "methods": {},
         "grid": [{"name": "t", "scenarios": [scenario], "methods": ["fedavg"], "structures": ["homo_lenet"],
                   "seeds": seeds}],
         "tune": {"budget": {"rounds": 1, "seeds": tuning}, "common": {"engine.lr": [0.01]},
                  "methods": {"fedavg": {}}}}
    g.update(top)
    return g


def _plan_tune(grid, data, build_dir):
    from fedshift.experiments import load_experiments
    from fedshift.tune import plan_tune

    plan = load_experiments(grid, data, build=str(build_dir))
    return plan, plan_tune(grid, plan)


def _val_test_overlap(tuning_dirs, reported_dirs) -> int:
    """Independent count on built partitions: validation rows (holdout positions of private) of the tuning
    partitions that are test rows of the reported ones, by source row or pixel hash."""
    keys, hashes = set(), set()
    for d in reported_dirs:
        m = store.read_manifest(d)
        for p in m["participants"]:
            x, _, i = _split(d, p, "test")
            keys |= set(i.tolist())
            hashes |= set(store.image_hashes(x).tolist())
    n = 0
    for d in tuning_dirs:
        m = store.read_manifest(d)
        for p, info in m["participants"].items():
            x, _, i = _split(d, p, "private")
            pos = np.load(d / p / info["holdout"]["file"])
            n += sum(1 for k, h in zip(i[pos].tolist(), store.image_hashes(x[pos]).tolist()) if k in keys or h in hashes)
    return n


def test_leak_guard_refuses_a_grid_whose_tuning_validation_is_reported_test(tiny_data, tmp_path):
    """mnist5k_permuted under data_seed: run redraws its held-out test per seed: tuning seed 7's
    validation images are test images of seeds 0-2. Refused in one line naming the scenario and the count,
    which an independent count on the built partitions confirms; the tune_leaks job's count agrees."""
    from fedshift.tune import check_leaks, write_leak_specs

    entry = {"clients": 10, "test": 0.2, "seed": 0}
    data = {"datasets": ["mnist5k"], "scenarios": {"mnist5k_permuted": entry}}
    with pytest.raises(ConfigError) as exc:
        _plan_tune(_tune_grid("mnist5k_permuted", [0, 1, 2], [7]), data, tiny_data)
    line = str(exc.value)
    assert "\n" not in line and line.startswith("tune: scenario 'mnist5k_permuted': ")
    count = int(line.split(": ")[2].split(" ")[0])
    dirs = {}
    for k in (7, 0, 1, 2):
        dirs[k] = tmp_path / f"seed{k}"
        build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, dirs[k], {**entry, "seed": k})
    assert count == _val_test_overlap([dirs[7]], [dirs[0], dirs[1], dirs[2]]) > 0
    assert f"{count} validation image(s) of tuning seed(s) [7] are test images of reported seed(s) [0, 1, 2]" in line
    # the same grid on the same partition for every seed (data_seed: fixed) passes, and its job counts 0
    plan, tp = _plan_tune(_tune_grid("mnist5k_permuted", [0, 1, 2], [7], data_seed="fixed"), data, tiny_data)
    assert list(tp.leaks) == ["mnist5k_permuted"]
    spec = write_leak_specs(tp, str(tmp_path / "results"))["mnist5k_permuted"]
    folder = Path(tp.leaks["mnist5k_permuted"]["tuning"][0]["folder"])
    assert folder == tiny_data / "partitions/mnist5k_permuted"
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, tmp_path / "fixed", entry)
    text = Path(spec).read_text().replace(str(folder), str(tmp_path / "fixed"))
    Path(spec).write_text(text)
    assert check_leaks(tmp_path / "leaks.json", Path(spec), tiny_data / "datasets")["leaks"] == 0
    # the job on the seeded partitions (built above) refuses with the plan's count
    seeded = yaml.safe_load(text)
    seeded["tuning"] = [{**seeded["tuning"][0], "folder": str(dirs[7]), "seed": 7}]
    seeded["reported"] = [{**seeded["reported"][0], "folder": str(dirs[k]), "seed": k} for k in (0, 1, 2)]
    Path(spec).write_text(yaml.safe_dump(seeded))
    with pytest.raises(ConfigError, match=f"'mnist5k_permuted': {count} validation image"):
        check_leaks(tmp_path / "leaks2.json", Path(spec), tiny_data / "datasets")
    assert not (tmp_path / "leaks2.json").exists()


def test_leak_guard_without_data_refuses_what_the_construction_cannot_rule_out(tmp_path):
    data = {"scenarios": {"mnist5k_permuted": {}, "digits_offline": {}}, "public": {"photo_patches": {}}}
    with pytest.raises(ConfigError, match=r"'mnist5k_permuted': validation images of tuning seed\(s\) \[7\] can be "
                                          r"test images of reported seed\(s\) \[0, 1\] \(its seed redraws the test split; "
                                          r"the count needs its data: dvc repro\)"):
        _plan_tune(_tune_grid("mnist5k_permuted", [0, 1], [7]), data, tmp_path)
    grid = _tune_grid("digits_offline", [0, 1], [100], data_seed="fixed", test_protocol="authors")
    with pytest.raises(ConfigError, match="'digits_offline'.*its test_protocol authors tests on training images"):
        _plan_tune(grid, data, tmp_path)
    _plan_tune(_tune_grid("digits_offline", [0, 1], [100], data_seed="fixed"), data, tmp_path)  # clean: one partition


def _shipped_tune_grids():
    return sorted(p for p in (ROOT / "params/papers").glob("*.yaml")
                  if "tune" in (yaml.safe_load(p.read_text()) or {}) and "overlay_of" not in p.read_text())


@pytest.mark.parametrize("path", _shipped_tune_grids(), ids=lambda p: p.stem)
def test_leak_guard_passes_the_shipped_tuning_grids(path, monkeypatch):
    from fedshift.experiments import load_experiments, snakemake_config
    from fedshift.tune import plan_tune

    monkeypatch.chdir(ROOT)
    grid = snakemake_config(path)
    plan = load_experiments(grid, grid.pop("data_params", "params/data.yaml"))
    tp = plan_tune(grid, plan)
    assert tp.leaks and all(job["file"].endswith("/leaks.json") for job in tp.leaks.values())


def test_seeded_tuning_reads_its_own_seeds_partition_and_public_set():
    """tuned_digits.yaml (data_seed: run): the tuning seed's candidates read build/partitions_seeded/digits/
    seed100 and build/public_seeded/cifar100/seed100 (once build/partitions_seeded/partitions_seeded/...)."""
    from fedshift.experiments import load_experiments, snakemake_config
    from fedshift.tune import plan_tune

    grid = snakemake_config(ROOT / "params/papers/tuned_digits.yaml")
    plan = load_experiments(grid, ROOT / grid.pop("data_params"))
    tp = plan_tune(grid, plan)
    assert {c["paths"]["partition"] for c in tp.candidates.values()} == {"build/partitions_seeded/digits/seed100"}
    assert {c["paths"]["public"] for c in tp.candidates.values()} == {None, "build/public_seeded/cifar100/seed100"}
    assert {c["data_draw"]["redrawn"][-1] for c in tp.candidates.values() if c["paths"]["public"]} == {"public set"}


# ----------------------------------------------------------------------------- the report
def _runs(scenario, protocol=None, data_seed="fixed", redrawn=""):
    rows = [dict(scenario=scenario, public="pp", method=m, base_method=m, structure="st", seed=s, round=r,
                 participant=p, arch="lenet", domain=p, kind=k, top1=0.5 + 0.01 * s, top5=0.9 + 0.002 * s, data_seed=data_seed,
                 redrawn=redrawn) for m in ("fedavg", "fedmd") for s in range(3) for r in (38, 39, 40)
            for p in ("amazon", "dslr") for k in ("inter", "intra")]
    df = pd.DataFrame(rows)
    if protocol:
        df["test_protocol"] = protocol
    return df


def test_interval_sentence_says_what_was_redrawn():
    from fedshift.report.delta_markdown import interval_coverage

    office = interval_coverage(_runs("office31", data_seed="run", redrawn="private, public set"))
    assert office == ("each seed drew its own private subsets and public subset (`data_seed: run`; the test sets "
                      "were the same for every seed): the intervals cover that draw and training noise.")
    rot = interval_coverage(_runs("rotmnist", data_seed="run", redrawn="private, public, val, test, public set"))
    assert rot.startswith("each seed drew its own private subsets, labeled public seed sets, validation sets, test "
                          "sets and public subset (`data_seed: run`):")
    assert "authors' code" not in office + rot
    assert interval_coverage(_runs("office31")).startswith("every seed trained and was evaluated on one data draw")


def test_table_grids_record_the_test_set_their_runs_are_scored_on():
    """fccl_plus_table8.yaml runs test_protocol: authors: its Office runs record `authors` and read the authors'
    partitions; its Digits runs, tested on the clean test splits by the authors' code too, record nothing
    (clean), as params/papers/protocols.yaml declares the two (issue 46's fingerprint compares them)."""
    from fedshift.experiments import load_experiments, snakemake_config
    from fedshift.report.protocols import load_protocols

    grid = snakemake_config(ROOT / "params/papers/fccl_plus_table8.yaml")
    plan = load_experiments(grid, ROOT / grid.pop("data_params"))
    declared = load_protocols()["fccl_plus_table8"]["scenarios"]
    for cfg in plan.federate.values():
        assert cfg.get("test_protocol", "clean") == declared[cfg["scenario"]]["test_protocol"], cfg["run_name"]
        authors = cfg["scenario"] != "digits"
        assert cfg["paths"]["partition"].startswith("build/partitions_authors/" if authors else "build/partitions_seeded/")
        assert cfg["data_draw"]["redrawn"] == ["private"] + (["public set"] if cfg["paths"]["public"] else [])


def test_protocol_refusal_and_statement(tmp_path):
    """A clean Office run beside an authors' table: its cells are not comparable (issue 46's fingerprint, fed by
    the run's recorded test_protocol), and the section's title names both protocols; an authors run is not
    refused for its test set."""
    from fedshift.report import paper_delta as pdl
    from fedshift.report.protocols import load_protocols, method_differences, run_values
    from fedshift.report.published import COLUMNS

    block = load_protocols()["fccl_plus_table8"]["scenarios"]["office31"]
    clean, authors = _runs("office31"), _runs("office31", "authors")
    assert "test protocol clean (the paper's authors)" in method_differences(block, run_values(clean, "office31"), "fedavg")
    assert not any(d.startswith("test protocol")
                   for d in method_differences(block, run_values(authors, "office31"), "fedavg"))
    pub = tmp_path / "published"
    pub.mkdir()
    pd.DataFrame([dict(paper="fccl_plus", table="VIII", scenario="office31", method=m, participant="avg",
                       metric="inter/top5", value="90.00", flag="", note="") for m in ("fedavg", "fedmd")],
                 columns=COLUMNS).to_csv(pub / "fccl_plus_table8.csv", index=False)
    for runs, ours in ((clean, "clean"), (authors, "authors")):
        out = tmp_path / ours
        out.mkdir()
        md = "\n".join(pdl.delta_report(runs, {"published": ["fccl_plus_table8"]}, out, 3, pub))
        cells = pd.read_csv(out / "delta__fccl_plus_table8.csv")
        judged = cells[cells["published"].notna()]
        refused = judged["verdict"].str.contains("test protocol clean (the paper's authors)", regex=False)
        assert refused.all() if ours == "clean" else not refused.any(), judged["verdict"].tolist()
        assert f"— test protocol: ours {ours}, the paper's authors" in md


def test_every_results_table_states_its_test_protocol():
    from fedshift.report.report import protocol_note

    assert protocol_note(_runs("office31", "authors")).startswith(
        "Test protocol: **authors** (the authors' code's test set: the whole domain folder, training images included")
    assert protocol_note(_runs("office31")).startswith("Test protocol: **clean** (held-out test images")
    assert protocol_note(_runs("office31").assign(test_protocol="")).startswith("Test protocol: **clean**")  # absent
