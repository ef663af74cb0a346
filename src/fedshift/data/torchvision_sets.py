"""Datasets published as the files torchvision's dataset classes read and check.

MNIST, Fashion-MNIST, USPS, SVHN, CIFAR-10 and CIFAR-100 (FCCL+ Digits and public sets;
FedMMD/FedFusion partitions). The URLs and md5 sums are torchvision's own class
tables. Each file is fetched by :func:`fedshift.data.download.download` (mirror,
retries, md5, temporary name + rename; torchvision's downloader writes in place and
extracts tars without checking members) into ``<cache>/<dataset>/`` laid out as
torchvision expects; archives are unpacked by :func:`~fedshift.data.download.safe_extract`.
The torchvision class then parses the files with ``download=False``, so its own checks
still run (CIFAR's per-batch md5, SVHN's md5, the MNIST idx magic numbers); it is
subclassed under the same name with the URL/mirror attributes pointing at the mirror
and the md5 tables taken from :func:`expected_md5`.

Tests serve generated files in the real formats and put their digests into
:data:`MD5_OVERRIDES`: no network is mocked. Images are stored at native size
(MNIST 1x28x28, USPS 1x16x16, SVHN/CIFAR 3x32x32); scenarios convert them with
:func:`fedshift.data.scenarios.common.to_format`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from .download import REMEDY, DownloadError, decompress, download, mirrored, mirrored_base, safe_extract
from .registry import DATASETS, DatasetSpec, FetchContext
from .store import save_split

# dataset -> {file name: md5} replacing torchvision's entries (tests, private re-packs)
MD5_OVERRIDES: Dict[str, Dict[str, str]] = {}


def expected_md5(dataset: str, filename: str, default: Optional[str]) -> Optional[str]:
    return MD5_OVERRIDES.get(dataset, {}).get(filename, default)


def _tv(cls_name: str):
    import torchvision.datasets as tvd  # lazy: `fedshift list` should not pay for it

    return getattr(tvd, cls_name)


def _patched(cls, **attrs):
    """Subclass keeping the class name (MNIST's raw folder is ``<root>/<ClassName>/raw``)."""
    return type(cls.__name__, (cls,), attrs)


def _open(make: Callable, dataset: str, root: Path):
    try:
        return make()
    except (RuntimeError, AssertionError, ValueError, KeyError, OSError, EOFError, pickle.UnpicklingError) as exc:
        raise DownloadError(f"{dataset}: files under {root} are corrupt or incomplete "
                            f"({type(exc).__name__}: {exc}); delete that folder and rerun") from None


def _fetch_file(urls: List[str], dest: Path, md5: Optional[str]) -> Path:
    """Try each URL in turn (torchvision lists several MNIST mirrors); the first that verifies wins."""
    errors = []
    for url in urls:
        try:
            return download(url, dest, md5=md5)
        except DownloadError as exc:
            if len(urls) == 1:
                raise
            errors.append(f"{url} ({exc.reason})")
    raise DownloadError(f"could not download {dest.name} from any of {'; '.join(errors)}. "
                        + REMEDY.format(dest=dest))


def _version() -> str:
    from importlib.metadata import version

    return "torchvision " + version("torchvision")


def _record(files: Dict[str, Dict[str, Optional[str]]], dataset: str, cls_name: str) -> dict:
    # Canonical URLs only: the manifest must not depend on which mirror served the bytes.
    return {"origin": f"{_version()} {cls_name}", "downloads": files}


# ---------------------------------------------------------------- MNIST, Fashion-MNIST


def _idx_fetcher(name: str, cls_name: str):
    def fetch(out: Path, ctx: FetchContext, params) -> dict:
        cls = _tv(cls_name)
        root = Path(ctx.cache_dir) / name
        raw = root / cls_name / "raw"
        bases = [mirrored_base(cls.mirrors[0], name, ctx.mirror)] if ctx.mirror else list(cls.mirrors)
        resources = [(fn, expected_md5(name, fn, md5)) for fn, md5 in cls.resources]
        files = {}
        for fn, md5 in resources:
            gz = _fetch_file([base + fn for base in bases], raw / fn, md5)
            decompress(gz, raw / fn[: -len(".gz")])  # what torchvision's MNIST reads
            files[fn] = {"url": cls.mirrors[0] + fn, "md5": md5}
        ds_cls = _patched(cls, mirrors=bases, resources=resources)
        for split, train in (("train", True), ("test", False)):
            ds = _open(lambda: ds_cls(str(root), train=train, download=False), name, raw)
            save_split(out, split, ds.data.numpy()[:, None].copy(), ds.targets.numpy().astype(np.int64))
        return _record(files, name, cls_name)

    return fetch


# ------------------------------------------------------------------------------ USPS


def _fetch_usps(out: Path, ctx: FetchContext, params) -> dict:
    cls = _tv("USPS")
    root = Path(ctx.cache_dir) / "usps"
    table, files = {}, {}
    for split, (url, fn, md5) in cls.split_list.items():
        md5 = expected_md5("usps", fn, md5)
        download(mirrored(url, "usps", ctx.mirror), root / fn, md5=md5)
        table[split] = [mirrored(url, "usps", ctx.mirror), fn, md5]
        files[fn] = {"url": url, "md5": md5}
    ds_cls = _patched(cls, split_list=table)
    for split, train in (("train", True), ("test", False)):
        ds = _open(lambda: ds_cls(str(root), train=train, download=False), "usps", root)
        save_split(out, split, np.ascontiguousarray(ds.data[:, None]), np.asarray(ds.targets, dtype=np.int64))
    return _record(files, "usps", "USPS")


# ------------------------------------------------------------------------------ SVHN


@dataclass(frozen=True)
class SvhnParams:
    extra: bool = False  # also fetch the 531,131-image "extra" split (FCCL+ uses train/test only)


def _fetch_svhn(out: Path, ctx: FetchContext, params: SvhnParams) -> dict:
    cls = _tv("SVHN")
    root = Path(ctx.cache_dir) / "svhn"
    wanted = ("train", "test", "extra") if params.extra else ("train", "test")
    table, files = {}, {}
    for split in wanted:
        url, fn, md5 = cls.split_list[split]
        md5 = expected_md5("svhn", fn, md5)
        download(mirrored(url, "svhn", ctx.mirror), root / fn, md5=md5)
        table[split] = [mirrored(url, "svhn", ctx.mirror), fn, md5]
        files[fn] = {"url": url, "md5": md5}
    ds_cls = _patched(cls, split_list=table)
    for split in wanted:
        ds = _open(lambda: ds_cls(str(root), split=split, download=False), "svhn", root)
        save_split(out, split, np.ascontiguousarray(ds.data, dtype=np.uint8), np.asarray(ds.labels, dtype=np.int64))
    return _record(files, "svhn", "SVHN")


# ------------------------------------------------------------------- CIFAR-10 / 100


def _cifar_fetcher(name: str, cls_name: str):
    def fetch(out: Path, ctx: FetchContext, params) -> dict:
        cls = _tv(cls_name)
        root = Path(ctx.cache_dir) / name
        md5 = expected_md5(name, cls.filename, cls.tgz_md5)
        archive = download(mirrored(cls.url, name, ctx.mirror), root / cls.filename, md5=md5)
        tree = safe_extract(archive, root / "extracted")
        ds_cls = _patched(
            cls, url=mirrored(cls.url, name, ctx.mirror), tgz_md5=md5,
            train_list=[[fn, expected_md5(name, fn, m)] for fn, m in cls.train_list],
            test_list=[[fn, expected_md5(name, fn, m)] for fn, m in cls.test_list],
            meta={**cls.meta, "md5": expected_md5(name, cls.meta["filename"], cls.meta["md5"])},
        )
        for split, train in (("train", True), ("test", False)):
            ds = _open(lambda: ds_cls(str(tree), train=train, download=False), name, tree)
            images = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))  # N x H x W x C -> N x C x H x W
            save_split(out, split, images, np.asarray(ds.targets, dtype=np.int64))
        return _record({cls.filename: {"url": cls.url, "md5": md5}}, name, cls_name)

    return fetch


