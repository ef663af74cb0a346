"""FedAvg (McMahan et al. 2017): local epochs, then the server averages parameters
weighted by private-sample counts. Homogeneous architectures only (FCCL+ Table XV).

Kept from the paper: weighted averaging of all parameters and buffers (BatchNorm
running statistics included; integer buffers such as ``num_batches_tracked`` are
taken from the first client). Every participant starts each round from the global
model; after averaging, every participant holds the global model, so intra/inter
accuracies are those of the global model on each domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Literal, Sequence

import torch

from .base import METHODS, Method


def weighted_average(states: Sequence[Dict[str, torch.Tensor]], weights: Sequence[float]) -> Dict[str, torch.Tensor]:
    """Sum_k w_k * state_k / sum_k w_k, key by key; non-float tensors are copied from the first state."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must sum to a positive number")
    out = {}
    for key, ref in states[0].items():
        if not torch.is_floating_point(ref):
            out[key] = ref.clone()
            continue
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for s, w in zip(states, weights):
            acc += s[key].double() * (w / total)
        out[key] = acc.to(ref.dtype)
    return out


def average_models(clients, weighting: str = "samples") -> Dict[str, torch.Tensor]:
    """Average the clients' models into one state dict and load it into every client."""
    states = [c.model.state_dict() for c in clients]
    weights: List[float] = [c.num_private if weighting == "samples" else 1.0 for c in clients]
    avg = weighted_average(states, weights)
    for c in clients:
        c.model.load_state_dict(avg)
    return avg


@dataclass(frozen=True)
class FedAvgParams:
    init: Literal["scratch", "base"] = "scratch"  # authors' baselines start from scratch
    weighting: Literal["samples", "uniform"] = "samples"  # McMahan 2017: weight by n_k


@METHODS.register("fedavg")
class FedAvg(Method):
    """FedAvg: local training from the global model, then sample-weighted parameter averaging."""

    name = "fedavg"
    Params = FedAvgParams
    requires_homogeneous = True

    def setup(self, fed) -> None:
        # One global model to start from: the first participant's random initialisation
        # (averaging random inits would shrink the weights), or the average of BASE models.
        if self.p.init == "scratch":
            state = fed.clients[0].model.state_dict()
            for c in fed.clients[1:]:
                c.model.load_state_dict(state)
        else:
            average_models(fed.clients, self.p.weighting)

    def after_round(self, fed, r: int) -> None:
        average_models(fed.clients, self.p.weighting)
