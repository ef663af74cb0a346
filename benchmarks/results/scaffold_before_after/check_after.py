"""The same independent checks on the docs/extending.md SCAFFOLD block, with today's API (see README.md)."""
import sys
import tempfile
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
from fedshift.testing import build_tiny_data, resumed_round_three, tiny_federation  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[3] / "tests")]
from _shared import record_grads  # noqa: E402
from test_method_contract import _doc_scaffold  # noqa: E402

_, Scaffold = _doc_scaffold()  # the docs block, read and executed as tests/test_method_contract.py does
from fedshift.methods.base import ServerParams  # noqa: E402

ARCHS = ("lenet",) * 4
ENG = dict(optimizer="sgd", momentum=0.0, lr=0.05, weight_decay=0.0, lr_gamma=0.5, public_aug="none")
t0 = time.time()
root = build_tiny_data(Path(tempfile.mkdtemp(prefix="scaffold_after_")) / "build")




def check(eval_models, rounds=3, **engine):
    fed = tiny_federation(root, ARCHS, scoring={"eval_models": eval_models, "weighting": "uniform"}, **{**ENG, **engine})
    m = Scaffold(ServerParams())
    fed.setup(m)
    store = {}
    record_grads(fed, store)
    for r in range(1, rounds + 1):
        store.clear()
        c_i0, c0 = {k: dict(v) for k, v in m.c_i.items()}, dict(m.c)
        fed.run_round(r)
        worst = max(float((m.c_i[k][n] - (c_i0[k][n] - c0[n] + s["g"][n] / s["K"])).abs().max())
                    for k, s in store.items() for n in m.c)
        mean_ci = {n: sum(m.c_i[k][n] for k in m.c_i) / len(m.c_i) for n in m.c}
        inv = max(float((m.c[n] - mean_ci[n]).abs().max()) for n in m.c)
        print(f"  {eval_models} r{r}: K={ {k: v['K'] for k, v in store.items()} } |c_i+ - independent| max={worst:.2e} "
              f"|c - mean c_i| max={inv:.2e} |c|={sum(float(v.norm()) for v in m.c.values()):.3f}")
        assert worst < 1e-4 and inv < 1e-6


for proto in ("global", "local"):
    print(f"protocol {proto}:")
    check(proto)
print("global, clients_per_round 2:")
check("global", clients_per_round=2)
for proto in ("global", "local"):
    def build(proto=proto):
        fed = tiny_federation(root, ARCHS, scoring={"eval_models": proto, "weighting": "uniform"}, **ENG)
        m = Scaffold(ServerParams())
        fed.setup(m)
        return fed, m
    resumed_round_three(build, Path(tempfile.mkdtemp()) / "ckpt.pt")
    print(f"resumed_round_three ({proto}): ok")

fed = tiny_federation(root, ARCHS, scoring={"weighting": "uniform"}, on_nonfinite="skip_batch", **ENG)
orig_ok, seen = fed.step_ok, set()


def step_ok(loss, participant, term):
    if participant == "m0" and (fed.round, participant) not in seen:
        seen.add((fed.round, participant))
        fed.checked_batches += 1
        fed.skipped_batches += 1
        return False
    return orig_ok(loss, participant, term)


fed.step_ok = step_ok
m = Scaffold(ServerParams())
fed.setup(m)
store = {}
record_grads(fed, store)
fed.run_round(1)
err = {k: f"{max(float((m.c_i[k][n] - s['g'][n] / s['K']).abs().max()) for n in m.c):.1e}" for k, s in store.items()}
print(f"skip_batch: engine steps = { {k: v['K'] for k, v in store.items()} }; |c_i+ - independent| max = {err}")
print(f"total {time.time() - t0:.1f}s")
