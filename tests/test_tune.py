"""Issue 36, tune then run: the validation holdout, the tune block, selection on validation only."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedshift.errors import ConfigError

PERMUTED = {"clients": 2, "test": 0.8, "seed": 0}  # 2 clients x 500 private images of MNIST 5k


@pytest.fixture(scope="module")
def permuted(tiny_data, tmp_path_factory):
    """A scenario without a val split (mnist5k_permuted, 2 clients), partitioned with the default holdout."""
    from fedshift.data import build

    out = tmp_path_factory.mktemp("holdout") / "mnist5k_permuted"
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, out, PERMUTED)
    return out


def test_holdout_is_recorded_stratified_and_never_a_test_image(permuted):
    from fedshift.data.loading import load_federated

    man = json.loads((permuted / "manifest.json").read_text())
    for name, info in man["participants"].items():
        held = info["holdout"]
        n_priv = info["splits"]["private"]["n"]
        assert held["fraction"] == 0.2 and held["n"] == round(0.2 * n_priv) and held["of"] == "private"
        assert f"{name}/{held['file']}" in man["files"]  # hashed: verified with the partition before a run
        pos = np.load(permuted / name / held["file"])
        priv_src = np.load(permuted / name / "private_index.npy")
        test_src = np.load(permuted / name / "test_index.npy")
        val_src = priv_src[pos]
        train_src = np.delete(priv_src, pos)
        assert len(np.unique(pos)) == len(pos) == held["n"]
        assert not set(val_src) & set(test_src)  # tuning never sees a test image
        assert not set(val_src) & set(train_src)  # nor trains on its validation images
        labels = np.load(permuted / name / "private_labels.npy")
        counts = np.bincount(labels, minlength=10)
        assert np.all(np.abs(np.bincount(labels[pos], minlength=10) - 0.2 * counts) < 1 + 1e-9)  # stratified
    plain = load_federated(permuted)
    held = load_federated(permuted, holdout=True)
    for a, b, name in zip(plain.clients, held.clients, plain.names):
        assert "val" not in a.splits  # a run that asks for no validation trains on all of private
        n_val = man["participants"][name]["holdout"]["n"]
        assert len(b.get("val")[1]) == n_val and b.num_private == a.num_private - n_val
        pos = np.load(permuted / name / "private_holdout.npy")
        assert np.array_equal(b.get("val")[0].numpy(), a.get("private")[0].numpy()[pos])


def test_holdout_is_deterministic_and_leaves_val_scenarios_alone(permuted, tiny_data, tmp_path):
    from fedshift.data import build

    again = tmp_path / "again"
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, again, PERMUTED)
    for name in ("client000", "client001"):
        assert np.array_equal(np.load(permuted / name / "private_holdout.npy"),
                              np.load(again / name / "private_holdout.npy"))
    man = json.loads((tiny_data / "partitions/rotmnist/manifest.json").read_text())
    assert all("holdout" not in p for p in man["participants"].values())  # rotmnist has its own val split
    tenth = tmp_path / "tenth"  # a scenario's own `holdout` key (params/data.yaml), not a Params field
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, tenth, {**PERMUTED, "holdout": 0.1})
    assert json.loads((tenth / "manifest.json").read_text())["participants"]["client000"]["holdout"]["n"] == 50
    with pytest.raises(ConfigError, match="holdout: 1.5 is not a fraction"):
        build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, tmp_path / "x",
                        {**PERMUTED, "holdout": 1.5})
    none = tmp_path / "none"
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, none, {**PERMUTED, "holdout": 0})
    from fedshift.data.loading import load_federated

    with pytest.raises(ConfigError, match="no validation split and no recorded holdout"):
        load_federated(none, holdout=True)


# --------------------------------------------------------------------------- the tune block
def _relabel_test(folder):
    """Shift every test label by one class (manifest rewritten): a model that learned the task is then
    worse on test than one that learned nothing, so the test winner and the validation winner differ."""
    from fedshift.data import store

    man = json.loads((folder / "manifest.json").read_text())
    for name, info in man["participants"].items():
        x, y = store.load_split(folder / name, "test")
        y = (y + 1) % 10
        store.save_split(folder / name, "test", x, y)
        info["splits"]["test"] = {**store.split_summary(x, y), "source": info["splits"]["test"]["source"]}
    (folder / "manifest.json").unlink()
    man.pop("files")
    store.write_manifest(folder, man)


def _grid(tune, **engine):
    return {"engine": {"rounds": 3, "local_epochs": 1, "local_batch": 64, "optimizer": "adam",
                       "device": "cpu", "threads": 1, "eval_batch": 1024, "checkpoint_min_s": 0, **engine},
            "grid": [{"scenarios": ["mnist5k_permuted"], "methods": ["fedavg"], "structures": ["homo_lenet"],
                      "seeds": [0, 1]}],
            "tune": tune}


def _plan(grid, tmp_path, build_root):
    from fedshift.experiments import load_experiments
    from fedshift.tune import plan_tune

    plan = load_experiments(grid, {"scenarios": {"mnist5k_permuted": SINGLE}}, results=str(tmp_path / "results"),
                            build=str(build_root))
    return plan, plan_tune(grid, plan, results=str(tmp_path / "results"))


SINGLE = {"clients": 1, "test": 0.3, "seed": 0}  # one client: FedAvg is plain training, it learns in 2 rounds


@pytest.fixture(scope="module")
def relabelled(tiny_data, tmp_path_factory):
    from fedshift.data import build

    root = tmp_path_factory.mktemp("relabelled")
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"},
                    root / "partitions/mnist5k_permuted", SINGLE)
    _relabel_test(root / "partitions/mnist5k_permuted")
    return root


def test_the_validation_winner_is_chosen_not_the_test_winner(relabelled, tmp_path):
    """Adam lr 1e-3 learns (best on validation); lr 1e-7 learns nothing and so is best on the relabelled
    test set: the tune must choose 1e-3, and the seeded runs must then train with it."""
    from fedshift import tune

    part = relabelled / "partitions/mnist5k_permuted"
    for name in json.loads((part / "manifest.json").read_text())["participants"]:  # the scored images are not test images
        priv_src = np.load(part / name / "private_index.npy")
        val_src = priv_src[np.load(part / name / "private_holdout.npy")]
        assert len(val_src) > 0 and not set(val_src) & set(np.load(part / name / "test_index.npy"))
    grid = _grid({"budget": {"rounds": 2, "seeds": [7], "patience": 0}, "metric": "avg/val/acc",
                  "methods": {"fedavg": {"engine.lr": [1e-7, 1e-3]}}})
    plan, tp = _plan(grid, tmp_path, relabelled)
    assert len(tp.candidates) == 2 and len(tp.groups) == 1
    files = []
    for key, cfg in tp.candidates.items():
        assert cfg["engine"]["rounds"] == 2 and cfg["engine"]["select"] == "best_val" and cfg["seed"] == 7
        out = tmp_path / "results/tune" / key
        tune.run_candidate(cfg, out)
        files.append(out / "metrics.json")
    chosen = tune.select(files)
    by_lr = {c["values"]["engine.lr"]: c for c in chosen["candidates"]}
    tests = {}
    for f in files:
        m = json.loads(f.read_text())
        lr = json.loads(json.dumps(__import__("yaml").safe_load((f.parent / "config.yaml").read_text())["engine"]["lr"]))
        tests[lr] = m["tune"]["test_at_best"]["avg/intra/top1"]
    assert by_lr[1e-3]["score"] > by_lr[1e-7]["score"] + 0.1  # clearly best on validation (0.29 vs 0.10) ...
    assert tests[1e-7] > tests[1e-3] + 0.05  # ... while the other is best on test (0.11 vs 0.02)
    assert chosen["chosen"] == {"engine.lr": 1e-3}
    (seeded,) = [c for j, c in plan.federate.items() if j.seed == 0]
    (group,) = tp.groups
    assert seeded["tuned"]["file"].endswith(f"mnist5k_permuted/none/fedavg/homo_lenet/chosen-{tp.group_id(group)}.yaml")
    path = tmp_path / "chosen.yaml"
    path.write_text(__import__("yaml").safe_dump(chosen))
    applied = tune.apply_chosen({**seeded, "tuned": {**seeded["tuned"], "file": str(path)}})
    assert applied["engine"]["lr"] == 1e-3 and applied["engine"]["rounds"] == 3
    assert applied["tuned"]["chosen"] == {"engine.lr": 1e-3}
    # issue 50: the published config (chosen values applied) has the identity its folder was planned with
    from fedshift.provenance import run_identity

    assert run_identity(applied) == seeded["identity"] == run_identity(seeded)
    assert seeded["run_name"].endswith(f"seed0-{seeded['identity']}")


def _fake_candidate(root, cid, index, seed, values, score, diverged=False):
    import yaml

    d = root / cid / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"scenario": "s", "public": "none", "method": "m", "structure": "homo_lenet", "seed": seed,
           "engine": {"rounds": 4}, "tune": {"candidate": cid, "index": index, "values": values,
                                             "metric": "avg/val/acc", "patience": 2}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    m = {"diverged": True, "error": "loss nan"} if diverged else {"tune": {"score": score, "best_round": 2}}
    (d / "metrics.json").write_text(json.dumps(m))
    return d / "metrics.json"


def test_select_averages_seeds_marks_divergence_and_breaks_ties_by_order(tmp_path):
    from fedshift.tune import select, table_rows

    files = [_fake_candidate(tmp_path, "ca", 0, 0, {"engine.lr": 0.001}, 0.5),
             _fake_candidate(tmp_path, "ca", 0, 1, {"engine.lr": 0.001}, 0.7),
             _fake_candidate(tmp_path, "cb", 1, 0, {"engine.lr": 0.01}, 0.6),
             _fake_candidate(tmp_path, "cb", 1, 1, {"engine.lr": 0.01}, 0.6),
             _fake_candidate(tmp_path, "cc", 2, 0, {"engine.lr": 1.0}, None, diverged=True),
             _fake_candidate(tmp_path, "cc", 2, 1, {"engine.lr": 1.0}, 0.9)]
    out = select(files)
    assert out["chosen"] == {"engine.lr": 0.001} and out["score"] == pytest.approx(0.6)  # tie 0.6: first in order
    status = {c["id"]: c["status"] for c in out["candidates"]}
    assert status == {"ca": "ok", "cb": "ok", "cc": "diverged"}  # 0.9 on one seed cannot rescue a divergence
    p = tmp_path / "chosen.yaml"
    p.write_text(__import__("yaml").safe_dump(out))
    (row,) = table_rows([p])
    assert row["candidates"] == "0.001 0.01 1.0" and row["diverged"] == 1
    assert row["scores"] == "lr=0.001: 60.00; lr=0.01: 60.00; lr=1.0: diverged"
    with pytest.raises(ConfigError, match="every candidate diverged"):
        select([files[4]])


def test_early_stopping_and_score_use_validation_only():
    from fedshift.tune import score, should_stop

    hist = [{"avg/val/acc": v, "avg/intra/top1": 1 - v} for v in (0.2, 0.5, 0.4, 0.45, 0.3)]
    assert not should_stop(hist[:3], "avg/val/acc", 2) and should_stop(hist[:4], "avg/val/acc", 2)
    assert not should_stop(hist, "avg/val/acc", 0)
    s = score(hist, [1, 2, 3, 4, 5], "avg/val/acc")
    assert s["score"] == 0.5 and s["best_round"] == 2 and s["test_at_best"]["avg/intra/top1"] == 0.5


@pytest.mark.parametrize("tune, match", [
    ({"metric": "avg/inter/top1", "methods": {"fedavg": {"engine.lr": [0.1]}}}, "tune.metric: 'avg/inter/top1' is not a validation metric"),
    ({"methods": {"fedprox": {"mu": [0.1]}}}, r"tune.methods: \['fedprox'\] not run by the grid"),
    ({"methods": {"fedavg": {"engine.lr": {"log": [0, 0.1], "num": 3}}}}, r"tune.methods.fedavg.engine.lr: \{log"),
    ({"methods": {"fedavg": {"engine.lrr": [0.1]}}}, r"engine.lrr: unknown key \(did you mean 'lr'\?\)"),
    ({"methods": {"fedavg": {"mu": [0.1]}}}, r"mu: unknown key"),
    ({"methods": {"fedavg": {}}}, "nothing to search"),
    ({"budget": {"seeds": []}, "methods": {"fedavg": {"engine.lr": [0.1]}}}, "tune.budget.seeds"),
])
def test_bad_tune_blocks_fail_in_one_line_naming_the_key(tune, match, tmp_path):
    with pytest.raises(ConfigError, match=match) as exc:
        _plan(_grid(tune), tmp_path, tmp_path)
    assert "\n" not in str(exc.value)


def test_log_ranges_and_declared_search_spaces():
    from dataclasses import dataclass, field

    from fedshift.tune import candidate_values, candidates, declared_space, method_space

    assert candidate_values({"log": [0.001, 0.1], "num": 3}, "x") == [0.001, 0.01, 0.1]

    @dataclass(frozen=True)
    class P:
        mu: float = field(default=0.01, metadata={"search": [0.001, 0.1]})
        other: int = 1

    class ByField:
        name, Params = "byfield", P

    class ByAttr:
        name, Params, search_space = "byattr", P, {"other": [1, 2]}

    assert declared_space(ByField) == {"mu": [0.001, 0.1]} and declared_space(ByAttr) == {"other": [1, 2]}
    space = method_space({"common": {"engine.lr": [0.01, 0.1]}, "methods": {"byfield": None}}, "byfield", ByField)
    assert list(space) == ["engine.lr", "mu"] and len(candidates(space)) == 4


def test_an_interrupted_candidate_resumes_from_its_checkpoint(relabelled, tmp_path, monkeypatch):
    from fedshift import tune
    from fedshift.engine import checkpoint
    from fedshift.methods.fedavg import FedAvg

    grid = _grid({"budget": {"rounds": 3, "seeds": [0]}, "methods": {"fedavg": {"engine.lr": [1e-3]}}})
    _, tp = _plan(grid, tmp_path, relabelled)
    ((key, cfg),) = tp.candidates.items()
    out = tmp_path / "results/tune" / key
    real = FedAvg.run_round

    def stop_in_round_3(self, ctx):
        r = ctx.round
        if r == 3:
            raise KeyboardInterrupt  # SIGTERM/SIGINT land as an exception inside a round
        return real(self, ctx)

    monkeypatch.setattr(FedAvg, "run_round", stop_in_round_3)
    with pytest.raises(KeyboardInterrupt):
        tune.run_candidate(cfg, out)
    assert not (out / "metrics.json").exists()
    monkeypatch.setattr(FedAvg, "run_round", real)
    m = tune.run_candidate(cfg, out)
    assert m["timings"]["resumed_after_rounds"] == [2] and m["tune"]["rounds_run"] == 3
    assert not checkpoint.partial_dir(out).exists()


def test_report_states_selection_and_prints_the_tuned_table(tmp_path):
    import pandas as pd

    from fedshift.report.frames import headline_frame, selection_note
    from fedshift.report.report import tuned_section

    rows = []
    for method, select, sel in (("fedavg", "last_k", None), ("fedh2l", "best_val", 1)):
        for r, acc in ((1, 0.9), (2, 0.2), (3, 0.3)):
            rows.append({"scenario": "s", "public": "none", "structure": "st", "method": method, "seed": 0,
                         "round": r, "participant": "p", "kind": "intra", "top1": acc, "top5": acc,
                         "select": select, "selected_round": sel, "tuned": method == "fedavg"})
    df = pd.DataFrame(rows)
    head = headline_frame(df, last_k=2).set_index("method")["top1"]
    assert head["fedavg"] == pytest.approx(0.25) and head["fedh2l"] == pytest.approx(0.9)  # best_val: round 1
    note = selection_note(df, 2)
    assert "last 2 rounds: fedavg" in note and "best-validation round (select: best_val): fedh2l" in note
    assert "Tuned on the validation holdout (tuned.csv): fedavg" in note
    table = tmp_path / "tuned_in.csv"
    common = {"scenario": "s", "public": "none", "structure": "st", "parameter": "engine.lr", "rounds": 5, "seeds": "0",
              "tied_values": 1, "no_effect": False}
    pd.DataFrame([{**common, "method": "fedavg", "candidates": "0.001 0.01", "chosen": 0.01, "val_score": 55.0,
                   "n_candidates": 2, "diverged": 0, "budget": 10, "scores": "lr=0.001: 40.00; lr=0.01: 55.00"},
                  {**common, "method": "moon", "candidates": "0.001 0.01 0.1", "chosen": 0.01, "val_score": 50.0,
                   "n_candidates": 3, "diverged": 1, "budget": 15, "scores": "lr=0.001: 40.00; lr=0.01: 50.00; lr=0.1: diverged"},
                  {**common, "method": "fedprox", "candidates": "0.001 0.01 0.1", "chosen": 0.1, "val_score": 60.0,
                   "n_candidates": 3, "diverged": 0, "budget": 15, "scores": "lr=0.001: 40.00; lr=0.01: 50.00; lr=0.1: 60.00"}]
                 ).to_csv(table, index=False)
    md = tuned_section({"tuned": {"table": str(table), "budget": {"rounds": 5, "seeds": [0], "patience": 2},
                                  "metric": "avg/val/acc"}}, tmp_path)
    assert "## Tuned hyper-parameters" in md[0] and any("| engine.lr | 0.001 0.01 | 0.01 | 55.00 | 0 of 2 | 10 |" in l for l in md)
    assert any("| moon | st | engine.lr | 0.001 0.01 0.1 | 0.01 | 50.00 | 1 of 3 | 15 | lr=0.001: 40.00; lr=0.01: 50.00; "
               "lr=0.1: diverged |" in l for l in md)
    # a winner on the range's edge is flagged (two candidates have no inside: not flagged)
    assert any("| fedprox | st | engine.lr | 0.001 0.01 0.1 | 0.1 (edge) |" in l for l in md)
    assert any(l.startswith("**Chosen at the edge of its range**") and "fedprox engine.lr." in l for l in md)
    assert not any("fedavg engine.lr" in l for l in md)
    # issue 50: budgets compared per method, flagged when unequal (fedavg: 2 candidates, the others 3)
    (warn,) = [l for l in md if l.startswith("**⚠ Unequal tuning budgets**")]
    assert "fedavg 2 x 5 x 1 = 10, moon 3 x 5 x 1 = 15, fedprox 3 x 5 x 1 = 15" in warn
    pd.DataFrame([{**common, "method": "plugin", "candidates": "0.001 0.01 0.1", "chosen": 0.01, "val_score": 10.52,
                   "n_candidates": 3, "diverged": 0, "budget": 15, "tied_values": 2,
                   "scores": "lr=0.001: 9.90; lr=0.01: 10.52; lr=0.1: 10.52"}]).to_csv(table, index=False)
    md = tuned_section({"tuned": {"table": str(table), "budget": {}, "metric": "avg/val/acc"}}, tmp_path)
    assert any("| 0.01 (tie of 2: first listed) | 10.52 |" in l for l in md)  # a tie is said, not hidden
    assert not any("Unequal tuning budgets" in l or "No effect" in l for l in md)
    assert (tmp_path / "tuned.csv").exists()


def test_ties_and_no_effect_are_per_parameter(tmp_path):
    """Issue 50: FedAvgM's lr read "tie of 2" where only beta was tied (lr 0.01: 38.71 for both betas, lr 0.03:
    27.67 for both): lr is chosen by its score, beta is tied and changed no score; the report says so."""
    import pandas as pd
    import yaml

    from fedshift.report.report import tuned_section
    from fedshift.tune import no_effect, table_rows, tied_values, write_table

    scores = {0.01: 0.3871, 0.03: 0.2767}
    cands = [{"id": f"c{i}", "values": {"engine.lr": lr, "beta": beta}, "per_seed": {100: scores[lr]}, "status": "ok",
              "score": scores[lr]} for i, (lr, beta) in enumerate((lr, b) for lr in (0.01, 0.03) for b in (0.5, 0.9))]
    assert (tied_values(cands, "engine.lr"), tied_values(cands, "beta")) == (1, 2)
    assert (no_effect(cands, "engine.lr"), no_effect(cands, "beta")) == (False, True)
    # an effect in one group is an effect: beta 0.9 diverging at lr 0.03
    cands_div = [dict(c, status="diverged", score=None) if c["values"] == {"engine.lr": 0.03, "beta": 0.9} else c
                 for c in cands]
    assert no_effect(cands_div, "beta") is False and tied_values(cands_div, "beta") == 2
    assert no_effect(cands[:1], "beta") is False  # one value: nothing to say
    chosen = {"scenario": "s", "public": "none", "method": "fedavgm", "structure": "homo_lenet", "metric": "avg/val/acc",
              "rounds": 3, "patience": 1, "seeds": [100], "chosen": {"engine.lr": 0.01, "beta": 0.5},
              "score": 0.3871, "candidate": "c0", "candidates": cands}
    f = tmp_path / "chosen-x.yaml"
    f.write_text(yaml.safe_dump(chosen))
    rows = {r["parameter"]: r for r in table_rows([f])}
    assert rows["engine.lr"]["budget"] == rows["beta"]["budget"] == 4 * 3 * 1
    write_table(tmp_path / "tuned_in.csv", [f])
    md = "\n".join(tuned_section({"tuned": {"table": str(tmp_path / "tuned_in.csv"), "budget": {},
                                            "metric": "avg/val/acc"}}, tmp_path)).splitlines()
    lr_row = next(l for l in md if "| engine.lr |" in l)
    beta_row = next(l for l in md if "| beta |" in l)
    assert "| 0.01 | 38.71 |" in lr_row and "tie" not in lr_row and "no effect" not in lr_row
    assert "| 0.5 (tie of 2: first listed) (no effect) | 38.71 |" in beta_row
    assert any(l.startswith("**No effect on any score:** fedavgm beta (s / homo_lenet)") for l in md)
    assert pd.read_csv(tmp_path / "tuned.csv").set_index("parameter")["no_effect"].to_dict() == \
        {"engine.lr": False, "beta": True}


def test_a_rounds_table_says_which_rows_were_tuned_and_by_what_budget():
    import pandas as pd

    from fedshift.report.rounds import tuned_rounds_note

    g = pd.DataFrame({"method": ["fedavg", "fedmmd", "fedfusion"], "tuned": [True, True, False]})
    cfg = {"tuned": {"budget": {"rounds": 15, "seeds": [100], "patience": 5}, "metric": "global/val/top1"}}
    (line, blank) = tuned_rounds_note(g, cfg)
    assert line.startswith("Tuned on the validation holdout") and "fedavg, fedmmd; not tuned: fedfusion." in line
    assert "15 rounds, tuning seeds [100], early-stopping patience 5 evaluations" in line and "global/val/top1" in line
    assert tuned_rounds_note(g.assign(tuned=False), cfg) == []


def test_share_and_scenarios_and_the_global_metric_plan_as_stated(tmp_path):
    from fedshift.experiments import load_experiments
    from fedshift.tune import plan_tune

    data = {"scenarios": {"mnist5k_shards": {}, "mnist5k_binary": {}}}
    grid = {"engine": {"rounds": 4, "optimizer": "sgd", "device": "cpu", "participant_eval": False,
                       "global_eval_every": 2, "server_model": True},
            "grid": [{"scenarios": ["mnist5k_shards", "mnist5k_binary"], "methods": ["fedavg", "fedmmd"],
                      "structures": ["homo_lenet"], "seeds": [0]}],
            "tune": {"metric": "global/val/top1", "budget": {"rounds": 3, "seeds": [9]}, "scenarios": ["mnist5k_shards"],
                     "methods": {"fedavg": {"engine.lr": [0.01, 0.1]}}, "share": {"fedmmd": "fedavg"}}}
    plan = load_experiments(grid, data, results=str(tmp_path))
    tp = plan_tune(grid, plan, results=str(tmp_path))
    assert len(tp.candidates) == 2 and {g.scenario for g in tp.groups} == {"mnist5k_shards"}
    for cfg in tp.candidates.values():  # scored on the global model: no participant selection, eval every round
        assert cfg["engine"]["select"] == "last_k" and cfg["engine"]["global_eval_every"] == 1
    tuned = {(j.scenario, j.method): c.get("tuned") for j, c in plan.federate.items()}
    assert tuned[("mnist5k_shards", "fedmmd")]["file"] == tuned[("mnist5k_shards", "fedavg")]["file"]
    assert tuned[("mnist5k_shards", "fedmmd")]["from"] == "fedavg"
    assert tuned[("mnist5k_binary", "fedavg")] is None and tuned[("mnist5k_binary", "fedmmd")] is None
    bad = {**grid, "tune": {**grid["tune"], "metric": "avg/val/acc"}}
    with pytest.raises(ConfigError, match="participant_eval is false"):
        plan_tune(bad, load_experiments(bad, data, results=str(tmp_path)))
    bad = {**grid, "tune": {**grid["tune"], "share": {"fedmmd": "fedprox"}}}
    with pytest.raises(ConfigError, match="tune.share.fedmmd"):
        plan_tune(bad, load_experiments(bad, data, results=str(tmp_path)))


def test_a_global_metric_candidate_is_scored_on_pooled_validation(tiny_data, tmp_path):
    """FedMMD-style grids evaluate only the global model: the candidate's score is the global model's
    accuracy on every client's holdout pooled, recorded per global evaluation."""
    from fedshift import tune
    from fedshift.data import build
    from fedshift.experiments import load_experiments

    shards = {"shards": 4, "per_client": 2, "test": 0.9, "seed": 0}  # 2 clients x 250 images
    build.partition("mnist5k_shards", {"mnist5k": tiny_data / "datasets/mnist5k"},
                    tmp_path / "partitions/mnist5k_shards", shards)
    grid = {"engine": {"rounds": 4, "local_epochs": 1, "local_batch": 50, "optimizer": "sgd", "lr": 0.05,
                       "device": "cpu", "threads": 1, "participant_eval": False, "global_eval_every": 1,
                       "server_model": True, "checkpoint_min_s": 0},
            "grid": [{"scenarios": ["mnist5k_shards"], "methods": ["fedavg"], "structures": ["homo_lenet"]}],
            "tune": {"metric": "global/val/top1", "budget": {"rounds": 3, "seeds": [0], "patience": 1},
                     "methods": {"fedavg": {"engine.lr": [0.05]}}}}
    plan = load_experiments(grid, {"scenarios": {"mnist5k_shards": shards}}, results=str(tmp_path / "results"),
                            build=str(tmp_path))
    ((key, cfg),) = tune.plan_tune(grid, plan, results=str(tmp_path / "results")).candidates.items()
    m = tune.run_candidate(cfg, tmp_path / key)
    assert 0.0 <= m["tune"]["score"] <= 1.0 and 1 <= m["tune"]["best_round"] <= m["tune"]["rounds_run"] <= 3


