"""Bad input fails before any job with one line naming the key, the value and what is valid;
`fedshift validate --experiments X` resolves what `snakemake --configfile X` runs."""

from __future__ import annotations

import pytest
import torch
import yaml

from fedshift.cli import main
from fedshift.errors import ConfigError
from fedshift.experiments import REPO_WORKFLOW_CONFIG, PretrainJob, load_experiments, snakemake_config
from fedshift.models.structures import STRUCTURES

DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}, "datasets": ["mnist5k", "photo_patches"]}
GRID = [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedmd"], "structures": ["homo_lenet"]}]

BAD = [
    ("malformed device", {"engine": {"device": "gpu0"}},
     "engine (fedmd on rotmnist): device: invalid value 'gpu0'; valid: auto, cpu, cuda, cuda:<index>, mps"),
    ("malformed cuda index", {"pretrain": {"device": "cuda:x"}},
     "pretrain (rotmnist): device: invalid value 'cuda:x'"),
    ("negative lr", {"engine": {"lr": -0.1}}, "engine (fedmd on rotmnist): lr must be >= 0, got -0.1"),
    ("negative public lr", {"engine": {"public_lr": -1}}, "public_lr must be >= 0, got -1.0"),
    ("negative pretrain lr", {"pretrain": {"lr": -1e-3}}, "pretrain (rotmnist): lr must be >= 0, got -0.001"),
    ("zero threads", {"engine": {"threads": 0}}, "threads must be >= 1 (or null: torch's default), got 0"),
    ("negative threads", {"pretrain": {"threads": -2}}, "threads must be >= 1 (or null: torch's default), got -2"),
    ("negative checkpoint_every", {"engine": {"checkpoint_every": -1}}, "checkpoint_every must be >= 0"),
    ("negative checkpoint_min_s", {"engine": {"checkpoint_min_s": -5}}, "checkpoint_min_s must be >= 0"),
    ("unknown on_nonfinite", {"engine": {"on_nonfinite": "ignore"}},
     "on_nonfinite: invalid value 'ignore'; valid: 'fail', 'skip_batch'"),
    ("unknown scenario override", {"scenario_overrides": {"rotmnst": {"engine": {"rounds": 3}}}},
     "scenario_overrides: unknown scenario 'rotmnst' (did you mean 'rotmnist'?)"),
    ("path in a variant name", {"variants": {"../evil": {"method": "fedmd"}}},
     "variants.../evil: invalid name '../evil'; use a plain lowercase identifier"),
    ("space in a variant name", {"variants": {"a b": {"method": "fedmd"}}}, "variants.a b: invalid name 'a b'"),
    ("path in a grid name", {"grid": [{**GRID[0], "name": "../x"}]}, "grid[0].name: invalid name '../x'"),
]


@pytest.mark.parametrize("case,exp,message", BAD, ids=[c for c, _, _ in BAD])
def test_bad_input_is_one_line_before_any_job(tmp_path, monkeypatch, capsys, case, exp, message):
    monkeypatch.chdir(tmp_path)  # no params/experiments.yaml to merge over
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({"grid": GRID, **exp}))
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(DATA))
    code = main(["validate", "--experiments", "e.yaml", "--data-params", "d.yaml"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert message in err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_fails_before_any_job(monkeypatch):
    monkeypatch.delenv("FEDSHIFT_SKIP_CUDA_CHECK", raising=False)
    with pytest.raises(ConfigError, match=r"engine \(fedmd on rotmnist\)\.device: 'cuda' asks for CUDA, but torch "
                                        r"finds no CUDA device here; use auto or cpu"):
        load_experiments({"grid": GRID, "engine": {"device": "cuda"}}, DATA)
    monkeypatch.setenv("FEDSHIFT_SKIP_CUDA_CHECK", "1")  # a cluster head whose GPUs are on the compute nodes
    load_experiments({"grid": GRID, "engine": {"device": "cuda"}}, DATA)


@pytest.mark.parametrize("key,name", [("scenarios", "rotmnist; rm -rf ~"), ("public", "$(touch x)"),
                                      ("datasets", "mnist5k && echo")])
def test_data_params_names_pasted_into_dvc_commands_must_be_registered(key, name):
    data = {k: (list(v) if isinstance(v, list) else dict(v)) for k, v in DATA.items()}
    if isinstance(data[key], list):
        data[key].append(name)
    else:
        data[key][name] = {}
    import re

    with pytest.raises(ConfigError, match=rf"params/data.yaml {key}: unknown [a-z ]+ '{re.escape(name)}'"):
        load_experiments({"grid": GRID}, data)


def test_validate_merges_like_snakemake_configfile(tmp_path):
    """--configfile X is merged over the Snakefile's params/experiments.yaml: nested keys extend,
    lists (grid) are replaced."""
    main_cfg = tmp_path / "experiments.yaml"
    main_cfg.write_text(yaml.safe_dump({"engine": {"rounds": 12, "local_epochs": 2}, "grid": GRID,
                                        "variants": {"a": {"method": "fedmd"}}}))
    abl = tmp_path / "abl.yaml"
    abl.write_text(yaml.safe_dump({"engine": {"rounds": 3}, "variants": {"b": {"method": "base"}},
                                   "grid": [{**GRID[0], "methods": ["base"]}]}))
    merged = snakemake_config(abl, main_cfg)
    assert merged["engine"] == {"rounds": 3, "local_epochs": 2}
    assert sorted(merged["variants"]) == ["a", "b"]
    assert merged["grid"][0]["methods"] == ["base"]
    main_cfg.write_text(yaml.safe_dump({**yaml.safe_load(main_cfg.read_text()),
                                        "report": {"title": "main", "published": ["fccl_plus_table8"]}}))
    assert snakemake_config(abl, main_cfg)["report"] == {}  # a user grid reports only what it names
    assert snakemake_config(abl, main_cfg, replace=True) == yaml.safe_load(abl.read_text())
    assert snakemake_config(main_cfg, main_cfg) == yaml.safe_load(main_cfg.read_text())
    assert REPO_WORKFLOW_CONFIG.name == "experiments.yaml"


def test_validate_counts_the_jobs_snakemake_runs(tmp_path, monkeypatch, capsys):
    """Every participant x architecture of a method that needs the BASE checkpoints (or of the `base`
    row) is pretrained once (the report's base_pretrain row and the checkpoints share them); a block
    without either (fedmd on homo_lenet) plans none; every grid cell is one federate job."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(DATA))
    grid = [{**GRID[0], "methods": ["fedmd", "fccl"], "structures": ["demo_mixed"]},
            {**GRID[0], "methods": ["fedmd"], "structures": ["homo_lenet"]}]
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({"grid": grid}))
    assert main(["validate", "--experiments", "e.yaml", "--data-params", "d.yaml"]) == 0
    plan = load_experiments({"grid": grid}, DATA)
    pairs = {(p, a) for c in plan.federate.values() if c["paths"]["pretrained"]
             for p, a in zip(c["participants"], c["archs"])}
    assert len(pairs) == 4 and {a for _, a in pairs} == set(STRUCTURES.get("demo_mixed").assign(4))
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "ok: 4 pretrain and 3 federate jobs"
    # then what SLURM will be asked for: the largest request of each kind, with its job
    assert [line.split(" SLURM memory request: ")[0] for line in out[1:]] == ["largest pretrain", "largest federate"]
    assert " MB (pretrain/" in out[1] and " MB (federate/" in out[2]


def test_fntd_less_fccl_plus_variant_loads_base_checkpoints_as_theta_star():
    """Table X rows without FNTD (CVPR Eq. 19) need the BASE models as theta^* though they start from scratch."""
    exp = {"variants": {"fcclp_nofntd": {"method": "fccl_plus", "params": {"fntd": False}}},
           "grid": [{**GRID[0], "methods": ["fcclp_nofntd", "fccl_plus"], "structures": ["demo_mixed"]}]}
    plan = load_experiments(exp, DATA, results="R")
    cfgs = {c["method"]: c for c in plan.federate.values()}
    assert cfgs["fcclp_nofntd"]["method_params"]["init"] == "scratch"
    pjs = [PretrainJob("rotmnist", p, a, 0) for p, a in zip(cfgs["fcclp_nofntd"]["participants"],
                                                             cfgs["fcclp_nofntd"]["archs"])]
    assert cfgs["fcclp_nofntd"]["paths"]["pretrained"] == [
        f"R/pretrain/rotmnist/{pj.participant}/{pj.arch}/seed0-{plan.pretrain[pj]['identity']}/model.pt" for pj in pjs]
    assert cfgs["fcclp_nofntd"]["base_runs"] == [plan.pretrain[pj]["identity"] for pj in pjs]  # in its identity
    assert cfgs["fccl_plus"]["paths"]["pretrained"] is None


def test_validate_knows_published_table_names(tmp_path, capsys):
    """Issue 22 point 4: a typo in report.published stops `fedshift validate` with a did-you-mean,
    not the report job at the end of the grid; entries in `{name: ...}` form are checked too."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"report": {"published": ["fccl_plus_table99"]}}))
    assert main(["validate", "--experiments", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'fccl_plus_table99' (did you mean 'fccl_plus_table9'?)" in err
    bad.write_text(yaml.safe_dump({"report": {"published": [{"name": "fedh2l_tabel2"}]}}))
    assert main(["validate", "--experiments", str(bad)]) == 2
    assert "did you mean 'fedh2l_table2'?" in capsys.readouterr().err
    bad.write_text(yaml.safe_dump({"report": {"published": ["fccl_plus_table9"]}}))
    assert main(["validate", "--experiments", str(bad)]) == 0
