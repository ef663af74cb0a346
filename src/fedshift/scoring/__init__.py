"""Scoring chosen by the grid, never by a method (issue 49): the registry of what an evaluation adds.

A grid's ``scoring:`` block (``scenario_overrides.<scenario>.scoring`` per scenario; never per method or
variant, so every row of a report table is scored alike) resolves to one
:class:`~fedshift.engine.config.ScoringConfig`:

* ``eval_models`` (``global`` | ``local``) and ``weighting`` (``samples`` | ``uniform``): which models are
  scored and how the server weighs participants; the engine applies them (its round context times the
  server's delivery and computes ``ctx.weights``), so a method's server step is written once;
* ``predict`` (``head`` | ``prototype``): a participant predicts with its classifier, or with the nearest
  of its method's prototypes (``Method.prototype_scores``: FedProto, FedTGP);
* ``metrics``: names of :data:`SCORERS`, metric sets each evaluation adds to FCCL+ Eq. 21-22 (always
  computed). Built in: ``pooled``, FedH2L's WDP / CDP / ACC (:mod:`fedshift.scoring.pooled`). A plugin
  package adds one under the entry-point group ``fedshift.scorers`` (an object with ``name``, ``rows`` and
  ``extras(rows, sizes)``, :class:`Scorer`).
"""

from __future__ import annotations

from .registry import SCORERS, Scorer, scorers  # noqa: F401
from . import pooled  # noqa: F401  (registers the built-ins)