def test_tuned_rows_carry_their_chosen_values_in_every_table():
    """Issue 50: a 3x lr difference was invisible in the tables (one sentence named the tuned methods)."""
    import pandas as pd

    from fedshift.report import rounds
    from fedshift.report.frames import tuned_values
    from fedshift.report.report import to_markdown

    runs = pd.DataFrame({"method": ["fedavg", "fedavg", "fedmd", "fedprox", "fedprox"],
                         "tuned_values": ["lr=0.003", "lr=0.003", None, "lr=0.01 mu=0.1", "lr=0.03 mu=0.1"]})
    tuned = tuned_values(runs)
    assert tuned == {"fedavg": "lr=0.003", "fedmd": "", "fedprox": "lr=0.01 mu=0.1 / lr=0.03 mu=0.1"}
    table = pd.DataFrame({"m0→": [50.0, 40.0], "AVG→": [50.0, 40.0], "seeds": [1, 1]}, index=["fedavg", "fedmd"])
    md = to_markdown(table, "t", tuned=tuned).splitlines()
    assert md[2].endswith("| seeds | tuned |") and md[4].endswith("| 1 | lr=0.003 |") and md[5].endswith("| 1 | no |")
    assert "tuned" not in to_markdown(table, "t", tuned={"fedavg": "", "fedmd": ""})  # no tuned row: no column
    rt = pd.DataFrame({"rounds_to/0.5": [3.0, 4.0], "reached/0.5": [1, 1], "reduce/0.5": [0.0, -33.3],
                       "global/top1": [60.0, 55.0], "seeds": [1, 1]}, index=["fedavg", "fedmd"])
    lines = rounds.to_markdown(rt, [0.5], "t", tuned=tuned).splitlines()
    assert lines[2].endswith("| seeds | tuned |") and lines[4].endswith("| 1 | lr=0.003 |")
