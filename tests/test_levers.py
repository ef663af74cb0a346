"""Engine levers (engine/levers.py): each switch leaves the results unchanged.

On a CPU-only machine the CUDA paths (graphs, streams, autocast) cannot run; their
tests are skipped with the reason, and the logic they share with the CPU path
(interleaving, the partial-batch rule, the slot rule, the amp table) is tested here.
"""

from __future__ import annotations

import pytest
import torch

from fedshift.config import resolve
from fedshift.engine.config import EngineConfig
from fedshift.engine.federation import frozen_copy
from fedshift.engine.levers import (AMP_BY_FAMILY, EngineLevers, amp_dtype, interleave, model_family,
                                    slot_device)
from fedshift.errors import ConfigError
from fedshift.testing import tiny_federation

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs/streams/autocast need a GPU")


def weights(fed):
    return [{k: v.detach().clone() for k, v in c.model.state_dict().items()} for c in fed.clients]


def assert_same_weights(a, b, **tol):
    for sa, sb in zip(a, b):
        for k in sa:
            if tol:
                torch.testing.assert_close(sb[k], sa[k], msg=k, **tol)
            else:
                assert torch.equal(sa[k], sb[k]), k


# ------------------------------------------------------------------ config
def test_config_keys_accept_yaml_booleans_and_reject_bad_values():
    cfg = resolve(EngineConfig, {"compile": False, "amp": False}, "engine")
    assert (cfg.compile, cfg.amp, cfg.fused_clients) == ("off", "off", "off")
    assert resolve(EngineConfig, {"compile": True}, "engine").compile == "default"
    assert resolve(EngineConfig, {"compile": "reduce-overhead"}, "engine").compile == "reduce-overhead"
    with pytest.raises(ConfigError, match="compile"):
        resolve(EngineConfig, {"compile": "max"}, "engine")
    with pytest.raises(ConfigError, match="amp"):
        resolve(EngineConfig, {"amp": "fp16"}, "engine")


# --------------------------------------------------------------------- amp
def test_amp_follows_the_family_table_on_cuda_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert model_family("resnet10") == "resnet"
    assert model_family("efficientnet_b0") == "efficientnet"
    assert model_family("mobilenet_v2") == "mobilenet"
    assert AMP_BY_FAMILY["resnet"] == "bf16"
    assert amp_dtype("auto", "resnet12", cuda) is torch.bfloat16
    assert amp_dtype("auto", "efficientnet_b0", cuda) is None
    assert amp_dtype("auto", "lenet", cuda) is None  # unmeasured family: off
    assert amp_dtype("bf16", "mobilenet_v2", cuda) is torch.bfloat16  # forced
    assert amp_dtype("off", "resnet10", cuda) is None
    assert amp_dtype("bf16", "resnet10", cpu) is None  # the CPU's bf16 is another lever
    with pytest.raises(ValueError, match="engine.amp"):
        amp_dtype("fp8", "resnet10", cuda)


# ------------------------------------------------------------- packed runs
def test_slot_device_rule():
    two = lambda: 2  # noqa: E731
    assert slot_device("cuda", {}, two) == "cuda"
    assert slot_device("cuda", {"FEDSHIFT_GPU_SLOT": "3"}, two) == "cuda:1"
    assert slot_device("auto", {"FEDSHIFT_GPU_SLOT": "2"}, two) == "cuda:0"
    assert slot_device("cuda:1", {"FEDSHIFT_GPU_SLOT": "0"}, two) == "cuda:1"  # explicit index wins
    assert slot_device("cpu", {"FEDSHIFT_GPU_SLOT": "5"}, two) == "cpu"
    assert slot_device("auto", {"FEDSHIFT_GPU_SLOT": "1"}, lambda: 0) == "auto"  # no GPU: stays CPU
    with pytest.raises(ValueError, match="no CUDA device"):
        slot_device("cuda", {"FEDSHIFT_GPU_SLOT": "1"}, lambda: 0)
    with pytest.raises(ValueError, match="FEDSHIFT_GPU_SLOT must be a non-negative integer"):
        slot_device("cuda", {"FEDSHIFT_GPU_SLOT": "x"}, two)


# ------------------------------------------------------------ interleaving
class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


def test_interleave_round_robin_on_own_streams():
    log, seen = [], []
    active = []

    def use(s):
        class Ctx:
            def __enter__(self):
                active.append(s.name)

            def __exit__(self, *a):
                active.pop()
        return Ctx()

    def stepper(name, n):
        for i in range(n):
            seen.append((name, i, active[-1]))
            yield
        return name * n

    main = FakeStream("main", log)
    streams = [FakeStream(f"s{i}", log) for i in range(3)]
    out = interleave([stepper("a", 2), stepper("b", 3), stepper("c", 1)], streams, use, main)
    assert out == ["aa", "bbb", "c"]
    # one step each in turn, each on its own stream
    assert seen == [("a", 0, "s0"), ("b", 0, "s1"), ("c", 0, "s2"), ("a", 1, "s0"), ("b", 1, "s1"),
                    ("b", 2, "s1")]
    # side streams wait for the caller's queued work first; the caller waits for all at the end
    assert log[:3] == [("wait", f"s{i}", "main") for i in range(3)]
    assert log[3:] == [("wait", "main", f"s{i}") for i in range(3)]


