"""Figures from pyalloc snapshots and traces (docs/formats.md, docs/stats.md).

Pure functions over the loaded JSON documents; they return plain dicts and lists and print
nothing, so the CLI, the demo and the benchmarks share one definition of every figure.

Every function that takes a ``doc`` accepts a snapshot document, a trace document (whose
*final* snapshot and stats describe the memory), or the bare dict of
:meth:`pyalloc.Engine.snapshot` (then pass its stats separately where asked).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

SNAPSHOT = "pyalloc-snapshot"
TRACE = "pyalloc-trace"

ALLOCATED, AWAITING, FREE = "active_allocated", "active_awaiting_free", "inactive"
BLOCK_STATES = (ALLOCATED, AWAITING, FREE)

# Counters of the reclaim ladder (docs/stats.md), shown in this order.
RECLAIM_COUNTERS = ("num_alloc_retries", "num_ooms", "num_stream_fences", "num_device_alloc",
                    "num_device_free", "num_sync_all_streams", "num_invalid_frees")
# Later policies add their own counters; show whichever of them a file has.
POLICY_COUNTER_PREFIXES = ("num_evict", "num_recompute", "num_swap", "num_stitch",
                           "num_segment_", "remat.")

REQUIRED_COLUMNS = ("t_ns", "action", "address", "size")


class MalformedDocument(ValueError):
    """A document has the right ``format`` key but not the shape docs/formats.md gives."""


# --- shape checks ----------------------------------------------------------------------

def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_snapshot(snapshot: Any, where: str = "snapshot") -> None:
    """Raises :class:`MalformedDocument` unless segments and blocks are as documented:
    integer sizes, known block states, blocks tiling their segment in address order."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise MalformedDocument(f"{where} has no \"segments\" list")
    granularity = snapshot.get("granularity_bytes")
    if granularity is not None and (not _is_int(granularity) or granularity <= 0):
        raise MalformedDocument(f"{where}: \"granularity_bytes\" must be a positive integer")
    for i, seg in enumerate(snapshot["segments"]):
        name = f"{where} segment {i}"
        if not isinstance(seg, dict):
            raise MalformedDocument(f"{name} is not an object")
        for key in ("address", "total_size"):
            if not _is_int(seg.get(key)) or seg[key] < 0:
                raise MalformedDocument(f"{name}: \"{key}\" must be a non-negative integer")
        if not isinstance(seg.get("blocks"), list):
            raise MalformedDocument(f"{name}: \"blocks\" must be a list")
        _validate_blocks(seg, name)


def _validate_blocks(seg: Dict[str, Any], name: str) -> None:
    offset = seg["address"]
    for j, block in enumerate(seg["blocks"]):
        if not isinstance(block, dict) or not _is_int(block.get("size")) or block["size"] <= 0:
            raise MalformedDocument(f"{name} block {j}: \"size\" must be a positive integer")
        if block.get("state") not in BLOCK_STATES:
            raise MalformedDocument(
                f"{name} block {j}: state {block.get('state')!r} is not one of "
                f"{', '.join(BLOCK_STATES)}")
        if "address" in block and block["address"] != offset:
            raise MalformedDocument(
                f"{name} block {j}: address {block['address']:#x} leaves a gap or overlap "
                f"(blocks must tile the segment; expected {offset:#x})")
        offset += block["size"]
    covered = offset - seg["address"]
    if covered != seg["total_size"]:
        raise MalformedDocument(
            f"{name}: blocks cover {covered} of its {seg['total_size']} bytes "
            "(blocks must tile the segment)")


def validate_document(doc: Dict[str, Any]) -> None:
    """Checks a loaded snapshot or trace deeply enough that every analysis can trust it."""
    if doc.get("format") == TRACE:
        _validate_trace(doc)
    else:
        validate_snapshot(doc)
        if "stats" in doc and not isinstance(doc["stats"], dict):
            raise MalformedDocument("\"stats\" must be an object")


