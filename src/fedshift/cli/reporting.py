"""``fedshift collect | report | docs-tables``: finished runs into one tidy CSV, that CSV into a report,
and the docs' measured tables rendered from the committed run records.

The one idea: the workflow's last two rules, which read published run folders and never
train. ``fedshift.report`` (pandas, matplotlib, seaborn) is imported in the command bodies so
that ``fedshift --help`` does not load it.
"""

from __future__ import annotations

from pathlib import Path


def cmd_collect(args) -> None:
    from ..report.collect import collect

    collect([Path(p) for p in args.runs], Path(args.out), [Path(p) for p in args.pretrain or []])


def cmd_report(args) -> None:
    from ..config import read_yaml_file
    from ..report.report import make_report

    report_cfg = (read_yaml_file(args.config) or {}) if args.config else {}  # one line if broken (issue 51 Q19)
    if args.archive:  # issue 52: the records the workflow read or left out (fedshift.report.records)
        report_cfg = {**report_cfg, "archive": args.archive}
    make_report(Path(args.runs_csv), Path(args.out), report_cfg or {}, tracking=not args.no_tracking)


def cmd_docs_tables(args) -> None:
    """Re-render the docs' generated blocks from the committed archive (fedshift.archive.docs); ``--check``
    writes nothing and fails (status 1) naming each block whose text differs from its records."""
    import sys

    from ..archive.docs import check_or_write, doc_files
    from ..errors import RunError

    files = [Path(f) for f in args.files] or doc_files()
    changed = check_or_write(files, Path(args.records), write=not args.check)
    for line in changed:
        print(line, file=sys.stderr)
    if args.check and changed:
        raise RunError(f"{len(changed)} generated block(s) differ from the records; run `fedshift docs-tables` "
                       "and commit the docs (never edit a generated block by hand)")
    print(f"fedshift docs-tables: {len(changed)} block(s) {'differ' if args.check else 'rewritten'}", file=sys.stderr)
