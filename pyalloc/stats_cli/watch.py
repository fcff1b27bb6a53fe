"""``pyalloc-stats watch PID_OR_FILE``: a live view of a running process's allocator.

The process publishes its stats periodically, atomically, to a JSON file
(``pyalloc.install(stats_file=...)`` or ``PYALLOC_STATS_FILE``; see pyalloc/publish.py)::

    {"format": "pyalloc-stats", "version": 1, "time": ISO, "pid": int, "device": ...,
     "stats": {... pyalloc.memory_stats() ...}}

Given a PID, the file is ``<tempfile.gettempdir()>/pyalloc-stats-<PID>.json``, where
``stats_file="auto"`` publishes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from .. import nvml
from .common import CliError, format_bytes, format_ratio
from .render import Section, print_sections, rich_renderables, use_rich

STATS_FORMAT = "pyalloc-stats"
STATS_VERSION = 1
SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40
PUBLISH_HINT = ("the process must publish its stats: start it with "
                "pyalloc.install(stats_file=\"auto\") or PYALLOC_STATS_FILE=auto and watch "
                "its PID, or with stats_file=PATH / PYALLOC_STATS_FILE=PATH and watch PATH")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "watch", help="live view of a running process's allocator stats",
        description="Show a running process's allocator stats, refreshed every --interval "
                    "seconds until Ctrl-C. " + PUBLISH_HINT[0].upper() + PUBLISH_HINT[1:] +
                    f". Given a PID, the file read is {stats_path_for_pid('<PID>')}.")
    p.add_argument("target", metavar="PID_OR_FILE",
                   help="a process id, or the stats file the process publishes")
    p.add_argument("--interval", type=_positive_seconds, default=1.0, metavar="SECONDS",
                   help="seconds between refreshes (default: 1)")
    how_long = p.add_mutually_exclusive_group()
    how_long.add_argument("--once", action="store_true", help="show the stats once and exit")
    how_long.add_argument("--count", type=_positive_int, metavar="N",
                          help="refresh N times, then exit")
    p.set_defaults(run=run)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def stats_path_for_pid(pid: Any) -> Path:
    return Path(tempfile.gettempdir()) / f"pyalloc-stats-{pid}.json"


def process_running(pid: int) -> Optional[bool]:
    """Whether ``pid`` is alive; ``None`` where we cannot tell without side effects."""
    if os.name != "posix":
        return None  # os.kill(pid, 0) on Windows would send CTRL_C_EVENT, not probe
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    except OSError:
        return None
    return True


def load_stats_file(path: Path, pid: Optional[int] = None) -> Dict[str, Any]:
    """Reads a published stats file; every problem is a :class:`CliError` that says what
    to do."""
    if not path.exists():
        who = f"process {pid}" if pid is not None else "the process"
        gone = " (and no such process is running)" if pid is not None and \
            process_running(pid) is False else ""
        raise CliError(f"{path}: no stats file: {who} has not published stats{gone}; "
                       f"{PUBLISH_HINT}")
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise CliError(f"{path}: not a pyalloc stats file (not valid JSON)") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read: {e.strerror or e}") from None
    if not isinstance(doc, dict) or "format" not in doc:
        raise CliError(f"{path}: JSON, but not a pyalloc stats file (no \"format\" key)")
    if doc["format"] in ("pyalloc-snapshot", "pyalloc-trace"):
        raise CliError(f"{path}: is a {doc['format']}, not live stats; "
                       "read it with 'pyalloc-stats report'")
    if doc["format"] != STATS_FORMAT:
        raise CliError(f"{path}: unknown format {doc['format']!r}; expected {STATS_FORMAT!r}")
    version = doc.get("version")
    if not isinstance(version, int) or version > STATS_VERSION:
        raise CliError(f"{path}: {STATS_FORMAT} version {version!r} is newer than this pyalloc "
                       f"reads (version {STATS_VERSION}); upgrade pyalloc")
    if not isinstance(doc.get("stats"), dict):
        raise CliError(f"{path}: {STATS_FORMAT} has no \"stats\" object")
    return doc


def sparkline(values: List[float], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as block characters, scaled from 0 to their maximum
    (from 0, so a flat high line does not look like a flat empty one)."""
    values = values[-width:]
    top = max(values, default=0)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(int(v / top * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)]
                   for v in values)


