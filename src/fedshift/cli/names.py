"""``fedshift list``: what the registries hold, one name per line.

The one idea: show a user the names a grid may use (datasets, scenarios, public sets, models,
structures, methods), where each comes from and, with ``--long``, what a method needs.
Each registry is imported only when its kind is listed (``_registries`` holds loaders, not
registries): the data, model and method registries import torch, which ``fedshift --help``
and ``fedshift list`` without a kind must not wait for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict

if TYPE_CHECKING:
    from ..registry import Registry


def _registries() -> Dict[str, Callable[[], "Registry"]]:
    def datasets():
        from ..data import DATASETS
        return DATASETS

    def scenarios():
        from ..data import SCENARIOS
        return SCENARIOS

    def public():
        from ..data import PUBLIC_SETS
        return PUBLIC_SETS

    def models():
        from ..models import MODELS
        return MODELS

    def structures():
        from ..models.structures import STRUCTURES, sync_homogeneous
        sync_homogeneous()  # homo_<model> for plugin models too
        return STRUCTURES

    def methods():
        from ..methods import METHODS
        return METHODS

    return {"datasets": datasets, "scenarios": scenarios, "public": public, "models": models,
            "structures": structures, "methods": methods}


def cmd_list(args) -> None:
    """One name per line; a plugin's line names its package, ``--where`` every name's origin,
    ``--long`` what a method needs and its first docstring line. Without a kind: the kinds.
    A plugin left out (import failure, name clash) is one warning line on stderr (fedshift.registry)."""
    if args.kind is None:
        print("what `fedshift list KIND` prints (--where: where each name comes from; --long: what it needs "
              "and what it is):")
        for kind in sorted(_registries()):
            print(f"  {kind}")
        return
    reg = _registries()[args.kind]()
    for name in reg.names():
        origin = reg.origin(name)
        if args.where:
            print(f"{name}\t{origin}")
        elif args.long:
            print(f"{name}\t{_describe(args.kind, reg.get(name))}")
        else:
            print(f"{name}\t[{origin.split(' (')[0]}]" if origin.startswith("plugin ") else name)


def _first_line(obj) -> str:
    import inspect  # ~5 ms that only `list --long` needs, not `fedshift --help`

    doc = inspect.getdoc(obj) or inspect.getdoc(inspect.getmodule(obj)) or ""
    return " ".join(doc.split("\n\n")[0].split())[:160]


def _describe(kind: str, obj) -> str:
    """``list --long``: for a method what it needs (public set, BASE checkpoints, one architecture)
    with its default params, then the first paragraph of its docstring."""
    if kind == "scenarios":  # what it is, and the test set `test_protocol: authors` gives it (issue 47)
        return f"{obj.doc or _first_line(obj)}\ttest_protocol authors: {obj.authors_test or 'none known (refused)'}"
    if kind != "methods":
        return _first_line(obj)
    needs = []
    try:
        from ..methods import resolve_method_params

        method = obj(resolve_method_params(obj.name if isinstance(getattr(obj, "name", None), str) else "", {}))
        if method.uses_public:
            needs.append("public set")
        if obj.needs_base(method.p):
            needs.append("BASE checkpoints (pretrain)")
    except Exception:  # noqa: BLE001 - a plugin whose defaults do not resolve alone: say so, list the rest
        needs.append("? (defaults do not resolve alone)")
    if obj.requires_homogeneous:
        needs.append("a homo_<model> structure")
    return f"needs: {', '.join(needs) or 'private data only'}\t{_first_line(obj)}"
