"""Pure loss functions of FCCL / FCCL+ and of the benchmark's counterparts.

Every function takes tensors and returns a scalar tensor (unless stated), keeps the
input dtype (float64 works end to end), is differentiable, never modifies its inputs
in place and holds no state. Weights that the papers put *outside* a loss (FISL's
omega, FCCL's lambda_Loc, MOON's mu, ...) are left to the caller; each docstring says
which equation it implements and which reductions it uses.

Papers: FCCL (Huang et al., CVPR 2022, ``papers/fccl-cvpr2022.txt``), FCCL+ (Huang et
al., TPAMI, ``papers/fccl-plus-tpami.txt``); counterparts as in ``REFERENCE.md``.
Where the paper and the authors' code differ, the authors' form is the default and
the docstring says so.

One module per idea (issue 35); this package's ``__all__`` is the interface, so callers
import from ``fedshift.losses`` and never from a module of it:

* ``classification``: losses against the labels (CE with the padding mask, RHFL's
  symmetric CE, FedRS's restricted logits);
* ``correlation``: FCCL / FCCL+'s collaborative terms (cross-correlation, FCCM,
  instance similarity, FISL);
* ``distillation``: logit distillation toward a teacher (KD, FNTD, FCCL's dual-domain
  KD, FedDF, FedMD's digest, FML);
* ``regularization``: penalties in parameter space (EWC and its Fisher, FedProx);
* ``contrastive``: MOON's and FedProc's contrastive terms;
* ``consensus``: learning from the peers' predictions (FedMatch, RHFL's weighting and
  alignment, RCFL's class-wise aggregation);
* ``h2l``: FedH2L's gradient projection and mutual loss;
* ``domain``: FedMMD / FedFusion's stream discrepancies (MMD², two-stream L2) and EMA;
* ``_common``: the private helpers they share.
"""

from __future__ import annotations

from ._common import Params
from .classification import (
    cross_entropy, symmetric_ce_loss, RESTRICTIONS, fedrs_class_scales, restricted_logits,
)
from .correlation import cross_correlation, fccm_loss, instance_similarity, fisl_loss
from .distillation import (
    kd_loss, fntd_loss, inter_domain_kd, intra_domain_kd, fccl_dual_distillation_loss, soft_target_loss,
    fedmd_digest_loss, mutual_learning_losses,
)
from .regularization import ewc_penalty, diagonal_fisher, prox_term
from .contrastive import moon_contrastive_loss, fedproc_alpha, class_prototypes, prototype_contrastive_loss
from .consensus import (
    agreement_pseudo_labels, fedmatch_unlabeled_loss, rhfl_confidence_weights, weighted_kl_alignment,
    classwise_aggregate,
)
from .h2l import PROJECTIONS, project_gradient, confidence_weights, batch_accuracy, h2l_mutual_loss
from .domain import MMD_BANDWIDTH_MULTIPLIERS, mmd2_rbf, two_stream_l2, ema

from . import _common, classification, consensus, contrastive, correlation, distillation, domain, h2l, regularization

# the public names are the ones each module declares (its own ``__all__``), not a third list kept by hand
__all__ = [*_common.__all__, *classification.__all__, *correlation.__all__, *distillation.__all__,
           *regularization.__all__, *contrastive.__all__, *consensus.__all__, *h2l.__all__, *domain.__all__]
