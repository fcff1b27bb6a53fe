"""``pyalloc-stats compare A B``: two snapshots or traces side by side, with deltas."""
from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List, Optional

from .analysis import key_figures
from .common import format_bytes, format_ratio, load_document
from .render import Section, print_sections

RATIOS = ("utilization", "external_fragmentation")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare", help="key figures of two snapshots or traces, with deltas",
        description="Compare two snapshots or traces (B relative to A): reserved and "
                    "allocated bytes now and at peak, utilization, external fragmentation, "
                    "largest free block, segments, retries, OOMs and, for traces, event "
                    "counts. Peaks of a trace are over the recording (replayed from its "
                    "events); peaks of a snapshot come from its stats (since the last peak "
                    "reset), or are its current values when it has none.")
    p.add_argument("a", metavar="A", help="the baseline snapshot or trace")
    p.add_argument("b", metavar="B", help="the snapshot or trace compared with A")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    figures = compare_figures(key_figures(load_document(args.a)),
                              key_figures(load_document(args.b)))
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "figures": figures}, indent=2))
    else:
        print_sections([comparison_section(figures, args.a, args.b)])
    return 0


def compare_figures(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """For each figure of either side: both values, ``delta = b - a`` and
    ``relative = delta / a`` (``None`` where a side lacks it or ``a`` is 0)."""
    names = list(a) + [k for k in b if k not in a]
    out = {}
    for name in names:
        va, vb = a.get(name), b.get(name)
        delta = vb - va if va is not None and vb is not None else None
        relative = delta / va if delta is not None and va else None
        out[name] = {"a": va, "b": vb, "delta": delta, "relative": relative}
    return out


def _value(name: str, v: Optional[float], signed: bool = False) -> str:
    if v is None:
        return "-"
    sign = "+" if signed and v > 0 else ""
    if name.endswith("_bytes") or name == "largest_free_block":
        return sign + format_bytes(v)
    if name in RATIOS:
        # A change of a ratio is in percentage points, not percent.
        return f"{sign}{100 * v:.1f} pt" if signed else format_ratio(v)
    if name == "duration_ns":
        return f"{sign}{v / 1e6:.3f} ms"
    return f"{sign}{v}"


def comparison_section(figures: Dict[str, Dict[str, Any]], a: str, b: str) -> Section:
    rows: List[List[str]] = []
    for name, f in figures.items():
        relative = "-" if f["relative"] is None else f"{100 * f['relative']:+.1f}%"
        rows.append([name, _value(name, f["a"]), _value(name, f["b"]),
                     _value(name, f["delta"], signed=True), relative])
    return Section(f"Compare: A = {a}, B = {b}", rows,
                   ["figure", "A", "B", "B - A", "relative"], "lrrrr")
