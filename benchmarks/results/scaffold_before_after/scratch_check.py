"""Tiny in-process checks of scratch_scaffold.py under the API before issue 49 (run with that checkout's src/ on
PYTHONPATH; see README.md)."""
import sys
import tempfile
import time
from pathlib import Path

import torch

torch.set_num_threads(1)

from fedshift.engine.config import EngineConfig  # noqa: E402
from fedshift.engine.fused import plan_check  # noqa: E402
from fedshift.engine.sampling import check_engine  # noqa: E402
from fedshift.testing import build_tiny_data, resumed_round_three, tiny_federation  # noqa: E402

from fedshift.methods.base import ServerParams as ScaffoldParams  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))  # scratch_scaffold, _shared: beside this file
from _shared import record_grads  # noqa: E402
from scratch_scaffold import Scaffold  # noqa: E402

ARCHS = ("lenet",) * 4
ENG = dict(optimizer="sgd", momentum=0.0, lr=0.05, weight_decay=0.0, lr_gamma=0.5, public_aug="none")
t0 = time.time()
root = build_tiny_data(Path(tempfile.mkdtemp(prefix="scaffold_before_")) / "build")
print(f"tiny data built in {time.time() - t0:.1f}s")




def check_protocol(eval_models, rounds=3, **engine):
    fed = tiny_federation(root, ARCHS, **{**ENG, **engine})
    m = Scaffold(ScaffoldParams(eval_models=eval_models, weighting="uniform"))
    m.setup(fed)
    store = {}
    record_grads(fed, store)
    for r in range(1, rounds + 1):
        fed.round = r
        store.clear()
        c_i_before = {k: dict(v) for k, v in m.c_i.items()}
        c_before = dict(m.c)
        losses = m.run_round(fed, r)
        lr = 0.05 * 0.5 ** (r - 1)
        # option II, checked independently: c_i+ = c_i - c + (x - y)/(K lr) = c_i - c + mean of the steps'
        # corrected gradients (plain SGD): K and lr the plugin used must be the engine's
        worst = 0.0
        for name, s in store.items():
            for n in m.c:
                expect = c_i_before[name][n] - c_before[n] + s["g"][n] / s["K"]
                worst = max(worst, float((m.c_i[name][n] - expect).abs().max()))
        untouched = [c.name for c in fed.clients if c.name not in store]
        for name in untouched:
            assert all(torch.equal(m.c_i[name][n], c_i_before[name][n]) for n in m.c), name
        # c = (1/N) sum_i c_i (every c_i and c start at 0, and c moves by (1/N) sum of the changes)
        mean_ci = {n: sum(m.c_i[k][n] for k in m.c_i) / len(m.c_i) for n in m.c}
        inv = max(float((m.c[n] - mean_ci[n]).abs().max()) for n in m.c)
        cnorm = sum(float(v.norm()) for v in m.c.values())
        states = [cl.model.state_dict() for cl in fed.clients]
        same = all(torch.equal(states[0][k], s[k]) for s in states[1:] for k in s)
        print(f"  {eval_models} r{r}: lr={lr:g} K={ {k: v['K'] for k, v in store.items()} } "
              f"|c_i+ - independent| max={worst:.2e}  |c - mean c_i| max={inv:.2e}  |c|={cnorm:.3f}  "
              f"untrained={untouched} models identical after round={same} "
              f"loss={sum(losses.values()) / len(losses):.3f}")
        assert worst < 1e-4 and inv < 1e-6 and cnorm > 0
        assert same == (eval_models == "global")
    return fed, m


for proto in ("global", "local"):
    print(f"protocol {proto}:")
    t = time.time()
    check_protocol(proto)
    print(f"  ran 3 rounds in {time.time() - t:.1f}s")
print("global with engine.clients_per_round: 2 (sampling):")
check_protocol("global", clients_per_round=2)

