"""``fedshift ui-url | relocate-store``: administering the project's MLflow store.

The one idea: the store (mlflow.db + mlartifacts/) outside any run: where each experiment's
headline view opens, and pointing a copied or moved store at its own artifacts.
``fedshift.tracking`` (MLflow) is imported in the command bodies so that ``fedshift --help``
does not load it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError


def cmd_ui_url(args) -> None:
    from ..tracking import headline_view_urls

    urls = headline_view_urls(base=args.base.rstrip("/"))
    if not urls:
        raise ConfigError("the MLflow store holds no federated experiment yet: run the workflow first")
    for name, url in sorted(urls.items()):
        print(f"{name}\t{url}")


def cmd_relocate_store(args) -> None:
    from ..tracking import relocate_store

    root = Path(args.root).resolve()
    if not (root / "mlflow.db").exists():
        raise ConfigError(f"{root} holds no mlflow.db; give the project folder of the copied store")
    print(f"{relocate_store(root)} artifact locations now under {root / 'mlartifacts'}")
