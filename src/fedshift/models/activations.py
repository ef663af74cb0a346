"""Counted activation memory of a model (:func:`model_activations`): what ``engine.recompute_budget_mb``
and the job memory model (``fedshift.resources``) read."""

from __future__ import annotations

from typing import Dict, Tuple

import torch


def model_activations(model, x) -> Tuple[float, float]:
    """(MB per sample without, with recompute) of ``model``'s counted activations: every leaf module's
    output on the batch ``x``, 4 bytes an element; with recompute the blocks that ``run_blocks``
    checkpoints keep only their outputs, plus the inner outputs of the largest single block while
    the backward pass recomputes it. Runs ``model`` once under no_grad in its current mode (a live
    participant in eval mode: no buffer or random state changes)."""
    out: Dict[int, int] = {}  # id(module) -> output numel

    def hook(module, _inputs, result):
        n = sum(t.numel() for t in (result if isinstance(result, (tuple, list)) else (result,))
                if isinstance(t, torch.Tensor))
        out[id(module)] = out.get(id(module), 0) + n

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    blocks: list = []  # composite children of every sequence run through run_blocks
    real_run_blocks = getattr(model, "run_blocks", None)  # a plugin model need not derive from FedModel

    def run_blocks(seq, inp):
        blocks.extend(m for m in seq if next(m.children(), None) is not None)
        return real_run_blocks(seq, inp)

    if real_run_blocks is not None:
        model.run_blocks = run_blocks
    try:
        with torch.no_grad():  # the counts do not depend on autograd
            model(x)
    finally:
        for h in handles:
            h.remove()
        if real_run_blocks is not None:
            del model.run_blocks  # the instance attribute set above; the class's method is back
    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    full = sum(out.get(id(m), 0) for m in leaves)
    checkpointed = full
    if blocks:
        inside = {id(leaf) for b in blocks for leaf in b.modules()}
        kept = sum(out.get(id(m), 0) for m in leaves if id(m) not in inside) + sum(out.get(id(b), 0) for b in blocks)
        largest = max(sum(out.get(id(leaf), 0) for leaf in b.modules() if next(leaf.children(), None) is None)
                      for b in blocks)
        checkpointed = kept + largest
    n = len(x)
    return full / n * 4 / 2**20, checkpointed / n * 4 / 2**20
