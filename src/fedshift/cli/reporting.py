"""``fedshift collect | report``: finished runs into one tidy CSV, and that CSV into a report.

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
    make_report(Path(args.runs_csv), Path(args.out), report_cfg or {}, tracking=not args.no_tracking)