def frame_sections(doc: Dict[str, Any], path: Path, history: List[int],
                   running: Optional[bool], age_s: float, interval: float) -> List[Section]:
    """One refresh of the view."""
    s = doc["stats"]
    pid = doc.get("pid")
    rows = [
        ("allocated", format_bytes(s.get("allocated_bytes.all.current"))),
        ("reserved", format_bytes(s.get("reserved_bytes.all.current"))),
        ("peak allocated", format_bytes(s.get("allocated_bytes.all.peak"))),
        ("peak reserved", format_bytes(s.get("reserved_bytes.all.peak"))),
        ("budget", format_bytes(s.get("budget_bytes"))),
        ("utilization", format_ratio(s.get("utilization"))),
        ("external fragmentation", format_ratio(s.get("external_fragmentation"))),
        ("largest free block", format_bytes(s.get("largest_free_block"))),
        ("alloc retries", str(s.get("num_alloc_retries", "-"))),
        ("stitches", f"{s.get('num_stitches', 0)} "
                     f"({format_bytes(s.get('num_stitched_bytes', 0))})"),
        ("OOMs", str(s.get("num_ooms", "-"))),
        ("allocated over the watch", f"{sparkline(history)}  max {format_bytes(max(history))}"),
    ]
    if "remat.recomputes" in s:   # policy="recompute" (docs/stats.md)
        rows[-1:-1] = [
            ("evictions (engine / eager)",
             f"{s.get('remat.evictions', 0)} / {s.get('remat.eager_evictions', 0)}"),
            ("recomputes", f"{s['remat.recomputes']} "
                           f"({s.get('remat.recompute_ns', 0) / 1e9:.2f} s)"),
            ("evicted now", format_bytes(s.get("remat.evicted_bytes"))),
        ]
    if "remat.swap_outs" in s:    # policy="swap" or "hybrid"
        rows[-1:-1] = [
            ("swaps out / in",
             f"{s['remat.swap_outs']} ({format_bytes(s.get('remat.swap_out_bytes'))}) / "
             f"{s.get('remat.swap_ins', 0)} ({format_bytes(s.get('remat.swap_in_bytes'))})"),
            ("prefetched (used / ready at use)",
             f"{s.get('remat.prefetches', 0)} ({s.get('remat.prefetch_hits', 0)} / "
             f"{s.get('remat.prefetch_ready', 0)})"),
            ("host pool", f"{format_bytes(s.get('host_pool_used_bytes.current'))} of "
                          f"{format_bytes(s.get('host_pool_bytes'))}"),
        ]
    if doc.get("device") == "cuda":   # the whole GPU, beside the process's own figures
        view, why = nvml.device_view(int(doc.get("device_index", 0)))
        rows[-1:-1] = nvml.view_rows(view, why, pid, format_bytes)
    notes = []
    if running is False:
        notes.append(f"process {pid} is not running: these are its last stats, "
                     f"published {age_s:.0f} s ago")
    elif age_s > max(10 * interval, 10.0):
        notes.append(f"the stats are {age_s:.0f} s old: is the process still publishing?")
    title = f"pyalloc stats: pid {pid}, device {doc.get('device', '?')}, " \
            f"published {doc.get('time', '?')} ({path})"
    return [Section(title, rows, notes=notes)]


def _age_seconds(path: Path) -> float:
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return 0.0  # replaced between our read and now: it is fresh


def frames(path: Path, pid: Optional[int], count: Optional[int], interval: float
           ) -> Iterator[List[Section]]:
    """Reads the file every ``interval`` seconds and yields the view; stops after ``count``
    frames, or after the first frame that finds the process gone."""
    history: List[int] = []
    shown = 0
    while count is None or shown < count:
        doc = load_stats_file(path, pid)
        history.append(int(doc["stats"].get("allocated_bytes.all.current", 0)))
        published_pid = doc.get("pid", pid)
        running = process_running(published_pid) if isinstance(published_pid, int) else None
        age_s = _age_seconds(path)
        yield frame_sections(doc, path, history, running, age_s, interval)
        shown += 1
        if running is False:
            return  # nothing will change any more
        if count is None or shown < count:
            time.sleep(interval)


def run(args: argparse.Namespace) -> int:
    pid = int(args.target) if args.target.isdigit() else None
    path = stats_path_for_pid(pid) if pid is not None else Path(args.target)
    count = 1 if args.once else args.count
    try:
        if use_rich(sys.stdout) and count != 1:
            _show_live(frames(path, pid, count, args.interval))
        else:
            for i, sections in enumerate(frames(path, pid, count, args.interval)):
                if i:
                    print()
                print_sections(sections)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends
    return 0


def _show_live(view: Iterator[List[Section]]) -> None:
    from rich.console import Group
    from rich.live import Live

    with Live(auto_refresh=False) as live:
        for sections in view:
            live.update(Group(*rich_renderables(sections)), refresh=True)
