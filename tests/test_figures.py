"""Report figures from a synthetic runs table: files written, the heatmap's numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd


def _runs(methods=("fedavg", "fccl_plus"), seeds=(0, 1), rounds=4):
    rng = np.random.default_rng(0)
    parts = ["m0", "m20", "m40"]
    rows = []
    for m in methods:
        for s in seeds:
            for r in range(rounds + 1):
                for p in parts:
                    for d in parts:
                        t1 = float(rng.uniform(0.1, 0.9))
                        rows.append({"scenario": "rotmnist", "public": "photo_patches", "method": m, "base_method": m,
                                     "structure": "homo_lenet", "seed": s, "round": r, "participant": p,
                                     "arch": "lenet", "domain": d, "kind": "intra" if p == d else "inter",
                                     "top1": t1, "top5": min(1.0, t1 + 0.1)})
    return pd.DataFrame(rows)


def test_domain_matrix_is_the_mean_of_the_last_rounds():
    from fedshift.report.figures import domain_matrix

    df = _runs()
    mat = domain_matrix(df, "fedavg", last_k=3)
    assert list(mat.index) == ["m0", "m20", "m40"] and list(mat.columns) == ["m0", "m20", "m40"]
    sel = df[(df.method == "fedavg") & (df["round"].isin([2, 3, 4])) & (df.participant == "m20") & (df.domain == "m0")]
    assert abs(mat.loc["m20", "m0"] - 100 * sel["top1"].mean()) < 1e-9


def test_report_figures_write_every_png(tmp_path):
    from fedshift.report.figures import report_figures
    from fedshift.report.report import paper_table, headline_frame

    df = _runs()
    runs = tmp_path / "federate"
    npz_dir = runs / "rotmnist/photo_patches/fccl_plus/homo_lenet/seed0"
    npz_dir.mkdir(parents=True)
    corr = np.clip(np.random.default_rng(1).normal(0, 0.5, (2, 3, 10, 10)), -1, 1)
    np.savez(npz_dir / "cross_correlation.npz", rounds=np.array([1, 4]), participants=np.array(["m0", "m20", "m40"]),
             public=corr, private=corr)
    head = headline_frame(df, 3)
    inter, sd_inter = paper_table(head, "inter", "top1")
    intra, sd_intra = paper_table(head, "intra", "top1")
    tables = {("abl", "rotmnist", "photo_patches", "homo_lenet"): (pd.concat([inter.drop(columns="seeds"), intra], axis=1),
                                                                   pd.concat([sd_inter, sd_intra], axis=1))}
    out = tmp_path / "report"
    out.mkdir()
    md = report_figures(df, out, {}, 3, runs_root=runs, pretrain_root=tmp_path / "none", tables=tables)
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["ablation__abl__rotmnist__photo_patches__homo_lenet.png",
                     "crosscorr__rotmnist__photo_patches__fccl_plus__homo_lenet__seed0.png",
                     "domains__rotmnist__photo_patches__homo_lenet.png",
                     "participants__rotmnist__photo_patches__homo_lenet.png"]
    for n in names:
        assert (out / n).read_bytes()[:4] == b"\x89PNG" and (out / n).stat().st_size > 10_000
        assert f"]({n})" in "\n".join(md)