for proto in ("global", "local"):
    def build(proto=proto):
        fed = tiny_federation(root, ARCHS, **ENG)
        m = Scaffold(ScaffoldParams(eval_models=proto, weighting="uniform"))
        m.setup(fed)
        return fed, m

    (f1, m1), (f2, m2) = resumed_round_three(build, Path(tempfile.mkdtemp()) / "ckpt.pt")
    assert all(torch.equal(m1.c[n], m2.c[n]) for n in m1.c)
    assert all(torch.equal(m1.c_i[k][n], m2.c_i[k][n]) for k in m1.c_i for n in m1.c)
    print(f"resumed_round_three ({proto}): round 3 metrics, weights, c and c_i identical after restore")

# What the old `fedshift validate` checks of a method (experiments.py:463-487) with the engine's default
# optimiser (adam, momentum 0.9): nothing refuses it; only the plugin's own setup() does, at job start.
m = Scaffold(ScaffoldParams())
check_engine(m, EngineConfig())
plan_check(m, list(ARCHS), "default", "off", "cpu")
print("old validate's method checks (check_engine, plan_check) with optimizer adam / momentum 0.9: accepted")
try:
    m.setup(tiny_federation(root, ARCHS))
    print("setup accepted adam?!")
    sys.exit(1)
except ValueError as exc:
    print(f"setup() at job start refuses it: {exc}")


# The trap of the old docs: the server's hook is aggregate(), which is not called under eval_models: local.
class NaiveScaffold(Scaffold):
    name = "scaffold_naive"

    def after_round(self, fed, r):
        FedAvg_after_round(self, fed, r)

    def aggregate(self, fed, average, global_state):
        lr = fed.make_optimizer(fed.clients[0].model).param_groups[0]["lr"]
        c = self.c
        for cl in fed.clients:
            y = dict(cl.model.named_parameters())
            c_new = {n: self.c_i[cl.name][n] - c[n] + (self._x[n] - y[n].detach())
                     / (max(self._steps.get(cl.name, 0), 1) * lr) for n in self.c}
            self.c = {n: self.c[n] + (c_new[n] - self.c_i[cl.name][n]) / len(fed.clients) for n in self.c}
            self.c_i[cl.name] = c_new
        return average


from fedshift.methods.fedavg import FedAvg  # noqa: E402

FedAvg_after_round = FedAvg.after_round
for proto in ("global", "local"):
    fed = tiny_federation(root, ARCHS, **ENG)
    m = NaiveScaffold(NaiveScaffold.Params(eval_models=proto, weighting="uniform"))
    m.setup(fed)
    for r in (1, 2):
        fed.round = r
        m.run_round(fed, r)
    print(f"naive variant (control update in aggregate), {proto}: |c| after 2 rounds = "
          f"{sum(float(v.norm()) for v in m.c.values()):.4f}, |c_i| = "
          f"{sum(float(v.norm()) for s in m.c_i.values() for v in s.values()):.4f}")
print(f"total {time.time() - t0:.1f}s")


# engine.on_nonfinite: skip_batch: a skipped batch still calls local_loss, so the plugin's K_i (calls counted)
# is not the engine's step count. Simulated: m0's first batch of each round is skipped as if non-finite.
fed = tiny_federation(root, ARCHS, on_nonfinite="skip_batch", **ENG)
orig_ok, seen = fed.step_ok, set()


def step_ok(loss, participant, term):
    if participant == "m0" and (fed.round, participant) not in seen:
        seen.add((fed.round, participant))
        fed.checked_batches += 1
        fed.skipped_batches += 1
        return False
    return orig_ok(loss, participant, term)


fed.step_ok = step_ok
store = {}
record_grads(fed, store)
m = Scaffold(ScaffoldParams(weighting="uniform"))
m.setup(fed)
fed.round = 1
m.run_round(fed, 1)
err = {name: max(float((m.c_i[name][n] - s["g"][n] / s["K"]).abs().max()) for n in m.c) for name, s in store.items()}
print(f"skip_batch: engine steps = { {k: v['K'] for k, v in store.items()} }; "
      f"|c_i+ - independent| max per client = { {k: f'{v:.1e}' for k, v in err.items()} }")