def test_overlapped_participants_equal_sequential(tiny_data):
    kw = dict(local_epochs=2, local_batch=16)
    seq = tiny_federation(tiny_data, ("lenet", "simple_cnn"), **kw)
    ovl = tiny_federation(tiny_data, ("lenet", "simple_cnn"), overlap_participants=True, **kw)
    ref = {f"{c.name}/train/local_loss": seq.train_local(c) for c in seq.clients}
    got = ovl.train_participants()
    assert got == ref
    assert_same_weights(weights(seq), weights(ovl))


def test_train_participants_without_overlap_equals_train_local(tiny_data):
    a = tiny_federation(tiny_data, ("lenet", "lenet"))
    b = tiny_federation(tiny_data, ("lenet", "lenet"))
    ref = {f"{c.name}/train/local_loss": a.train_local(c) for c in a.clients}
    assert b.train_participants() == ref
    assert_same_weights(weights(a), weights(b))


# ----------------------------------------------------------------- compile
def test_partial_batch_runs_eagerly_under_compile():
    lev = EngineLevers(EngineConfig(compile="default"), torch.device("cpu"))
    model = torch.nn.Linear(3, 2)
    calls = []
    opt_fn = torch.compile(lambda x: model(x), backend=lambda gm, ex: calls.append(1) or gm)
    with lev.local_step(model, "lenet", torch.zeros(3, 3), full_batch=4):
        opt_fn(torch.zeros(3, 3))  # partial: force_eager, nothing compiled
    assert calls == []
    with lev.local_step(model, "lenet", torch.zeros(4, 3), full_batch=4):
        opt_fn(torch.zeros(4, 3))
    assert calls == [1]


def test_compiled_training_equals_eager_with_a_partial_last_batch(tiny_data):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # 48 private samples per participant at batch 20: steps of 20, 20 and a partial 8.
    kw = dict(local_epochs=1, local_batch=20, optimizer="sgd", lr=0.05)
    eager = tiny_federation(tiny_data, ("lenet",), **kw)
    comp = tiny_federation(tiny_data, ("lenet",), compile="default", **kw)
    n = len(comp.clients[0].data.get("private")[1])
    assert n % 20 not in (0, 1)  # the data really has a partial last batch
    ref = eager.train_local(eager.clients[0])
    got = comp.train_local(comp.clients[0])
    assert counters["stats"]["unique_graphs"] >= 1  # the compiled path ran
    assert got == pytest.approx(ref, rel=1e-5)
    assert_same_weights(weights(eager), weights(comp), rtol=1e-4, atol=1e-5)
    # state-dict names unchanged by in-place compile (checkpoints stay loadable)
    assert list(comp.clients[0].model.state_dict()) == list(eager.clients[0].model.state_dict())
    # a deep copy (teachers, frozen copies) runs its OWN weights, through both entry points
    teacher = frozen_copy(comp.clients[0].model)
    with torch.no_grad():
        for p in teacher.parameters():
            p.zero_()
        x = torch.randn(4, 1, 28, 28)
        assert teacher(x).abs().max() == 0
        assert teacher.forward_with_features(x)[1].abs().max() == 0
        assert comp.clients[0].model.forward_with_features(x)[1].abs().max() > 0


# -------------------------------------------------------------- CUDA only
@needs_cuda
@pytest.mark.parametrize("lever", [{"cuda_graphs": True}, {"overlap_participants": True},
                                   {"compile": "reduce-overhead"}])
def test_cuda_levers_equal_eager(tiny_data, lever):
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    kw = dict(local_epochs=1, local_batch=16, device="cuda", optimizer="sgd", lr=0.05)
    a = tiny_federation(tiny_data, ("lenet", "lenet"), **kw)
    b = tiny_federation(tiny_data, ("lenet", "lenet"), **kw, **lever)
    for fed in (a, b):  # tiny_federation builds on the CPU: move it, then apply the levers
        fed.device = torch.device("cuda")
        for c in fed.clients:
            c.model.cuda()
            c.data.splits = {k: (x.cuda(), y.cuda()) for k, (x, y) in c.data.splits.items()}
        fed.levers = EngineLevers(fed.cfg, fed.device)
        fed.levers.prepare([c.model for c in fed.clients])
    ref = {f"{c.name}/train/local_loss": a.train_local(c) for c in a.clients}
    got = b.train_participants()
    for k in ref:
        assert got[k] == pytest.approx(ref[k], rel=1e-4)
    assert_same_weights(weights(a), weights(b), rtol=1e-3, atol=1e-5)


def test_graphed_forward_dispatch_and_deepcopy():
    """The cuda_graphs wrapper's logic, without CUDA: graph only inside a local step at the
    captured shape; a deep copy (teacher) runs its own weights, not the original's graph."""
    import copy

    from fedshift.engine.levers import _GraphedForward

    lev = EngineLevers(EngineConfig(), torch.device("cpu"))
    model = torch.nn.Linear(3, 2)
    model.forward = _GraphedForward(lev, model, (4, 3), lambda x: "graphed", model.forward)
    x4, x5 = torch.ones(4, 3), torch.ones(5, 3)
    assert isinstance(model(x4), torch.Tensor)  # outside a local step: eager
    lev._in_local[id(model)] = True
    assert model(x4) == "graphed"
    assert isinstance(model(x5), torch.Tensor)  # another shape: eager
    model.eval()
    assert isinstance(model(x4), torch.Tensor)  # eval mode: eager
    model.train()
    teacher = copy.deepcopy(model)
    with torch.no_grad():
        teacher.weight.zero_()
        teacher.bias.zero_()
    assert torch.equal(teacher(x4), torch.zeros(4, 2))
