"""A participant as the engine holds it and a method sees it (docs/extending.md "The round context"), and
the small pieces both the federation and the round context use: frozen copies, steps per epoch."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Dict

import torch

from ..data.loading import ClientData
from ..models import FedModel


@dataclass
class Client:
    """One participant: its data, its model and per-method state (teachers, prototypes...)."""

    index: int
    name: str
    domain: str
    arch: str
    model: FedModel
    data: ClientData
    generator: torch.Generator  # private-data shuffling
    state: Dict[str, object] = field(default_factory=dict)

    @property
    def num_private(self) -> int:
        return self.data.num_private


#: What a method calls a participant (:class:`Client`): docs/extending.md lists its fields.
Participant = Client


LossFn = Callable[[Client, torch.Tensor, torch.Tensor, int], torch.Tensor]


def steps_per_epoch(num_samples: int, batch: int) -> int:
    """Optimiser steps in one epoch of :meth:`Federation.private_batches` (a one-sample remainder is dropped)."""
    if num_samples <= 0:
        return 0
    b = min(batch, num_samples)
    n = math.ceil(num_samples / b)
    return n - 1 if num_samples > 1 and num_samples % b == 1 else n


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A detached eval-mode copy (teachers, global models)."""
    m = copy.deepcopy(model)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m