def _validate_trace(doc: Dict[str, Any]) -> None:
    for part in ("initial", "final"):
        if part not in doc:
            if part == "final":
                raise MalformedDocument("a trace needs a \"final\" snapshot")
            continue  # no initial state: the replay starts from empty memory
        state = doc[part]
        if not isinstance(state, dict) or "snapshot" not in state:
            raise MalformedDocument(f"\"{part}\" must be an object with a \"snapshot\"")
        validate_snapshot(state["snapshot"], f"{part} snapshot")
        if not isinstance(state.get("stats", {}), dict):
            raise MalformedDocument(f"\"{part}\" stats must be an object")
    columns = doc.get("columns")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise MalformedDocument("\"columns\" must be a list of column names")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise MalformedDocument(f"\"columns\" lacks {', '.join(missing)}")
    if not isinstance(doc.get("events"), list):
        raise MalformedDocument("\"events\" must be a list")
    width = len(columns)
    t, action, address, size = (columns.index(c) for c in REQUIRED_COLUMNS)
    for i, row in enumerate(doc["events"]):
        # `type(x) is int` rather than isinstance: it excludes bool, and this loop runs
        # once per event.
        if (type(row) is not list or len(row) != width or type(row[action]) is not str
                or type(row[t]) is not int or type(row[address]) is not int
                or type(row[size]) is not int):
            raise MalformedDocument(
                f"event {i} is not {width} values with {', '.join(REQUIRED_COLUMNS)} as "
                f"integer, string, integer, integer: {str(row)[:80]}")


# --- which snapshot and stats a document describes -------------------------------------

def is_trace(doc: Dict[str, Any]) -> bool:
    return doc.get("format") == TRACE


