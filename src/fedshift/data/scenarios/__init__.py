"""Scenario builders; importing this package registers every scenario."""

from . import rotmnist  # noqa: F401
from . import fccl  # noqa: F401
from . import fedh2l  # noqa: F401
from . import fedmmd  # noqa: F401
from . import digits_offline  # noqa: F401
from . import rotmnist_alpha  # noqa: F401
from . import fedmmd_offline  # noqa: F401
from . import noisy_mnist  # noqa: F401  (docs/datasets.md "Adding a scenario": the worked example)
