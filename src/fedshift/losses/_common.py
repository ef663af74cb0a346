"""Helpers shared by the loss modules of :mod:`fedshift.losses`: the batch-mean KL between two
log-probability rows, the non-target columns of a logit matrix, and the alignment of parameter
collections (sequences or ``name -> tensor`` mappings) for the parameter-space penalties.
Private to the package; no loss lives here.
"""

from __future__ import annotations

from typing import Iterable, List, Mapping, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "Params",
]


#: Parameters as a list/tuple of tensors or a ``name -> tensor`` mapping.
Params = Union[Sequence[Tensor], Mapping[str, Tensor], Iterable[Tensor]]


def _kl_batchmean(teacher_log_probs: Tensor, student_log_probs: Tensor) -> Tensor:
    """KL(p_teacher || p_student) summed over the last dim, averaged over rows.

    Both arguments are log-probabilities (rows of a ``log_softmax``), so a teacher
    probability of exactly 0 contributes 0 (``xlogy`` convention) without a NaN.
    """
    terms = torch.exp(teacher_log_probs) * (teacher_log_probs - student_log_probs)
    return terms.sum(dim=-1).mean()


def _non_target(x: Tensor, labels: Tensor) -> Tensor:
    """(B, C) -> (B, C-1): drop column ``labels[b]`` of row b, other columns in order."""
    # gather instead of boolean-mask indexing: no data-dependent shape, so no host sync on CUDA.
    c = x.shape[1]
    cols = torch.arange(c - 1, device=x.device).expand(x.shape[0], c - 1)
    cols = cols + (cols >= labels.view(-1, 1)).long()
    return x.gather(1, cols)


def _as_list(params: Params, ref_keys: List[str] | None = None) -> Tuple[List[Tensor], List[str] | None]:
    """Turn a mapping (in ``ref_keys`` order) or an iterable of tensors into a list."""
    if isinstance(params, Mapping):
        keys = list(params.keys()) if ref_keys is None else ref_keys
        missing = [k for k in keys if k not in params]
        if missing:
            raise ValueError(f"parameter mapping lacks keys {missing}")
        return [params[k] for k in keys], keys
    return list(params), None


def _aligned(*groups: Params) -> List[Tuple[Tensor, ...]]:
    """Zip several parameter collections (all mappings keyed alike, or all sequences)."""
    first, keys = _as_list(groups[0])
    lists = [first] + [_as_list(g, keys)[0] for g in groups[1:]]
    if len({len(lst) for lst in lists}) != 1:
        raise ValueError(f"parameter collections differ in length: {[len(lst) for lst in lists]}")
    rows = list(zip(*lists))
    for i, row in enumerate(rows):
        if len({tuple(t.shape) for t in row}) != 1:
            name = keys[i] if keys else str(i)
            raise ValueError(f"parameter {name}: shapes differ: {[tuple(t.shape) for t in row]}")
    return rows
