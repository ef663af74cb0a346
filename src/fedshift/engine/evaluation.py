"""Vectorised evaluation: every model on every domain's test set in one pass per model.

FCCL+ Eq. 21 (intra-domain accuracy: own test set) and Eq. 22 (inter-domain accuracy:
the mean over the other K-1 domains' test accuracies), top-1 and top-5.

Speed (measured on CPU with ``benchmarks/bench_vs_reference.py``): the test sets are
concatenated once per evaluation (:class:`EvalSuite`) and each model runs over the
concatenation under ``torch.inference_mode`` in batches of ``engine.eval_batch``
(256: larger batches only allocate larger activation buffers, 2048 spent more time
in the kernel's page faults than in the convolutions); the normalised input batch is
written into one reused buffer; ``engine.bf16`` adds bf16 autocast.

Inference levers (``engine.eval_fold_bn``, ``engine.eval_channels_last``; ``auto`` picks
the value measured for this CPU kind, :data:`fedshift.engine.cpu.KIND_LEVERS`, benchmarks/bench_eval.py):

* folded BatchNorm: each model is evaluated through a copy (:func:`inference_copy`) whose
  BatchNorm layers are folded into the convolution before them (eval-mode BatchNorm is an
  affine map per channel: ``w' = w * g / sqrt(v + eps)``, ``b' = (b - m) * g / sqrt(v + eps)
  + beta``); the training model is never touched. Same function; float32 rounding differs
  (tests/test_eval_levers.py bounds it).
* channels_last input: the normalised batch is written in the layout of the model's
  weights (NHWC under ``engine.channels_last``), so the first convolution does not
  convert it (measured slower: off on every kind).
* bf16 autocast (``engine.bf16``, :mod:`.cpu`): ``auto`` = on for the kinds with hardware
  bf16 where it was measured to gain (``amx``, ``avx512_bf16``).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import ContextManager, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..data.loading import MEAN, STD


@dataclass
class EvalSuite:
    """The test sets of an evaluation, concatenated once: images, labels, domain names and sizes."""

    names: List[str]
    images: torch.Tensor
    labels: torch.Tensor
    sizes: List[int]

    @classmethod
    def of(cls, test_sets: Dict[str, tuple]) -> "EvalSuite":
        names = list(test_sets)
        xs = [test_sets[n][0] for n in names]
        ys = [test_sets[n][1] for n in names]
        one = len(names) == 1
        return cls(names, xs[0] if one else torch.cat(xs), ys[0] if one else torch.cat(ys), [len(y) for y in ys])


# ------------------------------------------------------------- inference levers
# engine.eval_fold_bn / engine.eval_channels_last: auto -> the value measured on each CPU kind, kept with the
# other per-kind levers in engine.cpu.KIND_LEVERS (figures and machines beside the table).


def eval_lever(name: str, setting: Union[bool, str], device: torch.device, kind: Optional[str] = None) -> bool:
    """An inference lever (``fold_bn`` / ``channels_last``) resolved: ``auto`` -> :data:`~.cpu.KIND_LEVERS` of
    ``kind`` (default: this machine's :func:`fedshift.engine.cpu.cpu_kind`; CUDA devices: "other")."""
    if setting != "auto":
        return bool(setting)
    from .cpu import kind_levers

    return getattr(kind_levers(kind, device), f"eval_{name}")


def inference_levers(cfg, device: torch.device) -> Tuple[bool, bool]:
    """``(fold, channels_last)`` of an evaluation under engine config ``cfg``. With ``engine.compile``
    on, ``auto`` does not fold: the participant's model runs compiled, and a folded copy would be
    a new graph to compile at every evaluation."""
    compiled = getattr(cfg, "compile", "off") != "off"
    fold = getattr(cfg, "eval_fold_bn", False)
    fold = False if fold == "auto" and compiled else eval_lever("fold_bn", fold, device)
    return fold, eval_lever("channels_last", getattr(cfg, "eval_channels_last", False), device)


def _fold(conv: nn.Module, bn: nn.Module) -> Optional[nn.Module]:
    """``conv`` with eval-mode ``bn`` folded in (a new module), or None where it does not apply."""
    if not (type(conv) is nn.Conv2d and type(bn) is nn.BatchNorm2d and bn.track_running_stats
            and bn.running_mean is not None and conv.out_channels == bn.num_features):
        return None
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    fmt = torch.channels_last if conv.weight.is_contiguous(memory_format=torch.channels_last) \
        and not conv.weight.is_contiguous() else torch.contiguous_format
    fused = fuse_conv_bn_eval(conv.eval(), bn.eval())
    fused.weight.data = fused.weight.data.contiguous(memory_format=fmt)
    return fused


def _block_pairs() -> Dict[type, Sequence[tuple]]:
    """Blocks whose forward applies ``bnX`` straight to ``convX``'s output (attribute pairs)."""
    from ..models.resnet import BasicBlock, Bottleneck

    return {BasicBlock: (("conv1", "bn1"), ("conv2", "bn2")),
            Bottleneck: (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3"))}


def fold_bn(model: nn.Module) -> int:
    """Fold every eval-mode BatchNorm2d into the Conv2d whose output it normalises, in place;
    the BatchNorm becomes ``nn.Identity``. Two patterns are folded: a Conv2d directly followed
    by a BatchNorm2d inside an ``nn.Sequential`` (where nothing else sees the conv's output),
    and the attribute pairs of known blocks (:func:`_block_pairs`). Returns the number folded.
    Call it on a copy (:func:`inference_copy`), never on a model that trains."""
    pairs = _block_pairs()
    n = 0
    for mod in list(model.modules()):
        if isinstance(mod, nn.Sequential):
            names = list(mod._modules)
            for a, b in zip(names, names[1:]):
                fused = _fold(mod._modules[a], mod._modules[b])
                if fused is not None:
                    mod._modules[a], mod._modules[b] = fused, nn.Identity()
                    n += 1
        for conv_name, bn_name in pairs.get(type(mod), ()):
            fused = _fold(getattr(mod, conv_name), getattr(mod, bn_name))
            if fused is not None:
                setattr(mod, conv_name, fused)
                setattr(mod, bn_name, nn.Identity())
                n += 1
    return n


def inference_copy(model: nn.Module, fold: bool = True) -> nn.Module:
    """An eval-mode copy of ``model`` for inference, BatchNorm folded when ``fold``; the model
    itself (its weights, buffers and mode) is unchanged. Without ``fold``: the model itself."""
    if not fold:
        return model
    was_training = model.training
    try:
        copied = copy.deepcopy(model.eval())
    finally:
        model.train(was_training)
    with torch.no_grad():
        fold_bn(copied)
    return copied


def weights_layout(model: nn.Module) -> torch.memory_format:
    """channels_last when the model's first 4-d weight is stored NHWC, else contiguous (NCHW)."""
    for p in model.parameters():
        if p.dim() == 4:
            nhwc = p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
            return torch.channels_last if nhwc else torch.contiguous_format
    return torch.contiguous_format


def correct_topk(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                 ks: Sequence[int] = (1, 5), batch: int = 256,
                 amp: Optional[ContextManager] = None, fold: bool = False,
                 channels_last: bool = False) -> Dict[int, torch.Tensor]:
    """Per-sample correctness (bool, N) at each k, in eval mode; the model's mode is restored.

    ``images`` are uint8; each batch is normalised as :func:`fedshift.data.loading.normalize`
    does (same arithmetic, same values) into one reused float buffer. ``amp``: a context
    entered around the forward passes (bf16 autocast), or None. ``fold``: run a copy with
    BatchNorm folded (:func:`inference_copy`). ``channels_last``: write the buffer in the
    layout of the model's weights (:func:`weights_layout`) instead of NCHW.
    """
    was_training = model.training
    run = inference_copy(model, fold)
    model.eval()
    run.eval()
    out: Dict[int, List[torch.Tensor]] = {k: [] for k in ks}
    fmt = weights_layout(model) if channels_last and images.dim() == 4 else torch.contiguous_format
    buf = torch.empty((min(batch, len(images)), *images.shape[1:]), dtype=torch.float32, device=images.device)
    buf = buf.contiguous(memory_format=fmt)
    try:
        with torch.inference_mode(), (amp or contextlib.nullcontext()):
            for start in range(0, len(images), batch):
                xb = images[start:start + batch]
                x = buf[: len(xb)]
                x.copy_(xb)
                x.div_(255.0).sub_(MEAN).div_(STD)
                logits = run(x)
                kmax = min(max(ks), logits.shape[1])
                top = logits.topk(kmax, dim=1).indices
                hit = top == labels[start:start + batch, None]
                for k in ks:
                    out[k].append(hit[:, : min(k, kmax)].any(1))
    finally:
        model.train(was_training)
    return {k: torch.cat(v) if v else torch.zeros(0, dtype=torch.bool) for k, v in out.items()}


def evaluate_suite(model, suite: EvalSuite, ks=(1, 5), batch: int = 256,
                   amp: Optional[ContextManager] = None, fold: bool = False,
                   channels_last: bool = False) -> Dict[str, Dict[int, float]]:
    """Accuracy of one model on each domain of ``suite``: {domain: {k: acc}} (one pass)."""
    hits = correct_topk(model, suite.images, suite.labels, ks, batch, amp, fold, channels_last)
    res: Dict[str, Dict[int, float]] = {}
    for k, h in hits.items():
        # Per-domain means from one segmented sum (single host sync per k).
        seg = torch.repeat_interleave(torch.arange(len(suite.names), device=h.device),
                                      torch.tensor(suite.sizes, device=h.device))
        sums = torch.zeros(len(suite.names), device=h.device).index_add_(0, seg, h.float())
        accs = (sums / torch.tensor(suite.sizes, device=h.device).clamp(min=1)).tolist()
        for n, a in zip(suite.names, accs):
            res.setdefault(n, {})[k] = a
    return res


def evaluate_domains(model, test_sets: Dict[str, tuple], ks=(1, 5), batch: int = 256,
                     amp: Optional[ContextManager] = None) -> Dict[str, Dict[int, float]]:
    """Accuracy of one model on each domain: {domain: {k: acc}} (one pass over the concatenation)."""
    return evaluate_suite(model, EvalSuite.of(test_sets), ks, batch, amp)


def intra_inter(per_domain: Dict[str, Dict[int, float]], own: str) -> Dict[str, float]:
    """Eq. 21-22 from one model's per-domain accuracies: intra = own domain, inter = mean of others."""
    out: Dict[str, float] = {}
    others: List[str] = [d for d in per_domain if d != own]
    for k in per_domain[own]:
        out[f"intra/top{k}"] = per_domain[own][k]
        out[f"inter/top{k}"] = sum(per_domain[d][k] for d in others) / len(others) if others else float("nan")
    return out
