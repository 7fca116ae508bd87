"""``accel-kit report [OUTPUT_DIR ...] --out report.html``: the cross-system report from the command line."""
from __future__ import annotations

import argparse


def _cmd_report(args: argparse.Namespace) -> int:
    from accel_kit.paths import output_dir, writable_file
    from accel_kit.report import build_report

    # build_report's default page, made explicit here so that its folder is checked before any record is read.
    out = args.out or (output_dir() / "report.html" if not args.sources else "report.html")
    writable_file(out, "report page (--out)")
    report = build_report(args.sources or None, out=out, systems=args.system, by_run=args.by_run,
                          formats=args.format or ())
    print(report.summary())
    return 0


def add_report_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``report`` to the main CLI's subparsers (``parser.add_subparsers()``); returns its parser."""
    from accel_kit.report import IMAGE_FORMATS

    rep = subparsers.add_parser(
        "report", help="one offline HTML page of every study's tables and figures, across systems",
        description="Merge the records of one or several results folders (several machines' outputs/, or "
                    "archives of them) into one self-contained HTML page: systems, findings, Tables II-IV, "
                    "Figures 3-8, each number citing its record.")
    rep.add_argument("sources", nargs="*", metavar="OUTPUT_DIR",
                     help="results folders, .jsonl files or archives (.tar.gz, .tgz, .tar, .zip); "
                          "default: this project's outputs/")
    rep.add_argument("--out", default=None,
                     help="the HTML file (default: report.html here; without OUTPUT_DIR, outputs/report.html)")
    rep.add_argument("--system", action="append", metavar="ID", help="only this system (repeatable)")
    rep.add_argument("--by-run", action="store_true",
                     help="one column per run of each system, instead of each system's latest record per point")
    rep.add_argument("--format", action="append", choices=IMAGE_FORMATS,
                     help="also write every figure as a static image (repeatable) into <out stem>_figures/; "
                          "needs kaleido>=1 (pip install 'accel-kit[export]') and Chrome or Chromium")
    rep.set_defaults(func=_cmd_report)
    return rep
