"""Cost of the resumable-run protocol on a demo-sized job: checkpoint size and seconds per
round, and the time the manifest sha256 check takes (printed, not asserted).

    python benchmarks/checkpoint_cost.py [--method fccl_plus] [--rounds 3] [--out /tmp/ckpt-bench]

Uses params/experiments.yaml and params/data.yaml (run `dvc repro` first), structure
demo_mixed on rotmnist x photo_patches, tracking off.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from fedshift.data import store
from fedshift import runner
from fedshift.experiments import load_experiments


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="fccl_plus")
    ap.add_argument("--structure", default="demo_mixed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="/tmp/ckpt-bench")
    args = ap.parse_args()
    plan = load_experiments(Path("params/experiments.yaml"), Path("params/data.yaml"))
    cfg = next(c for c in plan.federate.values() if c["method"] == args.method and c["structure"] == args.structure)
    cfg["engine"]["rounds"] = args.rounds
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    folders = [Path(cfg["paths"]["partition"])] + ([Path(cfg["paths"]["public"])] if cfg["paths"]["public"] else [])
    size = sum(p.stat().st_size for f in folders for p in f.rglob("*") if p.is_file())
    t = time.time()
    for f in folders:
        store.verify_manifest(f)
    print(f"manifest sha256 check: {time.time() - t:.3f} s for {size / 1e6:.1f} MB ({', '.join(map(str, folders))})")
    m = runner.run_federate(cfg, out)
    tm = m["timings"]
    n_ckpt = args.rounds - 1  # the last round publishes outputs instead
    per_round_train = tm["train_s"] / args.rounds
    print(f"{args.method} / {args.structure}: checkpoint {tm.get('checkpoint_bytes', 0) / 1e6:.2f} MB, "
          f"{tm['checkpoint_s'] / max(n_ckpt, 1):.3f} s per checkpoint ({n_ckpt} written), "
          f"training {per_round_train:.1f} s per round -> +{100 * tm['checkpoint_s'] / max(n_ckpt, 1) / per_round_train:.1f}%"
          f"; in-job verify {tm['verify_s']:.3f} s; models.pt {(out / 'models.pt').stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
