"""The protocol behind each published table (``params/papers/protocols.yaml``) against what our runs used,
and the equivalence margin each printed cell's own uncertainty grounds.

* :func:`load_protocols`: one entry per published table; table-level components (rounds, local epochs,
  public augmentation, printed std; ``<component>_by_method`` per row) merged into each scenario block
  (test protocol, models, image size, test sizes). A malformed file is one line naming the table and key.
* :func:`run_values`: what a group of our runs used, read from ``runs.csv`` (collected from each run's
  resolved config: rounds, ``engine.local_epochs``, ``engine.public_aug`` where the run had a public set,
  the scenario's ``test_protocol`` (absent = clean), each participant's architecture, the partition's
  image size).
* :func:`differences`: per method of the group, what differs from the table's protocol; any difference
  makes its cells "not comparable: <what differs>" (no verdict). A component the paper states but the
  run did not record is a difference too (it cannot be shown equal). Our ``base_pretrain`` (the papers'
  SOLO/BASE, 50 epochs alone) is checked on test protocol, models and image size only.
* :func:`cell_margin`: the margin of one printed cell (:func:`fedshift.report.stats.grounded_margin` at
  the paper's number of test images behind the cell, :func:`fedshift.report.stats.images_behind`), and
  :func:`margin_reason`, the sentence each table prints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import pandas as pd
import yaml

from ..errors import ConfigError
from .published import BASE_PRETRAIN, repo_file
from .stats import grounded_margin, images_behind

TABLE_KEYS = ("rounds", "local_epochs", "public_aug")  # each may have a `<key>_by_method` mapping
SCENARIO_KEYS = ("test_protocol", "models", "image_size", "test_images", "source")
TEST_PROTOCOLS = ("clean", "authors")
PUBLIC_AUGS = ("none", "weak", "weak_code", "strong")  # engine.public_aug; other names never match a run
NAMES = {"rounds": "rounds", "local_epochs": "local epochs", "public_aug": "public augmentation",
         "test_protocol": "test protocol", "models": "models", "image_size": "image size"}


def protocols_path() -> Path:
    return repo_file("params/papers/protocols.yaml")


def _check_block(where: str, block: Mapping) -> None:
    for key in block:
        if key in ("source", "printed_std", "scenarios") or key in SCENARIO_KEYS:
            continue
        if key not in TABLE_KEYS and not (key.endswith("_by_method") and key[:-len("_by_method")] in TABLE_KEYS):
            raise ConfigError(f"{where}: unknown key {key!r}; valid: {', '.join(TABLE_KEYS + SCENARIO_KEYS)}, "
                              "<component>_by_method, printed_std, scenarios")
        if key.endswith("_by_method") and not isinstance(block[key], Mapping):
            raise ConfigError(f"{where}.{key}: must map a method to its value, got {block[key]!r}")
    rounds = block.get("rounds")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds <= 0):
        raise ConfigError(f"{where}.rounds: {rounds!r} must be a positive number of rounds or null")
    std = block.get("printed_std")
    if std is not None and (isinstance(std, bool) or not isinstance(std, (int, float)) or std < 0):
        raise ConfigError(f"{where}.printed_std: {std!r} must be a non-negative number of points or null")


def load_protocols(path: Optional[Path] = None) -> Dict[str, dict]:
    """{table: {"source", "printed_std", "scenarios": {scenario: merged block}}} (module docstring)."""
    path = Path(path or protocols_path())
    doc = yaml.safe_load(path.read_text()) or {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}: must map each published table to its protocol")
    out = {}
    for name, entry in doc.items():
        if str(name).startswith("_"):
            continue  # shared blocks (YAML anchors)
        where = f"{path}: {name}"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("scenarios"), Mapping) or not entry["scenarios"]:
            raise ConfigError(f"{where}: needs `scenarios:` with one block per scenario the table prints")
        _check_block(where, entry)
        scenarios = {}
        for scen, block in entry["scenarios"].items():
            sw = f"{where}.scenarios.{scen}"
            if not isinstance(block, Mapping):
                raise ConfigError(f"{sw}: must be a mapping of {', '.join(SCENARIO_KEYS)}")
            _check_block(sw, block)
            missing = [k for k in SCENARIO_KEYS if k not in block]
            if missing:
                raise ConfigError(f"{sw}: lacks {', '.join(missing)} (null where the paper states none)")
            if block["test_protocol"] not in TEST_PROTOCOLS:
                raise ConfigError(f"{sw}.test_protocol: {block['test_protocol']!r} must be one of "
                                  f"{', '.join(TEST_PROTOCOLS)}")
            sizes = block["test_images"]
            if not isinstance(sizes, Mapping) or not all(v is None or (isinstance(v, int) and v > 0)
                                                         for v in sizes.values()):
                raise ConfigError(f"{sw}.test_images: {sizes!r} must map each participant to a positive "
                                  "number of test images or null")
            merged = {k: v for k, v in entry.items() if k not in ("scenarios", "source")}
            merged.update(block)
            scenarios[scen] = merged
        out[name] = {"source": entry.get("source", ""), "printed_std": entry.get("printed_std"),
                     "scenarios": scenarios}
    return out


def value_for(block: Mapping, key: str, method: str, base_method: Optional[str] = None) -> Any:
    """The table's value of ``key`` for one row: ``<key>_by_method`` of the method, then of its base
    method, then ``key``."""
    per = block.get(f"{key}_by_method") or {}
    for m in (method, base_method):
        if m is not None and m in per:
            return per[m]
    return block.get(key)


# ----------------------------------------------------------------------------- what our runs used


def _known(values) -> List:
    return sorted({v for v in values if not pd.isna(v) and v != ""}, key=str)


def run_values(g: pd.DataFrame, scenario: str) -> Dict[str, Any]:
    """What one method's runs of a group used (``g``: its rows of runs.csv): None where runs.csv does not
    record a component."""
    fed = g[g["participant"] != "global"] if "participant" in g else g
    out: Dict[str, Any] = {"rounds": int(g.groupby("seed")["round"].max().min()) if len(g) else None}
    out["local_epochs"] = _known(g["local_epochs"]) if "local_epochs" in g else None
    if "public_aug" in g:
        out["public_aug"] = _known(g["public_aug"])  # '' or nan: the run had no public set
        out["uses_public"] = bool(out["public_aug"])
    else:
        out["public_aug"], out["uses_public"] = None, None
    out["test_protocol"] = (_known("clean" if pd.isna(v) or v == "" else v for v in g["test_protocol"])
                            if "test_protocol" in g else ["clean"])  # absent = clean (the scenario key's default)
    out["models"] = ({p: a for p, a in zip(fed["participant"], fed["arch"]) if not pd.isna(a)}
                     if "arch" in fed else None)
    sizes = _known(g["image_size"]) if "image_size" in g else []
    if not sizes:
        try:
            from ..data import SCENARIOS  # here, not at the top: fedshift.data imports torch

            sizes = [int(SCENARIOS.get(scenario).image_shape[-1])]
        except Exception:
            sizes = []
    out["image_size"] = [int(s) for s in sizes] or None
    return out


def _fmt(v) -> str:
    if isinstance(v, (list, tuple)):
        return " or ".join(str(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:,}" if isinstance(v, int) else str(v)


def _int(v) -> Optional[int]:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


def method_differences(block: Mapping, ran: Mapping[str, Any], method: str, base_method: Optional[str] = None
                       ) -> List[str]:
    """Each component in which one method's runs differ from the table's protocol, as text."""
    out = []
    solo = method == BASE_PRETRAIN
    if not solo:
        want = value_for(block, "rounds", method, base_method)
        if isinstance(want, int) and ran["rounds"] != want:
            out.append(f"rounds {_fmt(ran['rounds'])} (the paper's {want:,})")
        want = value_for(block, "local_epochs", method, base_method)
        got = ran["local_epochs"]
        if want is not None and not got:
            out.append(f"local epochs not recorded by the run (the paper's {_fmt(want)})")
        elif isinstance(want, Mapping):  # one count per participant (FCCL CVPR code)
            wrong = [f"{p} {_fmt(e)} (the paper's {w})" for p, w in want.items() for e in got if _int(e) != w]
            if wrong:
                out.append("local epochs " + ", ".join(dict.fromkeys(wrong)))
        elif want is not None and any(_int(e) != want for e in got):
            out.append(f"local epochs {_fmt(got)} (the paper's {want})")
        want = value_for(block, "public_aug", method, base_method)
        if want is not None and ran["uses_public"] is not False:
            accepted = list(want) if isinstance(want, (list, tuple)) else [want]
            if ran["public_aug"] is None:
                out.append(f"public augmentation not recorded by the run (the paper's {_fmt(accepted)})")
            elif any(a not in accepted for a in ran["public_aug"]):
                out.append(f"public augmentation {_fmt(ran['public_aug'])} (the paper's {_fmt(accepted)})")
    protocol = block.get("test_protocol")
    if protocol and any(p != protocol for p in ran["test_protocol"]):
        out.append(f"test protocol {_fmt(ran['test_protocol'])} (the paper's {protocol})")
    models = block.get("models")
    if models:
        if ran["models"] is None:
            out.append("models not recorded by the run")
        else:
            order = list(models) + [p for p in ran["models"] if p not in models]  # the paper's participant order
            wrong = [f"{p} {ran['models'].get(p, '?')} (the paper's {models.get(p, '?')})" for p in order
                     if p in ran["models"] and models.get(p) != ran["models"][p]]
            if wrong:
                out.append("models " + ", ".join(wrong))
    size = block.get("image_size")
    if size is not None:
        if ran["image_size"] is None:
            out.append(f"image size not recorded by the run (the paper's {size})")
        elif any(s != size for s in ran["image_size"]):
            out.append(f"image size {_fmt(ran['image_size'])} (the paper's {size})")
    return out


def differences(runs: pd.DataFrame, block: Optional[Mapping], our_scenario: str, public: str, structure: str,
                where: str = "") -> Dict[str, str]:
    """{our method: what differs} for every method of the group that differs ('' entries omitted); with no
    protocol block, every method: "no protocol recorded for <where>"."""
    g = runs[(runs["scenario"] == our_scenario) & (runs["public"] == public) & (runs["structure"] == structure)]
    out = {}
    for method, gm in g.groupby("method", sort=False):
        if block is None:
            out[method] = f"no protocol recorded for {where} in params/papers/protocols.yaml"
            continue
        base = gm["base_method"].iloc[0] if "base_method" in gm and len(gm) else None
        diff = method_differences(block, run_values(gm, our_scenario), method, None if pd.isna(base) else base)
        if diff:
            out[method] = "; ".join(diff)
    return out


# ----------------------------------------------------------------------------- margins


def cell_margin(block: Optional[Mapping], printed_std: Optional[float], metric: str, participant: str,
                published: float, our_resolution: Optional[float] = None) -> float:
    """The grounded margin of one printed cell; nan where its test size is unknown or it is no accuracy."""
    if block is None:
        return math.nan
    n = images_behind(metric, participant, block.get("test_images") or {})
    return grounded_margin(published, n, printed_std, our_resolution)


def margin_reason(block: Optional[Mapping], printed_std: Optional[float], margins: pd.Series,
                  explicit: Optional[float] = None) -> str:
    """The sentence a table's section prints under its title: how its margins were reached."""
    if block is None:
        return "no margin: descriptive only (no protocol recorded for this table in params/papers/protocols.yaml)"
    sizes = block.get("test_images") or {}
    known = ", ".join(f"{p} {n:,}" if n else f"{p} unknown" for p, n in sizes.items())
    std = (f"combined with the paper's printed std {printed_std:g}" if printed_std
           else "the paper prints no std")
    m = margins.dropna()
    span = (f"here ±{m.min():.2f} to ±{m.max():.2f} points" if len(m) and m.min() != m.max()
            else f"here ±{m.min():.2f} points" if len(m) else "no cell here has one")
    text = (f"per cell, 1.96 × the binomial standard error of the printed accuracy on the paper's test images "
            f"behind the cell ({known}; {block.get('source', '')}), {std}, never below one test image (100 / N) "
            f"nor our resolution: {span}")
    if len(m) < len(margins):
        text += "; a cell whose test size is unknown (or which is no accuracy) has no margin: descriptive only"
    if explicit is not None:
        text += f"; `report.margin` widens each to at least ±{explicit:g}"
    return text

