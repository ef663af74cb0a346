"""Datasets a user supplies by hand (licence forms, no stable URL): SYN digits,
Office-Caltech-10, Office-31, Office-Home and PACS.

The user puts the archive (``.zip``, ``.tar``, ``.tar.gz``, ``.tgz``) or the unpacked
folder into ``data/`` under one of the names of :data:`SETS` (``data/office31.zip``,
``data/OfficeHomeDataset_10072016/``...), then runs ``dvc add data && dvc repro``.
An archive is extracted safely into the download cache. The fetch verifies the
structure before decoding anything: every domain folder, every class folder (no more,
no fewer), the image count per domain against the published totals (``check_counts``)
and, when the user pins it, the archive's sha256 (none is published for these sets).

Images are decoded once (PIL) and resized to ``size`` x ``size`` RGB (32 by default:
FCCL/FCCL+ train every scenario at 32x32; squashed like the authors' ``Resize((32, 32))``,
no crop). One split per domain (``amazon``, ``real_world``...); PACS stores its
official splits as ``<domain>_train`` / ``<domain>_test``, SYN its ``train`` and
``val`` folders as ``train`` / ``test``. Beside each split, ``<split>_files.txt`` names
the image file of every row.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from .download import safe_extract, verify
from .registry import DATASETS, DatasetSpec, FetchContext
from .store import save_split

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff")
NEXT_STEP = "then run `dvc add data && dvc repro` (or `fedshift fetch {name}`)"


@dataclass(frozen=True)
class ManualSet:
    """What a hand-supplied dataset must look like."""

    name: str
    title: str
    aliases: Tuple[str, ...]  # other accepted names in data/ (official archive names)
    domains: Dict[str, str]  # split name -> folder name as published ("real_world": "Real World")
    classes: Tuple[str, ...]  # class folder names; label = position
    where: str  # where to obtain it
    licence: str
    counts: Dict[str, int] = field(default_factory=dict)  # published images per split (domain)

    @property
    def names(self) -> Tuple[str, ...]:
        return (self.name,) + self.aliases


@dataclass(frozen=True)
class ManualParams:
    size: int = 32  # stored side in pixels (FCCL/FCCL+ resize every image to 32x32)
    check_counts: bool = True  # compare images per domain with the published totals
    sha256: Optional[str] = None  # pin your archive's sha256 (none is published for it)

    def __post_init__(self):
        if self.size < 8:
            raise ValueError(f"size: {self.size} is too small (8 pixels at least)")


# ---------------------------------------------------------------------- decoding


def _decode_one(path: Path, size: int) -> np.ndarray:
    from PIL import Image  # fetch time only

    with Image.open(path) as img:
        img.draft("RGB", (size, size))  # JPEG: decode at a reduced scale when much larger
        img = img.convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.Resampling.BILINEAR)  # antialiased when shrinking
        return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def decode_images(paths: Sequence[Path], size: int) -> np.ndarray:
    """Decode image files into uint8 N x 3 x size x size, in order (threads: PIL drops the GIL)."""
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    if not len(paths):
        return out
    try:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            for k, arr in enumerate(pool.map(lambda p: _decode_one(p, size), paths, chunksize=64)):
                out[k] = arr
    except OSError as exc:  # PIL.UnidentifiedImageError is an OSError
        raise ConfigError(f"cannot decode an image ({exc}); the file is damaged or not an image") from None
    return out


# ------------------------------------------------------------------ locating data


def expected_files(spec: ManualSet, data_dir: Path) -> str:
    first = data_dir / f"{spec.name}.zip"
    others = ", ".join(f"{n}.zip|.tar.gz|/" for n in spec.names[1:])
    return f"{first} (or .tar.gz / .tgz / .tar, or the unpacked folder {data_dir / spec.name}/" + (
        f"; also accepted: {others})" if others else ")")


def locate(spec: ManualSet, ctx: FetchContext) -> Path:
    """The archive or folder the user put into ``data/``; ConfigError when there is none."""
    data_dir = Path(ctx.data_dir)
    for stem in spec.names:
        if (data_dir / stem).is_dir():
            return data_dir / stem
        for suffix in ARCHIVE_SUFFIXES:
            if (data_dir / f"{stem}{suffix}").is_file():
                return data_dir / f"{stem}{suffix}"
    raise ConfigError(
        f"{spec.name}: {spec.title} is not downloaded automatically; expected "
        f"{expected_files(spec, data_dir)} holding the folders {', '.join(repr(d) for d in spec.domains.values())}. "
        f"Obtain it from {spec.where} ({spec.licence}), put it there, " + NEXT_STEP.format(name=spec.name))


def unpack(spec: ManualSet, src: Path, ctx: FetchContext, sha256: Optional[str]) -> Path:
    """Folder to read: ``src`` itself, or its safe extraction into the download cache."""
    if src.is_dir():
        if sha256:
            raise ConfigError(f"dataset_params.{spec.name}.sha256 pins an archive, but {src} is a folder; "
                              "put the archive there instead or drop sha256")
        return src
    if sha256:
        verify(src, sha256=sha256, what=str(src))
    return safe_extract(src, Path(ctx.cache_dir) / spec.name / "extracted")


def find_root(tree: Path, folders: Sequence[str], max_depth: int = 4) -> Path:
    """The shallowest folder under ``tree`` holding every name in ``folders`` (exact, then any case)."""
    level = [tree]
    for _ in range(max_depth + 1):
        for d in level:
            names = {p.name for p in d.iterdir() if p.is_dir()}
            if all(f in names for f in folders):
                return d
            lower = {n.lower() for n in names}
            if all(f.lower() in lower for f in folders):
                return d
        level = sorted(p for d in level for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not level:
            break
    raise ConfigError(f"{tree}: no folder holding {', '.join(repr(f) for f in folders)} "
                      f"(searched {max_depth} levels deep); is this the right archive?")


def _child(parent: Path, name: str) -> Optional[Path]:
    """Sub-folder ``name`` of ``parent``, matched exactly, else ignoring case."""
    if (parent / name).is_dir():
        return parent / name
    for p in parent.iterdir():
        if p.is_dir() and p.name.lower() == name.lower():
            return p
    return None


def _images_in(folder: Path) -> List[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
                  and not p.name.startswith("."))


def read_domain(spec: ManualSet, root: Path, folder: str) -> Tuple[List[Path], np.ndarray]:
    """Image paths and labels of one domain folder laid out as ``<class>/<image>``
    (or ``images/<class>/<image>``, Office-31's original layout); checks the class set."""
    dom = _child(root, folder)
    base = _child(dom, "images") if _child(dom, "images") is not None and _child(dom, spec.classes[0]) is None else dom
    present = {p.name.lower(): p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")}
    wanted = {c.lower() for c in spec.classes}
    missing = [c for c in spec.classes if c.lower() not in present]
    extra = sorted(p.name for k, p in present.items() if k not in wanted)
    if missing or extra:
        raise ConfigError(
            f"{spec.name}: {base} must hold exactly the {len(spec.classes)} class folders; "
            + (f"missing: {', '.join(missing[:10])}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected: {', '.join(extra[:10])}" if extra else ""))
    paths, labels = [], []
    for label, c in enumerate(spec.classes):
        files = _images_in(present[c.lower()])
        if not files:
            raise ConfigError(f"{spec.name}: {present[c.lower()]} holds no image")
        paths += files
        labels += [label] * len(files)
    return paths, np.asarray(labels, dtype=np.int64)


def check_count(spec: ManualSet, split: str, n: int, params: ManualParams, where: Path) -> None:
    want = spec.counts.get(split)
    if params.check_counts and want is not None and n != want:
        raise ConfigError(
            f"{spec.name}: {where} holds {n} images, the published {spec.title} has {want}; "
            f"a different release? Set `dataset_params: {{{spec.name}: {{check_counts: false}}}}` "
            "in params/data.yaml to accept it")


def _save(out: Path, split: str, paths: List[Path], labels: np.ndarray, root: Path, size: int) -> None:
    save_split(out, split, decode_images(paths, size), labels)
    rel = [p.relative_to(root).as_posix() for p in paths]
    (out / f"{split}_files.txt").write_text("\n".join(rel) + "\n")


def _storage(params: ManualParams) -> str:
    return f"3x{params.size}x{params.size} RGB, resized at fetch time (bilinear, aspect ratio not kept)"


# ---------------------------------------------------------- image-folder datasets


def folder_fetcher(spec: ManualSet):
    """Fetch for a dataset laid out as ``<domain>/<class>/<image>``: one split per domain."""

    def fetch(out: Path, ctx: FetchContext, params: ManualParams) -> dict:
        src = locate(spec, ctx)
        tree = unpack(spec, src, ctx, params.sha256)
        root = find_root(tree, list(spec.domains.values()))
        listed = {}
        for split, folder in spec.domains.items():  # check everything before decoding anything
            paths, labels = read_domain(spec, root, folder)
            check_count(spec, split, len(paths), params, root / folder)
            listed[split] = (paths, labels)
        for split, (paths, labels) in listed.items():
            _save(out, split, paths, labels, root, params.size)
        return {"origin": f"manual: {src.name}", "storage": _storage(params),
                "domains": {split: folder for split, folder in spec.domains.items()}}

    return fetch


# -------------------------------------------------------------------------- PACS

PACS_LISTS = ("train", "crossval", "test")


def _read_list(path: Path, spec: ManualSet, root: Path) -> List[Tuple[Path, int]]:
    rows = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise ConfigError(f"{path}:{line_no}: expected '<domain>/<class>/<file> <label 1-7>'")
        rel, label = parts[0], int(parts[1]) - 1  # the lists count classes from 1
        image = root / rel
        if not image.is_file():
            raise ConfigError(f"{path}:{line_no}: {image} does not exist")
        cls = Path(rel).parts[-2].lower() if len(Path(rel).parts) >= 2 else ""
        if not 0 <= label < len(spec.classes) or spec.classes[label] != cls:
            raise ConfigError(f"{path}:{line_no}: label {label + 1} does not match class folder {cls!r}")
        rows.append((image, label))
    return rows


def _fetch_pacs(out: Path, ctx: FetchContext, params: ManualParams) -> dict:
    spec = SETS["pacs"]
    src = locate(spec, ctx)
    tree = unpack(spec, src, ctx, params.sha256)
    root = find_root(tree, list(spec.domains.values()))
    listed, overlap = {}, {}
    for domain, folder in spec.domains.items():
        paths, _ = read_domain(spec, root, folder)
        check_count(spec, domain, len(paths), params, root / folder)
        lists = {}
        for which in PACS_LISTS:
            hits = sorted(tree.rglob(f"{folder}_{which}_kfold.txt"))
            if not hits:
                raise ConfigError(
                    f"pacs: official split list {folder}_{which}_kfold.txt not found under {tree}; the PACS "
                    f"release ships them beside the images (pacs_label/). Obtain it from {spec.where}, "
                    + NEXT_STEP.format(name="pacs"))
            lists[which] = _read_list(hits[0], spec, root)
        train = lists["train"]
        seen = {p for p, _ in train}
        # The official test list covers the whole domain (it serves leave-one-domain-out);
        # keep only images that are not in the train list, so no test image is trained on.
        test = [(p, y) for p, y in lists["test"] if p not in seen]
        overlap[domain] = len(lists["test"]) - len(test)
        for split, rows in ((f"{domain}_train", train), (f"{domain}_test", test)):
            listed[split] = ([p for p, _ in rows], np.asarray([y for _, y in rows], dtype=np.int64))
    for split, (paths, labels) in listed.items():
        _save(out, split, paths, labels, root, params.size)
    return {"origin": f"manual: {src.name}", "storage": _storage(params),
            "official_test_rows_also_in_train": overlap,
            "splits_note": "<domain>_test = the official *_test_kfold.txt minus the images of *_train_kfold.txt"}


# ------------------------------------------------------------------------ tables

OFFICE31_CLASSES = (
    "back_pack", "bike", "bike_helmet", "bookcase", "bottle", "calculator", "desk_chair", "desk_lamp",
    "desktop_computer", "file_cabinet", "headphones", "keyboard", "laptop_computer", "letter_tray",
    "mobile_phone", "monitor", "mouse", "mug", "paper_notebook", "pen", "phone", "printer", "projector",
    "punchers", "ring_binder", "ruler", "scissors", "speaker", "stapler", "tape_dispenser", "trash_can")
OFFICE_CALTECH_CLASSES = ("back_pack", "bike", "calculator", "headphones", "keyboard", "laptop_computer",
                          "monitor", "mouse", "mug", "projector")
OFFICE_HOME_CLASSES = (
    "Alarm_Clock", "Backpack", "Batteries", "Bed", "Bike", "Bottle", "Bucket", "Calculator", "Calendar",
    "Candles", "Chair", "Clipboards", "Computer", "Couch", "Curtains", "Desk_Lamp", "Drill", "Eraser",
    "Exit_Sign", "Fan", "File_Cabinet", "Flipflops", "Flowers", "Folder", "Fork", "Glasses", "Hammer",
    "Helmet", "Kettle", "Keyboard", "Knives", "Lamp_Shade", "Laptop", "Marker", "Monitor", "Mop", "Mouse",
    "Mug", "Notebook", "Oven", "Pan", "Paper_Clip", "Pen", "Pencil", "Postit_Notes", "Printer", "Push_Pin",
    "Radio", "Refrigerator", "Ruler", "Scissors", "Screwdriver", "Shelf", "Sink", "Sneakers", "Soda",
    "Speaker", "Spoon", "TV", "Table", "Telephone", "ToothBrush", "Toys", "Trash_Can", "Webcam")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")

SETS: Dict[str, ManualSet] = {s.name: s for s in (
    ManualSet(
        name="syn", title="SYN digits", aliases=("SYN", "syn_digits", "SynDigits"),
        domains={"train": "train", "test": "val"}, classes=tuple(str(d) for d in range(10)),
        where="the digit data of FedBN (github.com/med-air/FedBN) / RethinkFL (github.com/WenkeHuang/RethinkFL): "
              "a zip holding train/<digit>/ and val/<digit>/ image folders",
        licence="synthetic digits (Ganin & Lempitsky 2015); research use"),
    ManualSet(
        name="office_caltech", title="Office-Caltech-10",
        aliases=("office_caltech_10", "Office_Caltech_10", "OfficeCaltech10", "office-caltech"),
        domains={"amazon": "amazon", "caltech": "caltech", "dslr": "dslr", "webcam": "webcam"},
        classes=OFFICE_CALTECH_CLASSES, counts={"amazon": 958, "caltech": 1123, "dslr": 157, "webcam": 295},
        where="Gong et al. CVPR 2012 (GFK), e.g. the office_caltech_10 folders used by FedBN / FCCL "
              "(<domain>/<class>/<image>)",
        licence="research use; Office (Saenko et al. 2010) + Caltech-256 (Griffin et al. 2007)"),
    ManualSet(
        name="office31", title="Office-31",
        aliases=("Office31", "office-31", "OFFICE31", "domain_adaptation_images"),
        domains={"amazon": "amazon", "dslr": "dslr", "webcam": "webcam"}, classes=OFFICE31_CLASSES,
        counts={"amazon": 2817, "dslr": 498, "webcam": 795},
        where="Saenko et al. ECCV 2010: domain_adaptation_images.tar.gz (faculty.cc.gatech.edu/~judy/domainadapt)",
        licence="research use (Saenko et al. 2010)"),
    ManualSet(
        name="office_home", title="Office-Home",
        aliases=("OfficeHomeDataset_10072016", "OfficeHome", "office-home", "officehome"),
        domains={"art": "Art", "clipart": "Clipart", "product": "Product", "real_world": "Real World"},
        classes=OFFICE_HOME_CLASSES, counts={"art": 2427, "clipart": 4365, "product": 4439, "real_world": 4357},
        where="www.hemanthdv.org/officeHomeDataset.html (licence form; OfficeHomeDataset_10072016.zip)",
        licence="non-commercial research and education only (Venkateswara et al. 2017)"),
    ManualSet(
        name="pacs", title="PACS", aliases=("PACS", "pacs_data", "kfold"),
        domains={"photo": "photo", "art_painting": "art_painting", "cartoon": "cartoon", "sketch": "sketch"},
        classes=PACS_CLASSES, counts={"photo": 1670, "art_painting": 2048, "cartoon": 2344, "sketch": 3929},
        where="domaingeneralization.github.io (Li et al. ICCV 2017): the image folders (kfold/<domain>/<class>/) "
              "and the official lists <domain>_{train,crossval,test}_kfold.txt",
        licence="research use (Li et al. 2017)"),
)}

_FETCHERS = {"pacs": _fetch_pacs}
_DOCS = {
    "syn": "SYN digits, ~10,000 train / val images, 10 classes (manual)",
    "office_caltech": "Office-Caltech-10: amazon 958, caltech 1,123, dslr 157, webcam 295; 10 classes (manual)",
    "office31": "Office-31: amazon 2,817, dslr 498, webcam 795; 31 classes (manual)",
    "office_home": "Office-Home: Art 2,427, Clipart 4,365, Product 4,439, Real World 4,357; 65 classes (manual)",
    "pacs": "PACS: photo 1,670, art_painting 2,048, cartoon 2,344, sketch 3,929; 7 classes, official splits (manual)",
}

for _spec in SETS.values():
    DATASETS.add(_spec.name, DatasetSpec(
        name=_spec.name, fetch=_FETCHERS.get(_spec.name) or folder_fetcher(_spec), num_classes=len(_spec.classes),
        source=f"manual: {_spec.where}", licence=_spec.licence, offline=False, doc=_DOCS[_spec.name],
        params=ManualParams,
        manual=(f"put {expected_files(_spec, Path('data'))} into data/, "
                "then `dvc add data && dvc repro`")))
