"""Client sampling and the server-side view of a federation (FedAvg-style many-client runs).

FedAvg (McMahan et al. 2017) and FedMMD/FedFusion (Yao et al. 2019, Algorithms 1-2)
draw a random set of ``m = max(C*K, 1)`` of the ``K`` clients at the start of each
round; only those train, from the global model, and the server averages them.

* :func:`clients_per_round` resolves ``engine.clients_per_round`` / ``engine.client_fraction``;
* :func:`sample_indices` is the draw (pure: a generator in, sorted indices out);
* :func:`round_clients` gives a round's clients, drawing with ``fed.sample_gen`` (a
  ``torch.Generator`` on the Federation, so checkpoints that save the federation's
  generators resume the same draws) and recording them in ``fed.sampled[r]``. When every
  client takes part no number is drawn, so runs without sampling keep their RNG streams.
* :func:`global_test_set`, :func:`evaluate_global` and :func:`rounds_to`: the papers'
  metric, the global model on the global test set, and the first round reaching a target.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import ConfigError


def clients_per_round(cfg, num_clients: int) -> int:
    """m of the round: ``clients_per_round``, or ``max(round(C * K), 1)``, or every client."""
    if cfg.clients_per_round:
        if cfg.clients_per_round > num_clients:
            raise ConfigError(f"engine.clients_per_round: {cfg.clients_per_round} asked, the scenario has "
                              f"{num_clients} clients")
        return cfg.clients_per_round
    if cfg.client_fraction:
        return max(int(math.floor(cfg.client_fraction * num_clients + 0.5)), 1)
    return num_clients


def sample_indices(num_clients: int, m: int, generator: torch.Generator) -> List[int]:
    """``m`` distinct client indices drawn uniformly without replacement (sorted)."""
    return sorted(torch.randperm(num_clients, generator=generator)[:m].tolist())


def round_clients(fed, r: int):
    """The clients that train in round ``r`` (drawn once per round, recorded in ``fed.sampled``)."""
    n = len(fed.clients)
    m = clients_per_round(fed.cfg, n)
    if m >= n:
        return list(fed.clients)
    if r not in fed.sampled:
        fed.sampled[r] = sample_indices(n, m, fed.sample_gen)
        chosen = [fed.clients[i] for i in fed.sampled[r]]
        if not any(c.num_private for c in chosen):  # the round would silently train nothing (issue 38)
            import logging

            logging.getLogger(__name__).warning(
                "round %d: the %d sampled client(s) (%s) hold no private data: this round trains nothing; "
                "raise engine.clients_per_round/client_fraction or rebuild the partition so every client "
                "holds data", r, len(chosen), ", ".join(c.name for c in chosen))
    return [fed.clients[i] for i in fed.sampled[r]]


def write_sampled(fed, out_dir) -> None:
    """``sampled.csv`` in ``out_dir``: the clients :func:`round_clients` drew in each round (nothing when
    every client trains, or before any round ran)."""
    from pathlib import Path

    if fed is None or not fed.sampled:
        return
    lines = ["round,clients"] + [f"{r},{' '.join(fed.clients[i].name for i in idx)}"
                                 for r, idx in sorted(fed.sampled.items())]
    (Path(out_dir) / "sampled.csv").write_text("\n".join(lines) + "\n")


def check_engine(method, cfg, scoring=None) -> None:
    """Fail early when the engine asks for sampling / a shared model from a method that cannot honour it,
    or from a scoring protocol that scores every participant's own model (``scoring.eval_models: local``)."""
    local = scoring is not None and scoring.eval_models == "local"
    # A method may say why it refuses (``per_client_state``: MOON's previous models, FedProc's prototypes).
    why = method.per_client_state or "trains every participant each round"
    sampling = bool(cfg.clients_per_round or cfg.client_fraction)
    if sampling and not method.supports_sampling:
        raise ConfigError(f"engine.clients_per_round/client_fraction: method {method.name!r} {why}; "
                          "client sampling needs a server-averaging method "
                          "(fedavg, fedprox, fedrs, fedmmd, fedmmd_l2, fedfusion_*, scaffold, fednova)")
    if sampling and local:
        raise ConfigError("engine.clients_per_round/client_fraction: scoring.eval_models: local scores each "
                          "participant's own model after local updating, which a client that sat the round out "
                          "did not train; use scoring.eval_models: global or drop client sampling")
    if cfg.server_model and not method.supports_server_model:
        raise ConfigError(f"engine.server_model: method {method.name!r} keeps a model per participant "
                          f"({method.per_client_state or 'its own weights'}); server_model needs a "
                          "server-averaging method (fedavg, fedprox, fedrs, fedmmd, fedfusion_*)")
    if cfg.server_model and local:
        raise ConfigError("engine.server_model: scoring.eval_models: local keeps and scores each participant's "
                          "own model, which one shared model cannot; use scoring.eval_models: global")
    if cfg.global_eval_every and local:
        raise ConfigError("engine.global_eval_every: scoring.eval_models: local scores each participant's own "
                          "model and keeps no round-end global model; use scoring.eval_models: global or drop "
                          "global_eval_every")
    if cfg.global_eval_every and not hasattr(method, "global_model"):
        raise ConfigError(f"engine.global_eval_every: method {method.name!r} has no global model to evaluate "
                          "(participants keep their own models); use the per-participant evaluation")
    if cfg.server_model and method.init_from != "scratch":
        raise ConfigError("engine.server_model: clients share one model, which cannot start from per-participant "
                          "BASE checkpoints; use init: scratch")


