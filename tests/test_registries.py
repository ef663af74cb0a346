"""Every registered name, parametrised: specs are complete and unknown names fail clearly."""

from __future__ import annotations

import dataclasses

import pytest

from fedshift.data import DATASETS, PUBLIC_SETS, SCENARIOS
from fedshift.errors import ConfigError
from fedshift.methods import METHODS
from fedshift.models import MODELS
from fedshift.models.structures import STRUCTURES
from fedshift.registry import Registry


@pytest.mark.parametrize("name", DATASETS.names())
def test_dataset_spec(name):
    spec = DATASETS.get(name)
    assert spec.name == name and spec.source and spec.licence
    if spec.params:
        spec.params()  # defaults are valid


@pytest.mark.parametrize("name", PUBLIC_SETS.names())
def test_public_spec(name):
    spec = PUBLIC_SETS.get(name)
    assert spec.dataset in DATASETS


@pytest.mark.parametrize("name", SCENARIOS.names())
def test_scenario_spec(name):
    spec = SCENARIOS.get(name)
    params = spec.params() if spec.params else None
    assert set(spec.datasets_for(params)) <= set(DATASETS.names())
    assert len(spec.image_shape) == 3 and spec.num_classes >= 2
    assert spec.headline_topk in (1, 5)


@pytest.mark.parametrize("name", METHODS.names())
def test_method_spec(name):
    cls = METHODS.get(name)
    assert cls.name == name and cls.__doc__
    params = cls.Params()
    assert dataclasses.is_dataclass(params) and params.init in ("scratch", "base")
    for scen, over in cls.scenario_defaults.items():
        dataclasses.replace(params, **over)  # per-scenario defaults name real keys


@pytest.mark.parametrize("name", STRUCTURES.names())
def test_structure_names_registered_models(name):
    s = STRUCTURES.get(name)
    archs = s.assign(len(s.archs)) if s.archs else s.assign(3)
    assert set(archs) <= set(MODELS.names())


def test_registry_errors():
    r = Registry("widget")
    r.add("alpha", 1)
    with pytest.raises(ValueError, match="lowercase"):
        r.add("Beta", 2)
    with pytest.raises(ValueError, match="registered twice"):
        r.add("alpha", 3)
    with pytest.raises(ConfigError, match=r"kind: unknown widget 'alpah' \(did you mean 'alpha'\?\); valid widgets: alpha"):
        r.get("alpah", key="kind")
