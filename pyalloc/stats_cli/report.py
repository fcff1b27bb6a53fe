"""``pyalloc-stats report FILE``: where the memory of a snapshot or trace went."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

from .analysis import SMALL_REQUEST, analyze
from .common import (format_address, format_bytes, format_power_of_two, format_ratio,
                     load_document)
from .render import Section, print_sections

DESCRIPTION = """\
Summarize a pyalloc snapshot or trace: totals, utilization and fragmentation, one row per
segment, a histogram of block sizes, the most fragmented segments and the reclaim counters.
For a trace, also the events by action and the peaks of allocated and reserved bytes
replayed from the events (starting from the trace's initial snapshot).

Fragmentation: a segment's "stranded" free bytes are its free bytes outside its largest free
block -- cache a request as large as that block cannot use, although it is free. The most
fragmented segments are those with the most stranded bytes. External fragmentation is
1 - largest free block / cached free bytes over the whole device (docs/stats.md)."""


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help="summarize a snapshot or trace",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="a pyalloc snapshot or trace (.json or .json.gz)")
    p.add_argument("--json", action="store_true",
                   help="print everything the report shows as one JSON object")
    p.add_argument("--top", type=_non_negative, default=5, metavar="N",
                   help="how many of the most fragmented segments to show (default: 5)")
    p.add_argument("--max-segments", type=_non_negative, default=40, metavar="N",
                   help="rows of the segment table (default: 40; 0: all). --json has all")
    p.set_defaults(run=run)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    doc = load_document(args.file)
    a = analyze(doc)
    snap = a["final"] if a["kind"] == "trace" else a
    snap["most_fragmented"] = snap["most_fragmented"][:args.top]
    for message in warnings_of(a):
        print(f"pyalloc-stats: warning: {args.file}: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"file": args.file, **a}, indent=2))
    else:
        print_sections(report_sections(a, args.file, args.max_segments))
    return 0


def warnings_of(a: Dict[str, Any]) -> List[str]:
    """What a reader must know before trusting a trace's figures."""
    if a["kind"] != "trace":
        return []
    out = []
    if a["dropped_events"] > 0:
        out.append(f"{a['dropped_events']} events were dropped (the trace ring overflowed): "
                   "event counts and peaks are incomplete; record a shorter block")
    elif not a["consistent"]:
        replayed = a["replayed_final"]
        totals = a["final"]["totals"]
        out.append(
            "replaying the events does not reach the final snapshot (allocated "
            f"{replayed['allocated_bytes']} vs {totals['allocated_bytes']}, reserved "
            f"{replayed['reserved_bytes']} vs {totals['reserved_bytes']}): peaks may be wrong")
    return out


def report_sections(a: Dict[str, Any], name: str, max_segments: int = 40) -> List[Section]:
    snap = a["final"] if a["kind"] == "trace" else a
    sections = [totals_section(snap, name)]
    if snap.get("oom"):
        sections.append(oom_section(snap))
    if a["kind"] == "trace":
        sections += trace_sections(a)
    sections += [segments_section(snap["segments"], max_segments),
                 histogram_section(snap["histogram"]),
                 fragmented_section(snap["most_fragmented"]),
                 counters_section(snap)]
    return sections


def _bytes_exact(n: Any) -> str:
    return "-" if n is None else f"{format_bytes(n)} ({n} B)" if n >= 1024 else format_bytes(n)


def totals_section(snap: Dict[str, Any], name: str) -> Section:
    t = snap["totals"]
    which = "final state of the trace" if snap["kind"] == "trace" else "snapshot"
    where = ", ".join(str(x) for x in (f"device {snap['device']}", snap["backend"]) if x)
    return Section(f"{name}: {which} ({where})", [
        ("budget", _bytes_exact(t["budget_bytes"])),
        ("reserved", _bytes_exact(t["reserved_bytes"])),
        ("allocated", _bytes_exact(t["allocated_bytes"])),
        ("active", f"{_bytes_exact(t['active_bytes'])}, of which awaiting "
                   f"{format_bytes(t['awaiting_bytes'])}"),
        ("requested", _bytes_exact(t["requested_bytes"])),
        ("evictable", _bytes_exact(t.get("evictable_bytes"))),
        ("cached free", _bytes_exact(t["cached_free_bytes"])),
        ("utilization", f"{format_ratio(snap['utilization'])} (from {snap['utilization_source']})"),
        ("allocated / reserved now", format_ratio(snap["current_utilization"])),
        ("external fragmentation", format_ratio(snap["external_fragmentation"])),
        ("largest free block", _bytes_exact(snap["largest_free_block"])),
        ("segments / blocks", f"{t['segments']} / {t['blocks']}"),
    ])


def oom_section(snap: Dict[str, Any]) -> Section:
    """The request that failed when this snapshot was taken, and whether the bytes were
    there: free and evictable memory that covers it means placement failed, not capacity."""
    oom, t = snap["oom"], snap["totals"]
    headroom = max(0, (t["budget_bytes"] or 0) - t["reserved_bytes"])
    # Evictable bytes count only where an eviction policy could have freed them.
    evicting = snap.get("evicting") is not False
    there = t["cached_free_bytes"] + ((t["evictable_bytes"] or 0) if evicting else 0) + headroom
    rows = [("request", f"{_bytes_exact(oom['size'])}, rounded to {_bytes_exact(oom['rounded'])}"),
            ("stream", str(oom["stream"])),
            ("free + evictable + headroom" if evicting
             else "free + headroom (no eviction policy)", _bytes_exact(there))]
    if there < oom["rounded"]:
        verdict = "no: the bytes were not there (capacity)"
    elif oom["rounded"] <= SMALL_REQUEST:
        verdict = "yes: the bytes were there, in pieces (placement)"
    else:
        # A large request can also be stitched from whole chunks: count those.
        chunk = snap["chunk_bytes"]
        whole = snap["clearable_chunk_bytes"] + headroom // chunk * chunk
        needed = -(-oom["rounded"] // chunk) * chunk
        rows.append((f"of it in whole {format_bytes(chunk)} chunks", _bytes_exact(whole)))
        if whole < needed:
            verdict = (f"in bytes yes, in whole chunks no ({format_bytes(whole)} of the "
                       f"{format_bytes(needed)} stitching needs): the rest is pieces smaller "
                       "than a chunk between blocks that stay")
        elif snap.get("stitching") is False:
            verdict = ("yes, even in whole chunks: stitching would have served it, and it is "
                       "off (option stitch)")
        else:
            verdict = ("yes, even in whole chunks: the engine should have served it; "
                       "please report this file")
    rows.append(("covered the request", verdict))
    return Section("Out of memory when this snapshot was taken", rows,
                   notes=[line.strip() for line in oom.get("report", "").splitlines()[1:]])


def trace_sections(a: Dict[str, Any]) -> List[Section]:
    rows = [
        ("events", str(a["events"])),
        ("duration", f"{a['duration_ns'] / 1e6:.3f} ms"),
        ("peak allocated", _bytes_exact(a["peak_allocated_bytes"])),
        ("peak reserved", _bytes_exact(a["peak_reserved_bytes"])),
        ("utilization (peaks)", format_ratio(a["utilization"])),
        ("OOMs", str(len(a["ooms"]))),
        ("dropped events", str(a["dropped_events"]) + ("  << WARNING: incomplete trace"
                                                        if a["dropped_events"] else "")),
    ]
    notes = [] if a["has_initial"] else ["the trace has no initial snapshot: replay starts at 0"]
    counts = [(action, str(n)) for action, n in a["event_counts"].items()]
    return [Section("Trace (peaks replayed from the events)", rows, notes=notes),
            Section("Events by action", counts or [("(none)", "")])]


def segment_kind(s: Dict[str, Any]) -> str:
    """The segment's pool, and its class where it holds long-lived blocks or evictable
    ones, or whether it is expandable (grows and shrinks at its end)."""
    return s["segment_type"] + (" (long-lived)" if s.get("long_lived") else "") \
        + (" (evictable)" if s.get("evictable_class") else "") \
        + (" (expandable)" if s.get("expandable") else "")


def segments_section(segments: List[Dict[str, Any]], max_rows: int) -> Section:
    shown = segments if max_rows == 0 else segments[:max_rows]
    rows = [(format_address(s["address"]), segment_kind(s), format_bytes(s["total_size"]),
             format_ratio(s["allocated_fraction"]), str(s["blocks"]),
             format_bytes(s["largest_free_block"])) for s in shown]
    notes = []
    if len(shown) < len(segments):
        notes.append(f"... and {len(segments) - len(shown)} more (--max-segments 0 shows all)")
    return Section(f"Segments ({len(segments)}, by address)", rows,
                   ["address", "type", "size", "allocated", "blocks", "largest free"],
                   "llrrrr", notes)


def histogram_section(histogram: List[Dict[str, int]]) -> Section:
    rows = [(f"[{format_power_of_two(h['bucket_bytes'])}, "
             f"{format_power_of_two(2 * h['bucket_bytes'])})",
             str(h["allocated_count"]), format_bytes(h["allocated_bytes"]),
             str(h["awaiting_count"]), format_bytes(h["awaiting_bytes"]),
             str(h["free_count"]), format_bytes(h["free_bytes"])) for h in histogram]
    return Section("Block sizes (power-of-two buckets)", rows,
                   ["size", "allocated", "bytes", "awaiting", "bytes", "free", "bytes"],
                   "lrrrrrr")


def fragmented_section(ranked: List[Dict[str, Any]]) -> Section:
    rows = [(format_address(s["address"]), segment_kind(s), format_bytes(s["total_size"]),
             format_bytes(s["stranded_free_bytes"]), format_bytes(s["free_bytes"]),
             str(s["free_blocks"]), format_bytes(s["largest_free_block"])) for s in ranked]
    notes = ["stranded = free bytes outside the segment's largest free block"]
    if not ranked:
        notes.insert(0, "no segment has more than one free block")
    return Section("Most fragmented segments", rows,
                   ["address", "type", "size", "stranded", "free", "free blocks",
                    "largest free"], "llrrrrr", notes)


def counters_section(snap: Dict[str, Any]) -> Section:
    if not snap["has_stats"]:
        return Section("Reclaim counters", [("(the file has no stats)", "")])
    return Section("Reclaim counters", [(k, str(v)) for k, v in snap["counters"].items()])
