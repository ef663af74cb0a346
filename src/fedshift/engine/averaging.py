"""The server's weighted mean of client states, ``sum_k w_k * state_k / sum_k w_k``, written once.

Accumulated in float64, term by term in client order (``state_k.double() * (w_k / total)``),
then cast back to each tensor's dtype; non-float tensors (``num_batches_tracked``) are the
first state's. :func:`weighted_average` (a list of states), :class:`RunningAverage` (one state
at a time, so a round holds one accumulator whatever the number of clients) and
``engine.fused.weighted_mean_stacked`` (states stacked on a leading dimension) all run this
one arithmetic, so the sequential and the fused rounds average bit for bit alike.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import torch


class RunningAverage:
    """The weighted mean accumulated one state at a time.

    ``total`` (the sum of the weights) must be known up front, as it is for a round's
    sampled clients, so each term is ``state * (w / total)``.
    """

    def __init__(self, total: float):
        if total <= 0:
            raise ValueError("weights must sum to a positive number")
        self.total = float(total)
        self.acc: Optional[Dict[str, torch.Tensor]] = None

    def add(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        if self.acc is None:
            self.acc = {k: (torch.zeros_like(v, dtype=torch.float64) if torch.is_floating_point(v) else v.clone())
                        for k, v in state.items()}
        for k, v in state.items():
            if torch.is_floating_point(v):
                self.acc[k] += v.double() * (weight / self.total)

    def result(self, like: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The mean so far, each tensor in ``like``'s dtype (non-float ones as first added)."""
        if self.acc is None:
            raise ValueError("RunningAverage.result: no state was added")
        return {k: (v.to(like[k].dtype) if torch.is_floating_point(like[k]) else v) for k, v in self.acc.items()}


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> Dict[str, torch.Tensor]:
    """Sum_k w_k * state_k / sum_k w_k, key by key; non-float tensors are copied from the first state."""
    avg = RunningAverage(float(sum(weights)))
    for s, w in zip(states, weights):
        avg.add(s, w)
    return avg.result(states[0])