# ------------------------------------------------------------------------ registry

_LECUN = "http://yann.lecun.com/exdb/mnist/ (torchvision mirror ossci-datasets.s3.amazonaws.com)"

DATASETS.add("mnist", DatasetSpec(
    name="mnist", fetch=_idx_fetcher("mnist", "MNIST"), num_classes=10,
    source=f"torchvision.datasets.MNIST: {_LECUN}", licence="CC BY-SA 3.0 (LeCun, Cortes, Burges)",
    offline=False, doc="MNIST 60,000 / 10,000, 1x28x28 grey"))
DATASETS.add("fashion_mnist", DatasetSpec(
    name="fashion_mnist", fetch=_idx_fetcher("fashion_mnist", "FashionMNIST"), num_classes=10,
    source="torchvision.datasets.FashionMNIST: fashion-mnist.s3-website.eu-central-1.amazonaws.com",
    licence="MIT (Zalando Research)", offline=False, doc="Fashion-MNIST 60,000 / 10,000, 1x28x28 grey"))
DATASETS.add("usps", DatasetSpec(
    name="usps", fetch=_fetch_usps, num_classes=10,
    source="torchvision.datasets.USPS: www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets (usps.bz2, usps.t.bz2)",
    licence="no licence stated; research use, cite Hull 1994", offline=False,
    doc="USPS 7,291 / 2,007, 1x16x16 grey"))
DATASETS.add("svhn", DatasetSpec(
    name="svhn", fetch=_fetch_svhn, num_classes=10, params=SvhnParams,
    source="torchvision.datasets.SVHN: ufldl.stanford.edu/housenumbers (train_32x32.mat, test_32x32.mat)",
    licence="non-commercial use only (Netzer et al. 2011)", offline=False,
    doc="SVHN 73,257 / 26,032, 3x32x32 (digit 0 has label 0)"))
DATASETS.add("cifar10", DatasetSpec(
    name="cifar10", fetch=_cifar_fetcher("cifar10", "CIFAR10"), num_classes=10,
    source="torchvision.datasets.CIFAR10: www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    licence="no licence stated; free for research, cite Krizhevsky 2009", offline=False,
    doc="CIFAR-10 50,000 / 10,000, 3x32x32"))
DATASETS.add("cifar100", DatasetSpec(
    name="cifar100", fetch=_cifar_fetcher("cifar100", "CIFAR100"), num_classes=100,
    source="torchvision.datasets.CIFAR100: www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    licence="no licence stated; free for research, cite Krizhevsky 2009", offline=False,
    doc="CIFAR-100 50,000 / 10,000, 3x32x32, fine labels"))