def snapshot_of(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The snapshot a document describes: itself, or a trace's final state."""
    return doc["final"]["snapshot"] if is_trace(doc) else doc


def stats_of(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The stats a document carries (a trace: its final stats); ``{}`` when it has none."""
    stats = doc["final"].get("stats") if is_trace(doc) else doc.get("stats")
    return stats or {}


def budget_of(doc: Dict[str, Any]) -> Optional[int]:
    for source in (doc, snapshot_of(doc), stats_of(doc)):
        if _is_int(source.get("budget_bytes")):
            return source["budget_bytes"]
    return None


# --- one snapshot ----------------------------------------------------------------------

def segment_figures(seg: Dict[str, Any]) -> Dict[str, Any]:
    """Occupancy of one segment, from its blocks.

    ``stranded_free_bytes`` is the segment's free memory outside its largest free block:
    the part of its cache a request as large as that block cannot use.
    """
    by_state = {state: 0 for state in BLOCK_STATES}
    free_sizes = []
    for block in seg["blocks"]:
        by_state[block["state"]] += block["size"]
        if block["state"] == FREE:
            free_sizes.append(block["size"])
    largest_free = max(free_sizes, default=0)
    total = seg["total_size"]
    return {
        "address": seg["address"],
        "segment_type": seg.get("segment_type", "?"),
        "long_lived": bool(seg.get("long_lived", False)),   # lifetime classes (docs/formats.md)
        "evictable_class": bool(seg.get("evictable_class", False)),   # evictable placement
        "expandable": bool(seg.get("expandable", False)),   # option expandable
        "total_size": total,
        "allocated_bytes": by_state[ALLOCATED],
        "active_bytes": by_state[ALLOCATED] + by_state[AWAITING],
        "free_bytes": by_state[FREE],
        "allocated_fraction": by_state[ALLOCATED] / total if total else 0.0,
        "blocks": len(seg["blocks"]),
        "free_blocks": len(free_sizes),
        "largest_free_block": largest_free,
        "stranded_free_bytes": by_state[FREE] - largest_free,
    }


def block_histogram(segments: List[Dict[str, Any]]) -> List[Dict[str, int]]:
    """Blocks by size in power-of-two buckets ``[2**k, 2**(k+1))``, ascending; one row per
    bucket that holds a block, with the count and bytes of each state."""
    buckets: Dict[int, Dict[str, int]] = {}
    names = {ALLOCATED: "allocated", AWAITING: "awaiting", FREE: "free"}
    for seg in segments:
        for block in seg["blocks"]:
            low = 1 << (block["size"].bit_length() - 1)
            row = buckets.setdefault(low, {"bucket_bytes": low, **{
                f"{n}_{f}": 0 for n in names.values() for f in ("count", "bytes")}})
            name = names[block["state"]]
            row[f"{name}_count"] += 1
            row[f"{name}_bytes"] += block["size"]
    return [buckets[k] for k in sorted(buckets)]


def reclaim_counters(stats: Dict[str, Any]) -> Dict[str, int]:
    """The reclaim ladder's counters, and any policy counters (evict, swap, ...) present."""
    out = {k: stats[k] for k in RECLAIM_COUNTERS if k in stats}
    out.update({k: v for k, v in sorted(stats.items())
                if k.startswith(POLICY_COUNTER_PREFIXES) and k not in out})
    return out


def _ratio_or(numerator: float, denominator: float, empty: float) -> float:
    return numerator / denominator if denominator else empty


def analyze_snapshot(doc: Dict[str, Any], stats: Optional[Dict[str, Any]] = None
                     ) -> Dict[str, Any]:
    """Every figure ``pyalloc-stats report`` shows for one snapshot.

    Parameters
    ----------
    doc : dict
        A loaded snapshot or trace document (a trace: its final state), or the dict of
        :meth:`pyalloc.Engine.snapshot`.
    stats : dict, optional
        The stats to use instead of the document's own (e.g. :meth:`Engine.stats`).

    Returns
    -------
    dict
        ``totals`` (bytes reserved, allocated, active, awaiting, requested, evictable
        (None when the file does not say), cached free; segments, blocks, budget),
        ``utilization``, ``current_utilization``, ``external_fragmentation``, ``largest_free_block``, ``segments`` (per segment, by
        address, see :func:`segment_figures`), ``histogram`` (:func:`block_histogram`),
        ``most_fragmented`` (:func:`most_fragmented`) and ``counters``
        (:func:`reclaim_counters`); ``oom``: the failed request of a snapshot taken at an
        out-of-memory error, else None.

    Current figures come from the blocks, so they hold for any layout, with or without
    stats. ``utilization`` follows docs/stats.md (peak allocated / peak reserved) when the
    stats carry peaks; otherwise it is the current ratio and ``utilization_source`` says so.
    """
    snapshot = snapshot_of(doc)
    stats = stats_of(doc) if stats is None else stats
    segments = [segment_figures(seg) for seg in snapshot["segments"]]
    totals = _totals(snapshot, segments)
    budget = budget_of(doc)
    totals["budget_bytes"] = budget if budget is not None else stats.get("budget_bytes")
    utilization, source = _utilization(totals, stats)
    chunk = chunk_bytes(snapshot)
    return {
        "kind": "trace" if is_trace(doc) else "snapshot",
        "device": snapshot.get("device", doc.get("device")),
        "backend": snapshot.get("backend", doc.get("backend")),
        "totals": totals,
        "utilization": utilization,
        "utilization_source": source,
        "current_utilization": _ratio_or(totals["allocated_bytes"], totals["reserved_bytes"], 1.0),
        "external_fragmentation": 1.0 - _ratio_or(
            totals["largest_free_block"], totals["cached_free_bytes"], 1.0),
        "largest_free_block": totals["largest_free_block"],
        "peaks": _stats_peaks(stats),
        "segments": sorted(segments, key=lambda s: s["address"]),
        "histogram": block_histogram(snapshot["segments"]),
        "most_fragmented": most_fragmented(segments),
        "counters": reclaim_counters(stats),
        "has_stats": bool(stats),
        # Present in a snapshot taken at an out-of-memory failure (save_snapshot(at_oom=True)).
        "oom": snapshot.get("oom"),
        # Whether an eviction policy was active (files before 2026-11-23 do not say).
        "evicting": snapshot.get("evicting"),
        "stitching": snapshot.get("stitching"),
        # The device's mapping granularity, what stitching maps (files older than the key
        # do not say; it was 2 MiB on both backends then).
        "chunk_bytes": chunk,
        # Only the OOM section reads it: a walk over every chunk is not paid for elsewhere.
        "clearable_chunk_bytes": clearable_chunk_bytes(
            snapshot, evicting=snapshot.get("evicting") is not False, chunk=chunk)
        if snapshot.get("oom") else None,
    }


STITCH_CHUNK = 2 << 20   # what stitching maps: CUDA's VMM granularity, and the simulated device's
SMALL_REQUEST = 1 << 20  # requests up to this size come from the small pool, never stitched


def chunk_bytes(snapshot: Dict[str, Any]) -> int:
    """The mapping granularity the snapshot's engine ran with (older files: 2 MiB)."""
    return snapshot.get("granularity_bytes") or STITCH_CHUNK


def clearable_chunk_bytes(snapshot: Dict[str, Any], evicting: bool = True,
                          chunk: int = STITCH_CHUNK) -> int:
    """Bytes of whole ``chunk``-aligned ranges that hold only free blocks (and, with
    ``evicting``, evictable ones): what evicting everything evictable and stitching every
    free run could hand a large request. Pieces smaller than a chunk are not counted."""
    total = 0
    for seg in snapshot["segments"]:
        if seg.get("segment_type") == "persistent":
            continue
        blocks = seg["blocks"]
        end = seg["address"] + seg["total_size"]
        start = -(-seg["address"] // chunk) * chunk
        i = 0
        for c in range(start, end - chunk + 1, chunk):
            while i < len(blocks) and blocks[i]["address"] + blocks[i]["size"] <= c:
                i += 1
            j, clear = i, True
            while j < len(blocks) and blocks[j]["address"] < c + chunk:
                b = blocks[j]
                if not (b["state"] == FREE or (evicting and b.get("evictable"))):
                    clear = False
                    break
                j += 1
            total += chunk if clear else 0
    return total


def _totals(snapshot: Dict[str, Any], segments: List[Dict[str, Any]]) -> Dict[str, Any]:
    blocks = [block for seg in snapshot["segments"] for block in seg["blocks"]]
    requested = sum(block.get("requested_size", 0) for block in blocks
                    if block["state"] == ALLOCATED)
    # Files written before blocks carried "evictable" say nothing about it: None, not 0.
    marked = [block for block in blocks if "evictable" in block]
    marked += [r for r in snapshot.get("stitched", []) if "evictable" in r]
    evictable = (sum(block["size"] for block in marked if block["evictable"])
                 if marked else None)
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(s["allocated_bytes"] for s in segments)
    active = sum(s["active_bytes"] for s in segments)
    return {
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "active_bytes": active,
        "awaiting_bytes": active - allocated,
        "requested_bytes": requested,
        "evictable_bytes": evictable,
        "cached_free_bytes": reserved - active,
        "largest_free_block": max((s["largest_free_block"] for s in segments), default=0),
        "segments": len(segments),
        "blocks": sum(s["blocks"] for s in segments),
    }


def _stats_peaks(stats: Dict[str, Any]) -> Dict[str, Optional[int]]:
    return {"allocated_bytes": stats.get("allocated_bytes.all.peak"),
            "reserved_bytes": stats.get("reserved_bytes.all.peak")}


def _utilization(totals: Dict[str, Any], stats: Dict[str, Any]):
    peaks = _stats_peaks(stats)
    if peaks["allocated_bytes"] is not None and peaks["reserved_bytes"] is not None:
        return _ratio_or(peaks["allocated_bytes"], peaks["reserved_bytes"], 1.0), "stats peaks"
    return (_ratio_or(totals["allocated_bytes"], totals["reserved_bytes"], 1.0),
            "current blocks (the file has no peak stats)")


def most_fragmented(segments: List[Dict[str, Any]], top: Optional[int] = None
                    ) -> List[Dict[str, Any]]:
    """Segments with stranded free bytes (see :func:`segment_figures`), most first."""
    ranked = sorted((s for s in segments if s["stranded_free_bytes"] > 0),
                    key=lambda s: (-s["stranded_free_bytes"], -s["free_blocks"], s["address"]))
    return ranked if top is None else ranked[:top]


# --- traces ----------------------------------------------------------------------------

class Event(NamedTuple):
    t_ns: int
    action: str
    address: int
    size: int
    requested: int
    stream: int
    context: int


def iter_events(doc: Dict[str, Any]) -> Iterator[Event]:
    """The trace's events, read through its ``columns`` (so column order may change and
    unknown columns are ignored; ``requested``, ``stream``, ``context`` default to 0)."""
    columns = doc["columns"]
    if columns == list(Event._fields):
        # The documented layout: rows are events as they stand (the fast path matters at
        # millions of events).
        return map(Event._make, doc["events"])
    picks = [columns.index(name) if name in columns else None for name in Event._fields]
    return (Event._make([row[i] if i is not None else 0 for i in picks])
            for row in doc["events"])


class Timeline(NamedTuple):
    """Allocated and reserved bytes after each event that changed them (``times_ns`` from
    the trace's clock); the first point is the initial snapshot's state."""
    times_ns: List[int]
    allocated: List[int]
    reserved: List[int]


class MemoryReplay:
    """Allocated and reserved bytes and the budget, moved by each event as docs/stats.md
    and docs/formats.md define them.

    A ``free_requested`` block stops counting as allocated (it is *awaiting*) but stays
    active until its ``free``. ``set_budget`` changes the budget. Other actions
    (``empty_cache``, evict, swap_*, ...) move no bytes here: the memory they release or
    take appears as its own free/segment event.
    """

    def __init__(self, initial: Optional[Dict[str, Any]], budget: Optional[int] = None) -> None:
        self.allocated = self.reserved = 0
        self.budget = budget
        self.awaiting: Set[int] = set()
        # Whether the last `free` completed a free_requested (memory_viz needs to know).
        self.last_free_was_awaiting = False
        for seg in (initial or {"segments": []})["segments"]:
            self.reserved += seg["total_size"]
            for block in seg["blocks"]:
                if block["state"] == ALLOCATED:
                    self.allocated += block["size"]
                elif block["state"] == AWAITING:
                    self.awaiting.add(block.get("address", -1))

    @classmethod
    def for_trace(cls, doc: Dict[str, Any]) -> "MemoryReplay":
        """The state when the trace's recording began."""
        initial = doc.get("initial") or {}
        budget = (initial.get("stats") or {}).get("budget_bytes")
        return cls(initial.get("snapshot"), budget if budget is not None else budget_of(doc))

    def apply(self, e: Event) -> bool:
        """Applies one event; returns whether allocated or reserved changed."""
        if e.action == "alloc":
            self.allocated += e.size
        elif e.action == "free_requested":
            self.awaiting.add(e.address)
            self.allocated -= e.size
        elif e.action == "free":
            self.last_free_was_awaiting = e.address in self.awaiting
            if self.last_free_was_awaiting:
                self.awaiting.discard(e.address)
                return False  # it stopped counting as allocated at free_requested
            self.allocated -= e.size
        elif e.action in ("segment_map", "segment_grow"):
            self.reserved += e.size
        elif e.action in ("segment_unmap", "segment_shrink"):
            self.reserved -= e.size
        else:
            if e.action == "set_budget":
                self.budget = e.size
            return False
        return True


def _initial_snapshot(doc: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    return (doc.get("initial") or {}).get("snapshot")


class TraceReplay(NamedTuple):
    """What one pass over a trace's events yields (see :func:`replay_trace`)."""

    timeline: Timeline
    counts: Counter
    ooms: List[Dict[str, int]]
    first_t_ns: int
    last_t_ns: int
    # (t_ns, budget in force from then on): the initial budget, then each set_budget.
    budgets: List[Tuple[int, Optional[int]]]


def replay_trace(doc: Dict[str, Any]) -> TraceReplay:
    """The timeline, the counts by action, the OOMs and the time span of a trace, from
    one pass over its events."""
    replay = MemoryReplay.for_trace(doc)
    counts: Counter = Counter()
    ooms: List[Dict[str, int]] = []
    budgets: List[Tuple[int, Optional[int]]] = []
    initial_budget = replay.budget
    start = first = last = None
    times, allocated, reserved = [], [replay.allocated], [replay.reserved]
    for event in iter_events(doc):
        counts[event.action] += 1
        if start is None:
            start = first = last = event.t_ns
        elif not first <= event.t_ns <= last:  # tolerate events out of time order
            first, last = min(first, event.t_ns), max(last, event.t_ns)
        if replay.apply(event):
            times.append(event.t_ns)
            allocated.append(replay.allocated)
            reserved.append(replay.reserved)
        elif event.action == "oom":
            ooms.append({"t_ns": event.t_ns, "size": event.size, "requested": event.requested,
                         "reserved_bytes": replay.reserved, "allocated_bytes": replay.allocated,
                         "budget_bytes": replay.budget})
        elif event.action == "set_budget":
            budgets.append((event.t_ns, replay.budget))
    # The initial state holds until the first event.
    timeline = Timeline([start or 0] + times, allocated, reserved)
    budgets.insert(0, (start or 0, initial_budget))
    return TraceReplay(timeline, counts, ooms, first or 0, last or 0, budgets)


def trace_timeline(doc: Dict[str, Any]) -> Timeline:
    """Allocated and reserved bytes over a trace, replayed from its events.

    Parameters
    ----------
    doc : dict
        A loaded ``pyalloc-trace`` document.

    Returns
    -------
    Timeline
        ``(times_ns, allocated, reserved)``: equal-length lists forming a step series.
        The first point is the initial snapshot's state at the first event's time; then
        one point after each event that changed either figure. Allocated bytes follow
        docs/stats.md: a block stops counting at ``free_requested`` (it is awaiting).
    """
    return replay_trace(doc).timeline


def oom_events(doc: Dict[str, Any]) -> List[Dict[str, int]]:
    """Each OOM of a trace: ``t_ns``, the rounded ``size`` that failed, the bytes
    ``requested``, and the bytes reserved and allocated and the budget at that moment."""
    return replay_trace(doc).ooms


def analyze_trace(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Every figure ``pyalloc-stats report`` shows for a trace.

    Parameters
    ----------
    doc : dict
        A loaded ``pyalloc-trace`` document.

    Returns
    -------
    dict
        ``final``: :func:`analyze_snapshot` of the final state; ``event_counts`` by action;
        ``duration_ns``; ``peak_allocated_bytes`` and ``peak_reserved_bytes`` over the
        recording, replayed from the events; ``utilization`` (their ratio); ``ooms``;
        ``dropped_events``; ``consistent``: whether the replay lands on the final snapshot.
    """
    r = replay_trace(doc)
    final = analyze_snapshot(doc)
    peak_allocated, peak_reserved = max(r.timeline.allocated), max(r.timeline.reserved)
    end_allocated, end_reserved = r.timeline.allocated[-1], r.timeline.reserved[-1]
    return {
        "kind": "trace",
        "final": final,
        "events": len(doc["events"]),
        "event_counts": dict(sorted(r.counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "duration_ns": r.last_t_ns - r.first_t_ns,
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "utilization": _ratio_or(peak_allocated, peak_reserved, 1.0),
        "budget_bytes": budget_of(doc),
        "ooms": r.ooms,
        "dropped_events": doc.get("dropped_events", 0) or 0,
        # Without dropped events, the replay must land on the final snapshot: a mismatch
        # means the trace is inconsistent, and the peaks above cannot be trusted.
        "consistent": (end_allocated == final["totals"]["allocated_bytes"]
                       and end_reserved == final["totals"]["reserved_bytes"]),
        "replayed_final": {"allocated_bytes": end_allocated, "reserved_bytes": end_reserved},
        "has_initial": _initial_snapshot(doc) is not None,
    }


def analyze(doc: Dict[str, Any]) -> Dict[str, Any]:
    """:func:`analyze_trace` for a trace, :func:`analyze_snapshot` otherwise."""
    return analyze_trace(doc) if is_trace(doc) else analyze_snapshot(doc)


def key_figures(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The figures ``compare`` sets side by side. Peaks of a trace are over the recording;
    of a snapshot, from its stats (since the last peak reset), else its current values."""
    a = analyze(doc)
    snap = a["final"] if is_trace(doc) else a
    totals, counters = snap["totals"], snap["counters"]
    figures: Dict[str, Any] = {
        "reserved_bytes": totals["reserved_bytes"],
        "reserved_peak_bytes": a["peak_reserved_bytes"] if is_trace(doc)
        else _first_not_none(snap["peaks"]["reserved_bytes"], totals["reserved_bytes"]),
        "allocated_bytes": totals["allocated_bytes"],
        "allocated_peak_bytes": a["peak_allocated_bytes"] if is_trace(doc)
        else _first_not_none(snap["peaks"]["allocated_bytes"], totals["allocated_bytes"]),
        "utilization": a["utilization"],
        "external_fragmentation": snap["external_fragmentation"],
        "largest_free_block": snap["largest_free_block"],
        "segments": totals["segments"],
        "num_alloc_retries": counters.get("num_alloc_retries"),
        "num_ooms": counters.get("num_ooms"),
    }
    if is_trace(doc):
        figures["events"] = a["events"]
        figures["duration_ns"] = a["duration_ns"]
        figures["dropped_events"] = a["dropped_events"]
        for action, n in a["event_counts"].items():
            figures[f"events.{action}"] = n
    return figures


def _first_not_none(*values):
    return next((v for v in values if v is not None), None)
