"""Helpers of benchmarks/gpu_session.sh (issue 41's one GPU session); not a test.

    python benchmarks/gpu_session.py env                      # versions, the GPU, a tiny CUDA op
    python benchmarks/gpu_session.py fedh2l ROUNDS on|off     # FedH2L Table II run, fused nodes or not

A GPU node may lack jsonschema, mlflow, snakemake and dvc: nothing here imports them. The
experiments schema check (jsonschema) is skipped when jsonschema is missing: the grids are
validated by CI, and this only times them.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def env() -> None:
    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA build {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads")
    for name in ("numpy", "yaml", "pandas", "scipy", "sklearn", "mlflow", "snakemake", "dvc", "jsonschema",
                 "mlxtend", "triton"):
        try:
            mod = __import__(name)
            print(f"  {name} {getattr(mod, '__version__', '?')}")
        except Exception as exc:  # noqa: BLE001 - a report, whatever the failure
            print(f"  {name}: missing ({type(exc).__name__})")
    if not torch.cuda.is_available():
        print("CUDA: not available")
        return
    p = torch.cuda.get_device_properties(0)
    print(f"CUDA: {torch.cuda.device_count()} device(s); 0 = {p.name}, {p.total_memory / 2 ** 30:.1f} GiB, "
          f"{p.multi_processor_count} SMs, capability {p.major}.{p.minor}; bf16 {torch.cuda.is_bf16_supported()}")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    print(f"  bf16 4096^3 matmul: {10 * 2 * 4096 ** 3 / (time.perf_counter() - t) / 1e12:.0f} TFLOP/s (incl. warm-up)")
    import fedshift  # noqa: F401  - the package imports without the pipeline tools
    from fedshift import runner  # noqa: F401

    print("  fedshift and fedshift.runner import")


def _without_jsonschema() -> None:
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        import fedshift.experiments as experiments

        experiments.validate_schema = lambda *a, **k: None
        print("(jsonschema missing here: the experiments schema check is skipped; CI validates the grids)")


def fedh2l(rounds: int, fused: str, method: str = "fedh2l", scenario: str = "rotmnist_a10") -> None:
    manifest = ROOT / "build" / "partitions" / scenario / "manifest.json"
    if not manifest.exists():
        print(f"skipped: {manifest.relative_to(ROOT)} missing (carry build/partitions/{scenario} to the GPU node)")
        sys.exit(3)
    _without_jsonschema()
    import torch
    import fedh2l_run_time

    os.chdir(ROOT)
    fedh2l_run_time.main(method, scenario, rounds, fused)
    if torch.cuda.is_available():
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2 ** 20:.0f} MiB")


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "env":
        env()
    elif cmd == "fedh2l":
        fedh2l(int(rest[0]), rest[1], *rest[2:])
    else:
        raise SystemExit(f"unknown step {cmd!r}: env | fedh2l")
