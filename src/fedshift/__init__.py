"""fedshift: reproducible heterogeneous federated learning under domain shift.

Rebuilds the FCCL / FCCL+ benchmark (with FedH2L, FedMMD/FedFusion and their
counterparts) as a DVC + Snakemake + MLflow pipeline. The library is split into
``data`` (fetch, on-disk format, partitions), ``models`` (registered factories),
``methods`` (one file per federated algorithm), ``engine`` (round loop, evaluation),
``runner`` (one job: data, models and method from a config), ``tracking`` (tracker
protocol) and ``report`` (tables and figures); their layers: docs/extending.md.
"""

__version__ = "0.1.0"