def unique_models(fed) -> List[torch.nn.Module]:
    """The distinct model objects of the federation (one in server-model mode)."""
    seen: Dict[int, torch.nn.Module] = {}
    for c in fed.clients:
        seen.setdefault(id(c.model), c.model)
    return list(seen.values())


# ------------------------------------------------------------------ server-side evaluation


def global_test_set(fed) -> Tuple[torch.Tensor, torch.Tensor]:
    """Every client's test split pooled: the dataset's test set for the FedMMD/FedFusion partitions
    (``test_mode: slice`` deals it once; binary clients hold disjoint classes; permuted clients
    hold it once per permutation, so accuracy is the mean over the permutations)."""
    xs, ys = zip(*(c.data.get("test") for c in fed.clients))
    return torch.cat(xs), torch.cat(ys)


class GlobalEvaluator:
    """Evaluates the global model every ``cfg.global_eval_every`` rounds (and at the last round).

    The global model is ``method.global_model(fed)`` (server-averaging methods: every model
    holds it between rounds; :func:`check_engine` refuses methods without one). Returns rows for ``rounds.csv`` (participant ``global``, kind
    ``global``) and logs ``global/top1``, ``global/top5``.
    """

    def __init__(self, fed, method, cfg):
        self.fed, self.method, self.cfg = fed, method, cfg
        self.curve: List[Tuple[int, float, float]] = []  # (round, top1, top5)
        self._test: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self.seconds = 0.0

    def due(self, r: int) -> bool:
        k = self.cfg.global_eval_every
        return bool(k) and (r % k == 0 or r == self.cfg.rounds)

    def __call__(self, r: int, tracker=None) -> List[dict]:
        if not self.due(r):
            return []
        import time

        from .evaluation import correct_topk

        t = time.time()
        if self._test is None:
            self._test = global_test_set(self.fed)
        model = global_model(self.fed, self.method)
        hits = correct_topk(model, *self._test, ks=(1, 5), batch=self.cfg.eval_batch)
        top1, top5 = torch.stack([hits[1].float().mean(), hits[5].float().mean()]).tolist()
        self.seconds += time.time() - t
        self.curve.append((r, top1, top5))
        if tracker is not None:
            tracker.log_metrics({"global/top1": top1, "global/top5": top5}, step=r)
        return [{"round": r, "participant": "global", "arch": self.fed.clients[0].arch, "domain": "all",
                 "kind": "global", "top1": top1, "top5": top5}]

    def summary(self, last_k: int) -> Dict[str, float]:
        """``global/top1``/``top5`` (mean of the last k evaluated rounds, round 0 excluded) and
        ``rounds_to/<t>`` for ``cfg.targets`` (NaN: never reached)."""
        if not self.curve:
            return {}
        tail = [c for c in self.curve if c[0] > 0][-last_k:] or self.curve[-1:]
        out = {"global/top1": sum(c[1] for c in tail) / len(tail), "global/top5": sum(c[2] for c in tail) / len(tail)}
        for t, rnd in rounds_to([(c[0], c[1]) for c in self.curve], self.cfg.targets).items():
            out[f"rounds_to/{t:g}"] = float("nan") if rnd is None else float(rnd)
        return out


def global_model(fed, method) -> torch.nn.Module:
    return method.global_model(fed.ctx)


def rounds_to(curve: Sequence[Tuple[int, float]], targets: Sequence[float]) -> Dict[float, Optional[int]]:
    """First round whose accuracy reaches each target (None: never), from (round, accuracy) pairs."""
    out: Dict[float, Optional[int]] = {}
    ordered = sorted(curve)
    for t in targets:
        out[t] = next((r for r, acc in ordered if acc >= t), None)
    return out
