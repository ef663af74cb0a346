"""The speed and memory levers of issue 14 change no results (or only float rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedshift.data.loading import normalize
from fedshift.engine import cpu
from fedshift.engine.evaluation import EvalSuite, correct_topk, evaluate_domains, evaluate_suite
from fedshift.errors import ConfigError
from fedshift.methods import create_method
from fedshift.methods.fccl_figures import corr_due, sparse_rounds
from fedshift.models import create_model

from fedshift.testing import tiny_federation


def test_sparse_rounds():
    assert sparse_rounds(1) == {1}
    assert sparse_rounds(3) == {1, 2, 3}
    r40 = sparse_rounds(40)
    assert len(r40) == 5 and {1, 40} <= r40 and all(1 <= r <= 40 for r in r40)
    assert sorted(r40)[1] > 5  # spread out, not the first rounds
    assert corr_due("sparse", 40, 40) and not corr_due("sparse", 2, 40)
    assert corr_due(3, 3, 40) and corr_due(3, 40, 40) and not corr_due(3, 4, 40) and not corr_due(0, 40, 40)
    with pytest.raises(Exception, match="corr_every"):
        create_method("fccl_plus", {"corr_every": -1})


def test_evaluation_matches_naive_loop():
    """Reused input buffer, partial last batch, inference mode: same hits as a plain loop."""
    torch.manual_seed(0)
    model = create_model("lenet", num_classes=10, in_channels=1).train()
    g = torch.Generator().manual_seed(1)
    tests = {d: (torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8),
                 torch.randint(0, 10, (n,), generator=g)) for d, n in (("a", 7), ("b", 12))}
    with torch.no_grad():
        model.eval()
        naive = {d: (model(normalize(x)).topk(5, 1).indices == y[:, None]) for d, (x, y) in tests.items()}
        model.train()
    want = {d: {1: h[:, 0].float().mean().item(), 5: h.any(1).float().mean().item()} for d, h in naive.items()}
    def flat(acc):
        return {(d, k): v for d, per in acc.items() for k, v in per.items()}

    for batch in (3, 5, 1000):
        assert flat(evaluate_domains(model, tests, (1, 5), batch)) == pytest.approx(flat(want))
    assert model.training  # mode restored
    suite = EvalSuite.of(tests)
    assert suite.sizes == [7, 12] and flat(evaluate_suite(model, suite, (1, 5), 4)) == pytest.approx(flat(want))
    hits = correct_topk(model, suite.images, suite.labels, (1,), 4, amp=cpu.autocast(False, torch.device("cpu")))
    assert hits[1].shape == (19,)


def test_allocator_and_bf16_switches(monkeypatch):
    assert cpu.tune_allocator() in (True, False)
    assert cpu.tune_allocator() == cpu.tune_allocator()  # idempotent
    monkeypatch.setattr(cpu, "bf16_supported", lambda device: False)
    with pytest.raises(ConfigError, match="engine.bf16"):
        cpu.check_bf16(True, torch.device("cpu"))
    cpu.check_bf16(False, torch.device("cpu"))


@pytest.mark.parametrize("target,recompute", [("all", "auto"), ("others_prev", "auto"), ("all", True)])
def test_one_graph_collaboration_equals_all_graphs(tiny_data, target, recompute):
    """public_graphs: one gives the same updates as all graphs alive (BatchNorm + dropout models). With
    recompute on every batch (true), EfficientNet's and MobileNet's checkpointed graphs are kept from the
    first pass (no rerun) and LeNet's (nothing to checkpoint) is rerun: same updates again."""
    archs = ("efficientnet_b0_s1", "lenet", "mobilenet_v2")  # dropout + stochastic depth, no norm, BatchNorm
    states = {}
    for mode in ("all", "one"):
        fed = tiny_federation(tiny_data, archs + ("lenet",), public_graphs=mode, public_batch=32,
                              channels_last=False, recompute=recompute)
        if recompute is True:
            assert [c.model.recomputes(32) for c in fed.clients] == [True, False, True, False]
        m = create_method("fccl_plus" if target == "all" else "fccl", {"target": target, "init": "scratch"})
        fed.setup(m)
        fed.data.public = fed.data.public[:64]  # two public batches
        calls = [0] * len(fed.clients)
        for i, c in enumerate(fed.clients):
            def counted(x, _f=c.model.forward_with_features, _i=i):
                calls[_i] += 1
                return _f(x)
            c.model.forward_with_features = counted
        torch.manual_seed(5)
        metrics = m.collaborate(fed.ctx)
        if mode == "one":  # forward passes per participant over the two batches: 2 = graph kept, 4 = rerun
            assert calls == ([2, 4, 2, 2] if recompute is True else [4, 4, 4, 2]), calls
        states[mode] = ([{k: v.clone() for k, v in c.model.state_dict().items()} for c in fed.clients], metrics,
                        torch.rand(3))
    (sa, ma, ra), (so, mo, ro) = states["all"], states["one"]
    assert ma == pytest.approx(mo, rel=1e-5, abs=1e-6)
    assert torch.equal(ra, ro)  # the random stream continues where it would have
    for a, o in zip(sa, so):
        for k in a:
            assert torch.allclose(a[k].float(), o[k].float(), rtol=1e-4, atol=1e-6), k


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_malloc_trim_returns_freed_heap_pages():
    """engine.malloc_tuning keeps freed buffers resident (fast reuse); engine.malloc_trim hands them
    back at phase boundaries (release_memory), which is what lowers the peak RSS of a run."""
    prev = cpu.tuned_mb()
    if not cpu.tune_allocator(1024):  # every block below 1 GB stays in the heap when freed
        pytest.skip("allocator is not glibc")
    try:
        cpu.set_trim(False)
        buf = torch.ones(300 * 2**20 // 4)  # 300 MB, pages touched
        del buf
        kept = _rss_bytes()
        assert cpu.release_memory() is False  # off: nothing happens
        cpu.set_trim(True)
        assert cpu.release_memory() is True
        assert kept - _rss_bytes() > 200 * 2**20  # most of the 300 MB left the process
    finally:
        cpu.set_trim(False)
        cpu.tune_allocator(prev or 1024)


_THRESHOLD_PROBE = """
import os, sys, torch
from fedshift.engine import cpu
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
if not cpu.tune_allocator(int(sys.argv[1])):
    print("untuned"); sys.exit()
small = [torch.ones(8 * 2**20 // 4) for _ in range(10)]  # 80 MB in 8 MB blocks (trim threshold: 2x the size)
alive = rss(); del small; small_freed = alive - rss()
big = torch.ones(200 * 2**20 // 4)
alive = rss(); del big; big_freed = alive - rss()
print(small_freed >> 20, big_freed >> 20)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("keep_mb", [64, 1024])
def test_malloc_tuning_size_keeps_blocks_below_it_and_unmaps_larger_ones(keep_mb):
    """engine.malloc_tuning: 64 (the default): freed 8 MB activation-sized blocks stay resident for the
    next step; a freed 200 MB block goes back to the kernel at once. At 1024 MB (true) both stay.
    In a fresh process: the allocator's state depends on everything allocated before."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _THRESHOLD_PROBE, str(keep_mb)], capture_output=True, text=True,
                         check=True).stdout.split()
    if out == ["untuned"]:
        pytest.skip("allocator is not glibc")
    small_freed, big_freed = map(int, out)
    assert small_freed < 16  # MB handed back: none, kept for reuse
    if keep_mb == 64:
        assert big_freed > 150  # mapped on its own, unmapped when freed
    else:
        assert big_freed < 16  # kept too


def test_malloc_tuning_setting_is_checked_and_resolved():
    from fedshift.config import resolve
    from fedshift.engine.config import EngineConfig, PretrainConfig, malloc_keep_mb

    assert [malloc_keep_mb(v) for v in (True, False, 64, 512)] == [1024, 0, 64, 512]
    assert resolve(EngineConfig, {}, "engine").malloc_tuning == 64
    for cls, block in ((EngineConfig, "engine"), (PretrainConfig, "pretrain")):
        with pytest.raises(ConfigError, match="malloc_tuning must be true, false or a size in MB"):
            resolve(cls, {"malloc_tuning": 0}, block)
        with pytest.raises(ConfigError, match=rf"{block}.malloc_tuning: expected bool \| int"):
            resolve(cls, {"malloc_tuning": "64MB"}, block)
