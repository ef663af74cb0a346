import re
from pathlib import Path
from fedshift.engine.config import EngineConfig
from fedshift.methods.base import check_requirements
code = re.search(r"```python\n(.*?)```", Path("/work/main/docs/extending.md").read_text().split(
    "### Per-participant state and a server step")[1], re.S).group(1)
ns = {"__name__": "scaffold_doc"}; exec(code, ns)
try:
    check_requirements("scaffold_plugin", ns["Scaffold"].requires, EngineConfig(), "none"); print("accepted")
except Exception as e:
    print(type(e).__name__, e)
