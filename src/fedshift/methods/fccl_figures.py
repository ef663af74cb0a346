"""FCCL's figure data, collected during a run and saved beside the run's outputs (FCCL's ``artifacts`` hook).

FCCL's cross-correlation matrices (CVPR Fig. 5 / FCCL+ Fig. 8): each participant's
cross-correlation (Eq. 1) with the mean of the others' logits, on public and on its
private data, recorded at chosen rounds (:func:`corr_due`) and saved as
``cross_correlation.npz`` (:func:`save_correlations`). The drawing is the report's
(:func:`fedshift.report.figures.draw_correlations` for a run,
:func:`fedshift.report.figures.cross_correlation_figure` for a report).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Set

import numpy as np
import torch
from torch import Tensor

from ..data.loading import normalize
from ..losses import cross_correlation


def check_corr(every, samples: int) -> None:
    if (every != "sparse" and every < 0) or samples < 2:
        raise ValueError(f"corr_every must be 'sparse' or >= 0 and corr_samples >= 2, got {every!r}, {samples}")


def sparse_rounds(rounds: int, points: int = 5) -> Set[int]:
    """First, last and evenly spaced rounds of 1..rounds, ``points`` in all (fewer if rounds < points)."""
    return {int(r) for r in np.linspace(1, rounds, min(points, rounds)).round()}


def corr_due(every, r: int, rounds: int) -> bool:
    """Whether round ``r`` of ``rounds`` records the cross-correlation matrices."""
    if every == "sparse":
        return r in sparse_rounds(rounds)
    return bool(every) and (r % every == 0 or r == rounds)


def correlation_matrices(ctx, samples: int) -> Dict[str, np.ndarray]:
    """Each participant's cross-correlation (Eq. 1) with the others' mean logits, eval mode.

    ``public``: on the first ``samples`` public images (no augmentation); ``private``:
    on participant i's first ``samples`` private images, every model scoring them.
    Returns arrays of shape (K, C, C). A constant logit column gives 0 (eps 1e-8).
    """
    clients = ctx.participants
    was = [c.model.training for c in clients]
    for c in clients:
        c.model.eval()

    def against_others(zs: List[Tensor], i: int) -> Tensor:
        others = torch.stack([z for j, z in enumerate(zs) if j != i]).mean(0)
        return cross_correlation(zs[i], others, eps=1e-8)

    b = ctx.eval_batch

    def logits(model, images: Tensor) -> Tensor:
        return torch.cat([model(normalize(images[s:s + b])).float() for s in range(0, len(images), b)])

    try:
        with torch.inference_mode(), ctx.amp():
            pub = ctx.public[:samples]
            z_pub = [logits(c.model, pub) for c in clients]
            public = torch.stack([against_others(z_pub, i) for i in range(len(clients))])
            per_client = []
            for i, c in enumerate(clients):
                x = c.data.get("private")[0][:samples]
                per_client.append(against_others([logits(m.model, x) for m in clients], i))
            private = torch.stack(per_client)
    finally:
        for c, w in zip(clients, was):
            c.model.train(w)
    return {"public": public.float().cpu().numpy(), "private": private.float().cpu().numpy()}


def save_correlations(corr: Dict[int, Dict[str, np.ndarray]], names: List[str], out_dir: Path) -> Optional[Path]:
    """Write ``cross_correlation.npz`` (rounds, participants, public/private: R x K x C x C);
    returns its path, or None (nothing written) when no round was recorded."""
    if not corr:
        return None
    rounds = sorted(corr)
    path = Path(out_dir) / "cross_correlation.npz"
    np.savez_compressed(path, rounds=np.array(rounds), participants=np.array(names),
                        public=np.stack([corr[r]["public"] for r in rounds]),
                        private=np.stack([corr[r]["private"] for r in rounds]))
    return path
