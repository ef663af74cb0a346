"""The docs block's Requirements refuse the engine's default optimiser (Adam) before any job."""
import sys

from _shared import REPO

sys.path.insert(0, str(REPO / "tests"))
from fedshift.engine.config import EngineConfig  # noqa: E402
from fedshift.methods.base import check_requirements  # noqa: E402
from test_method_contract import _doc_scaffold  # noqa: E402

_, Scaffold = _doc_scaffold()
try:
    check_requirements("scaffold_plugin", Scaffold.requires, EngineConfig(), "none")
    print("accepted")
except Exception as e:
    print(type(e).__name__, e)
