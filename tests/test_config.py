"""Typed config resolution and grid validation errors (names, keys, types)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple

import pytest

from fedshift.config import flatten, resolve
from fedshift.errors import ConfigError
from fedshift.experiments import load_experiments

DATA = {"scenarios": {"rotmnist": {}, "digits_offline": {}}, "public": {"photo_patches": {}, "uci_digits": {}}}


@dataclass(frozen=True)
class P:
    a: int = 1
    b: float = 0.5
    mode: Literal["x", "y"] = "x"
    ks: Tuple[int, ...] = (1, 5)
    opt: Optional[int] = None


def test_resolve_defaults_and_coercion():
    p = resolve(P, {"b": 2, "ks": [1, 2, 3], "opt": 4}, "w")
    assert p == P(a=1, b=2.0, ks=(1, 2, 3), opt=4) and isinstance(p.b, float)


@pytest.mark.parametrize("override,msg", [
    ({"c": 1}, r"w.c: unknown key; valid keys: a, b, ks, mode, opt"),
    ({"a": 1.5}, r"w.a: expected int, got 1.5"),
    ({"a": True}, r"w.a: expected int"),
    ({"mode": "z"}, r"w.mode: invalid value 'z'; valid: 'x', 'y'"),
    ({"ks": [1, "two"]}, r"w.ks\[1\]: expected int"),
])
def test_resolve_errors_name_key_and_valid_values(override, msg):
    with pytest.raises(ConfigError, match=msg):
        resolve(P, override, "w")


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": []}) == {"a.b": 1, "a.c.d": 2, "e": []}


def grid(**block):
    base = {"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fccl_plus"], "structures": ["demo_mixed"]}
    base.update(block)
    return {"grid": [base]}


@pytest.mark.parametrize("exp,msg", [
    (grid(methods=["fedavg"]), "needs a homogeneous structure"),
    (grid(structures=["nope"]), "unknown structure 'nope'"),
    (grid(public=["cifar1000"]), "unknown public set 'cifar1000'"),
    (grid(scenarios=["rotmnist_full"]), "not built: add it under `scenarios:` in params/data.yaml"),
    ({**grid(), "engine": {"rounds": "many"}}, r"engine \(fccl_plus on rotmnist\).rounds: expected int"),
    ({**grid(), "methods": {"fccl_plus": {"tua": 3}}}, r"methods.fccl_plus.tua: unknown key.*tau"),
    ({**grid(), "variants": {"x": {"method": "fcl"}}}, r"variants.x.method: unknown method 'fcl'"),
    (grid(public=None), "requires an unlabeled public set"),
    ({**grid(), "methods": {"fccl_plus": {"homogeneous_averaging": "before_local"}}}, "averages parameters, but 'demo_mixed'"),
    ({**grid(methods=["fccl"]), "pretrain": {"norm": "batch"}}, r"engine.norm \('default'\) differs from pretrain.norm"),
    (grid(scenarios=["digits_offline"], public=["uci_digits"]), "public set 'uci_digits' samples dataset 'uci_digits'"),
    ({**grid(), "enginee": {}}, r"Additional properties are not allowed \('enginee' was unexpected\)"),
])
def test_grid_errors(exp, msg):
    if exp["grid"][0].get("public", 1) is None:
        del exp["grid"][0]["public"]
    with pytest.raises(ConfigError, match=msg):
        load_experiments(exp, DATA)


def test_texture_only_public_set_may_share_a_source():
    # digits_offline blends MNIST digits with photo patches (MNIST-M recipe); the unlabeled
    # photo_patches public set holds no digit, so the pairing is allowed.
    plan = load_experiments(grid(scenarios=["digits_offline"], structures=["homo_lenet"]), DATA)
    assert len(plan.federate) == 1


def test_grid_resolves_variants_and_scenario_overrides():
    exp = grid(methods=["fccl_plus", "no-fisl", "fccl"])
    exp["variants"] = {"no-fisl": {"method": "fccl_plus", "params": {"fisl": False}}}
    exp["scenario_overrides"] = {"rotmnist": {"engine": {"rounds": 7}, "methods": {"fccl_plus": {"omega": 2.0}}}}
    plan = load_experiments(exp, DATA)
    cfgs = {j.method: c for j, c in plan.federate.items()}
    assert cfgs["no-fisl"]["method_params"]["fisl"] is False
    assert cfgs["no-fisl"]["method_params"]["omega"] == 2.0
    assert cfgs["fccl_plus"]["engine"]["rounds"] == 7
    assert cfgs["fccl_plus"]["archs"] == ["lenet", "fedavg_cnn_mnist", "simple_cnn", "lenet"]
    # fccl starts from BASE checkpoints (shared: one pretrain job per participant/arch);
    # fccl_plus from scratch, as the FCCL+ code
    assert len(plan.pretrain) == 4
    m20 = next(c for j, c in plan.pretrain.items() if j.participant == "m20")
    assert cfgs["fccl"]["paths"]["pretrained"][1] == \
        f"results/pretrain/rotmnist/m20/fedavg_cnn_mnist/seed0-{m20['identity']}/model.pt"
    assert cfgs["fccl_plus"]["paths"]["pretrained"] is None


def test_a_run_resolves_identically_from_any_grid():
    """Ablation grids share runs with the main grid: the resolved config (a Snakemake input)
    must not depend on which grid or block named the run, or every grid re-runs it."""
    from fedshift.experiments import dump_config

    a = load_experiments({"grid": [{**grid()["grid"][0], "name": "main"}]}, DATA)
    b = load_experiments({"grid": [{**grid(methods=["base", "fccl_plus"])["grid"][0], "name": "table_x"}],
                          "report": {"name": "table_x"}}, DATA)
    job = next(iter(a.federate))
    assert dump_config(a.federate[job]) == dump_config(b.federate[job])
