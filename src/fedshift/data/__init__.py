"""Data layer: registries, fetchers, on-disk format, partitions and audits.

Importing this package registers every dataset, public set and scenario.
"""

from .registry import DATASETS, PUBLIC_SETS, SCENARIOS, FetchContext  # noqa: F401
from . import embedded  # noqa: F401
from . import scenarios  # noqa: F401
from . import torchvision_sets  # noqa: F401
from . import tiny_imagenet  # noqa: F401
from . import manual  # noqa: F401
from . import public_sets  # noqa: F401
