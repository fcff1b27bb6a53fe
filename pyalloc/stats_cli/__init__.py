"""``pyalloc-stats``: read pyalloc snapshots, traces and live stats from the command line.

Subcommands, one module each: ``report`` (report.py), ``plot`` (plot.py), ``watch``
(watch.py), ``compare`` (compare.py) and ``export-memviz`` (memviz.py). The figures come
from :mod:`pyalloc.stats_cli.analysis`, which other tools import directly::

    from pyalloc.stats_cli import analyze_snapshot, trace_timeline

A user error (bad file, bad argument, unwritable output) prints one line
``pyalloc-stats: error: <message>`` and exits with status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, NoReturn, Optional

from .analysis import (MalformedDocument, analyze, analyze_snapshot, analyze_trace,
                       block_histogram, iter_events, key_figures, oom_events, segment_figures,
                       trace_timeline)
from .common import PROG, CliError

__all__ = [
    "CliError", "MalformedDocument", "analyze", "analyze_snapshot", "analyze_trace",
    "block_histogram", "iter_events", "key_figures", "main", "oom_events", "segment_figures",
    "trace_timeline",
]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that says where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from . import compare, memviz, plot, report, watch

    parser = _Parser(prog=PROG, description=(
        "Inspect pyalloc memory snapshots and traces (docs/formats.md), watch a running "
        "process's stats, and export to pytorch.org/memory_viz."))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in (report, plot, watch, compare, memviz):
        module.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``pyalloc-stats``; returns the exit status (0 success, 2 user error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed
        return int(e.code or 0)
    try:
        return args.run(args)
    except CliError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `pyalloc-stats report x | head`: the reader left; that is not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush does not fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
