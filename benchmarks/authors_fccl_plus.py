"""The authors' FCCL+ code on bench_vs_reference.py's workload, in this process (not a test).

Drives a checkout of the authors' repository (github.com/WenkeHuang/FCCL, folder ``fccl+/``;
the user fetches it, it is never vendored here) **without modifying it**: their backbones
(``FedLeaDigits.get_backbone``: ResNet10, ResNet12, EfficientNetB0, MobileNetV2 for the
heterogeneous Digits structure, as their ``main.py``), their ``FCCLPLUS`` class with their
``best_args['fl_digits']['fcclplus']`` (local_epoch set to the workload's one epoch), their
transforms (``FedLeaDigits.Nor_TRANSFORM`` on the private sets, ``PublicCIFAR100.Nor_TRANSFORM``
= their ``pub_aug: weak`` on the public set, their test transform) applied per sample to PIL
images, their loaders' shapes (public: SubsetRandomSampler, batch 256, ``num_workers=4``;
private: SubsetRandomSampler, batch 128; test: batch 128 in order), and their
``utils.training.evaluate``. What replaces their datasets is only where the pixels come from:
bench_vs_reference.synthetic's tensors (the same images fedshift trains on), turned into PIL
images as their ``MyDigits.__getitem__`` does (``Image.fromarray(..., mode='RGB')``).

Phases timed as bench_vs_reference's worker times fedshift's: ``collab`` = their
``col_update``, ``local`` = their ``loc_update``, ``eval`` = their ``evaluate``; ``whole`` is
measured by the parent (process start to exit).

Their code is imported from a scratch folder holding links to their ``models/``,
``datasets/``, ``backbone/`` and ``utils/`` (their ``get_all_models`` lists ``models`` in the
working folder, and ``FederatedModel`` creates ``./checkpoint/``), so nothing is written into
the user's checkout.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Dict

PACKAGES = ("models", "datasets", "backbone", "utils")


def fccl_plus_folder(path: Path) -> Path:
    """The authors' ``fccl+`` folder: ``path`` itself or ``path/fccl+`` (a clone of the repository)."""
    path = Path(path).expanduser().resolve()
    for cand in (path, path / "fccl+"):
        if all((cand / p).is_dir() for p in PACKAGES) and (cand / "models" / "fcclplus.py").is_file():
            return cand
    raise SystemExit(f"--authors {path}: neither it nor {path / 'fccl+'} holds the authors' FCCL+ code "
                     f"({', '.join(PACKAGES)} folders and models/fcclplus.py); clone it with "
                     "`git clone https://github.com/WenkeHuang/FCCL` and pass the clone")


def _import_authors(folder: Path, scratch: Path):
    for p in PACKAGES:
        (scratch / p).symlink_to(folder / p, target_is_directory=True)
    os.chdir(scratch)
    # as their main.py extends sys.path (working folder first: datasets/utils must not shadow utils)
    sys.path[:0] = [str(scratch), *(str(scratch / p) for p in ("datasets", "backbone", "models"))]
    try:
        from datasets.cifar100 import PublicCIFAR100
        from datasets.digits import FedLeaDigits
        from models import get_model
        from utils.best_args import best_args
        from utils.training import evaluate
    except ImportError as exc:
        raise SystemExit(f"the authors' code at {folder} needs the Python package {exc.name!r}: install it in this "
                         "environment (it is not a fedshift dependency)") from None
    return FedLeaDigits, PublicCIFAR100, get_model, best_args, evaluate


def worker(spec: Dict, synthetic) -> Dict:
    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler

    torch.set_num_threads(spec["threads"])
    folder = fccl_plus_folder(Path(spec["authors"]))
    scratch = Path(tempfile.mkdtemp(prefix="fedshift-authors-"))
    FedLeaDigits, PublicCIFAR100, get_model, best_args, evaluate = _import_authors(folder, scratch)

    class Pixels(Dataset):
        """uint8 N x 3 x H x W tensors served as their datasets serve theirs: PIL, then their transform."""

        def __init__(self, images, labels, transform):
            self.images = images.permute(0, 2, 3, 1).contiguous().numpy()
            self.labels = labels.tolist() if labels is not None else [0] * len(self.images)
            self.transform = transform

        def __len__(self):
            return len(self.images)

        def __getitem__(self, i):
            return self.transform(Image.fromarray(self.images[i], mode="RGB")), self.labels[i]

    np.random.seed(0)
    torch.manual_seed(0)
    data = synthetic(spec["sizes"])
    args = Namespace(device_id=0, parti_num=4, model="fcclplus", structure="heterogeneity", dataset="fl_digits",
                     public_dataset="pub_cifar100", public_len=len(data.public), pub_aug="weak", seed=0,
                     csv_log=False, get_time=False, **best_args["fl_digits"]["fcclplus"][-1])
    args.local_epoch = 1  # the workload: one round of one local epoch
    names = ["resnet10", "resnet12", "efficient", "mobilnet"]  # their main.py, fl_digits heterogeneity
    nets = FedLeaDigits.get_backbone(4, names)
    import torchvision.transforms as T

    test_tf = T.Compose([T.Resize((32, 32)), T.ToTensor(), FedLeaDigits.get_normalization_transform()])
    model = get_model(nets, args, FedLeaDigits.get_transform())
    private = [DataLoader(Pixels(*c.splits["private"], FedLeaDigits.Nor_TRANSFORM), batch_size=args.local_batch_size,
                          sampler=SubsetRandomSampler(np.random.permutation(len(c.splits["private"][1]))))
               for c in data.clients]
    test = [DataLoader(Pixels(*c.splits["test"], test_tf), batch_size=args.local_batch_size, shuffle=False)
            for c in data.clients]
    public = DataLoader(Pixels(data.public, None, PublicCIFAR100.Nor_TRANSFORM), batch_size=args.public_batch_size,
                        sampler=SubsetRandomSampler(np.random.permutation(len(data.public))), num_workers=4)
    model.trainloaders, model.testlodaers = private, test
    model.ini()
    model.epoch_index = 0
    out: Dict = {"archs": names, "threads": torch.get_num_threads(), "authors": str(folder)}

    def usage():  # their public loader's 4 worker processes count too (children, once reaped)
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + c.ru_utime, s.ru_stime + c.ru_stime, s.ru_maxrss

    def timed(name, fn):
        (u0, s0, _), t0 = usage(), time.perf_counter()
        res = fn()
        u1, s1, rss = usage()
        out[name] = {"wall": time.perf_counter() - t0, "user": u1 - u0, "sys": s1 - s0, "rss_gb": rss / 2**20}
        return res

    sink = open(os.devnull, "w")  # their tqdm bars and prints go to the terminal; keep stdout for the JSON line
    real_stdout, sys.stdout = sys.stdout, sink
    try:
        timed("collab", lambda: model.col_update(0, public))
        timed("local", lambda: model.loc_update(private))
        intra, inter = timed("eval", lambda: evaluate(model, test, FedLeaDigits.SETTING, FedLeaDigits.NAME))
    finally:
        sys.stdout = real_stdout
    out["accuracy"] = {"intra": [float(a) for a in intra], "inter": [float(a) for a in inter]}
    u, s, rss = usage()
    out["process"] = {"user": u, "sys": s, "rss_gb": rss / 2**20}
    return out
