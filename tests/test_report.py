"""Report: headline = mean of the last 3 rounds, per-seed mean ± std, named tables."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from fedshift.report.report import headline_frame, make_report, paper_table


def runs(methods=("a", "b"), seeds=(0, 1), rounds=4):
    rows = []
    for m, s, r, p, d in itertools.product(methods, seeds, range(rounds + 1), ("p0", "p1", "p2"), ("p0", "p1", "p2")):
        # accuracy = r/10 + seed/100 (+0.2 for method b, +0.3 on the own domain)
        acc = r / 10 + s / 100 + (0.2 if m == "b" else 0) + (0.3 if p == d else 0) + (0.01 if d == "p2" else 0)
        rows.append({"scenario": "rotmnist", "public": "photo_patches", "method": m, "base_method": m,
                     "structure": "st", "seed": s, "round": r, "participant": p, "arch": "lenet",
                     "domain": d, "kind": "intra" if p == d else "inter", "top1": acc, "top5": min(1, acc + 0.1)})
    return pd.DataFrame(rows)


def test_headline_last_three_rounds_and_seed_std():
    head = headline_frame(runs(), last_k=3)
    table, std = paper_table(head, "intra", "top1")
    # intra of p0, method a: rounds 2..4 -> mean r/10 = 0.3, +0.3 own domain, seeds 0/1 -> +0.005 mean
    assert table.loc["a", "p0↩"] == pytest.approx(60.5)
    assert table.loc["b", "AVG↩"] == pytest.approx((80.5 + 80.5 + 81.5) / 3, abs=0.01)
    assert std.loc["a", "p0↩"] == pytest.approx(pd.Series([0.6, 0.61]).std() * 100, abs=0.01)
    inter, _ = paper_table(head, "inter", "top1")
    # inter of p0 = mean over domains p1, p2 (Eq. 22): 0.3 + 0.005 + 0.005
    assert inter.loc["a", "p0→"] == pytest.approx(31.0)
    assert list(inter.columns) == ["p0→", "p1→", "p2→", "AVG→", "seeds"]
    assert (inter["seeds"] == 2).all()


def test_make_report_writes_tables_named_tables_and_figures(tmp_path):
    csv = tmp_path / "runs.csv"
    runs().to_csv(csv, index=False)
    cfg = {"title": "t", "tables": [{"name": "abl", "title": "Ablation", "methods": ["b", "a"]}]}
    files = {p.name for p in make_report(csv, tmp_path / "rep", cfg, tracking=False)}
    assert {"report.md", "table_inter__rotmnist__photo_patches__st.csv", "std_table_inter__rotmnist__photo_patches__st.csv",
            "abl__rotmnist__photo_patches__st.csv",
            "curves__rotmnist__photo_patches__st.png"} <= files
    abl = pd.read_csv(tmp_path / "rep/abl__rotmnist__photo_patches__st.csv", index_col=0)
    assert list(abl.index) == ["b", "a"]  # the table's own order
    assert "AVG→" in abl.columns and "AVG↩" in abl.columns
    md = (tmp_path / "rep/report.md").read_text()
    assert "± " in md and "### Ablation (inter, top1)" in md


def test_schedules_name_each_methods_schedule_from_its_runs():
    from fedshift.report.schedule import grouped, schedules

    df = runs(methods=("fedh2l", "fedavg"), seeds=(0,), rounds=2).assign(local_epochs=2)
    df.loc[df["method"] == "fedh2l", "local_epochs"] = 1  # engine.local_epochs: not a stepwise method's schedule
    assert grouped(schedules(df, lambda base: base == "fedh2l")) == \
        "2 rounds of one minibatch step (fedh2l); 2 rounds x 2 local epochs (fedavg)"


def test_a_table_mixing_scoring_protocols_is_marked():
    """Issue 34 item 6 / issue 35 item 2: a plugin scored under McMahan's protocol beside FedAvg under the
    FCCL+ authors' (eval_models: local, uniform weighting) is marked in the table, not silently compared."""
    import pandas as pd

    from fedshift.report.report import mixed_protocols

    df = pd.DataFrame({"method": ["fedavg", "fedavg", "fedavgm", "fedmd"],
                       "protocol": ["eval_models local, weighting uniform"] * 2
                       + ["eval_models global, weighting samples", ""]})
    lines = mixed_protocols(df)
    assert lines and "fedavg: eval_models local, weighting uniform" in lines[0]
    assert "fedavgm: eval_models global, weighting samples" in lines[0] and "fedmd" not in lines[0]
    assert mixed_protocols(df[df["method"] != "fedavgm"]) == []
