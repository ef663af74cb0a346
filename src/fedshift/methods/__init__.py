"""Federated methods, one file each; importing this package registers them all."""

from .base import METHODS, Method, create_method, resolve_method_params  # noqa: F401
from . import fedavg, fedmd, fccl, fccl_plus, feddf  # noqa: F401
from . import fedprox, moon, fedproc, fedrs, fml, fedmatch, rhfl, rcfl  # noqa: F401  (FCCL+ counterparts)
from . import fedh2l, ind, agg  # noqa: F401
from . import fedmmd, fedfusion  # noqa: F401
from . import fedproto, fedtgp, fpl, fedheal, fdse  # noqa: F401  (issue 37: current domain-shift baselines)
from . import scaffold, fednova  # noqa: F401  (issue 49: server steps on the round context)
