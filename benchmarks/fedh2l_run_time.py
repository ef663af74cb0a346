"""Wall time of one full-schedule FedH2L Table II run (params/papers/fedh2l_table2.yaml), on one thread.

    python benchmarks/fedh2l_run_time.py [method] [scenario] [rounds] [fused_clients: off|on]

Prints the wall and CPU time (the CPU time is the figure to extrapolate on a loaded machine), the split between training and evaluation, the time per round and the
headline Avg ACC / WDP / CDP; needs `dvc repro` (the rotmnist_a* partitions) first.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from fedshift import runner
from fedshift.experiments import load_experiments, load_yaml


def merged_config() -> dict:
    base, grid = load_yaml("params/experiments.yaml"), load_yaml("params/papers/fedh2l_table2.yaml")

    def merge(a, b):  # as Snakemake merges --configfile into the Snakefile's configfile
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return merge(base, grid)


def main(method: str = "fedh2l", scenario: str = "rotmnist_a10", rounds: int = 0, fused: str = "off") -> None:
    torch.set_num_threads(1)
    plan = load_experiments(merged_config(), "params/data.yaml")
    cfg = next(c for j, c in plan.federate.items() if j.method == method and j.scenario == scenario and j.seed == 0)
    if rounds:
        cfg["engine"]["rounds"] = rounds
    cfg["engine"]["fused_clients"] = fused  # the nodes' local step vmapped (engine/fused.py)
    with tempfile.TemporaryDirectory() as tmp:
        t, cpu = time.time(), time.process_time()
        m = runner.run_federate(cfg, Path(tmp) / "run")
        wall, cpu = time.time() - t, time.process_time() - cpu
    r = cfg["engine"]["rounds"]
    h = m["headline"]
    print(f"{method} on {scenario} (fused_clients: {fused}): {r} rounds in {wall:.1f} s wall, {cpu:.1f} s CPU ({1000 * wall / r:.2f} / "
          f"{1000 * cpu / r:.2f} ms/round wall / CPU); "
          f"train {m['timings']['train_s']:.1f} s, eval {m['timings']['eval_s']:.1f} s; "
          f"avg ACC {h['avg/acc']:.4f} WDP {h['avg/wdp']:.4f} CDP {h['avg/cdp']:.4f}")
    if "communication" in m:
        print("communication:", m["communication"])


if __name__ == "__main__":
    main(*(sys.argv[1:3]), *(int(a) for a in sys.argv[3:4]), *sys.argv[4:5])
