"""``python -m fedshift.cli``: the console script without its wrapper (tests, benchmarks, Snakemake rules)."""

import sys

from . import main

sys.exit(main())
