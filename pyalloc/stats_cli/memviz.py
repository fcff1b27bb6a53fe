"""``pyalloc-stats export-memviz FILE -o OUT.pickle``: a file pytorch.org/memory_viz opens.

The viewer reads PyTorch's snapshot pickle (``torch.cuda.memory._snapshot()``)::

    {"segments": [Segment], "device_traces": [[TraceEntry] per device]}

Note [memory_viz compatibility]
-------------------------------
What the viewer (torch/utils/viz/MemoryViz.js) relies on, and how we meet it:

* Block addresses are implicit: it places each block at the segment address plus the sizes
  before it, so blocks must tile their segment in address order (they do in our format).
* A block waiting on other streams must have state ``active_pending_free``: that is what
  PyTorch's allocator writes and the viewer tests for, although the ``_snapshot`` docstring
  says ``active_awaiting_free``. With the docstring's name the viewer drops the block and
  then fails replaying its ``free_requested``.
* Segments: our ``segment_map``/``segment_unmap`` become ``segment_alloc``/``segment_free``.
  A pyalloc segment is created and released whole, like a cudaMalloc; the viewer's
  "Active Cached Memory Timeline" only follows segment_alloc/segment_free, while
  segment_map/unmap would make it merge neighbouring segments as expandable ranges. That
  is what an expandable segment's growth and trimming are (option ``expandable``), so our
  ``segment_grow``/``segment_shrink`` become the viewer's ``segment_map``/``segment_unmap``,
  as PyTorch writes them for its own expandable segments.
* Frees: the viewer pairs ``free_requested`` with a later ``free_completed`` at the same
  address. Our ``free`` is both when no ``free_requested`` came first; after one (a free
  that waited for ``record_stream`` events) it is the ``free_completed``.
* ``oom`` carries ``device_free``: here the headroom under the budget in force (or the
  device, if smaller) at that moment, since the budget is what the allocation ran into.
* Actions the viewer does not know (evict, swap_out, ...) are kept under their own names:
  it lists them and otherwise ignores them.
* The viewer's unpickler reads protocols 2-4 and only plain types, so we write protocol 4
  with dict/list/str/int/bool only.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import pickle
import sys
from typing import Any, Dict, Iterator, List, Optional

from .analysis import (ALLOCATED, AWAITING, FREE, MemoryReplay, is_trace,
                       iter_events, snapshot_of)
from .common import check_output_path, load_document, write_output

SUFFIXES = (".pickle", ".pkl")
STATE_NAMES = {ALLOCATED: "active_allocated", AWAITING: "active_pending_free", FREE: "inactive"}
PICKLE_PROTOCOL = 4  # the viewer's JS unpickler reads protocols 2-4 only


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "export-memviz", help="export to PyTorch's snapshot pickle for pytorch.org/memory_viz",
        description="Write a snapshot or trace as the pickle that torch.cuda.memory."
                    "_dump_snapshot() writes, to open at https://pytorch.org/memory_viz (or "
                    "with torch.cuda._memory_viz). A trace gives the final segments and every "
                    "event; a snapshot gives the segments only.")
    p.add_argument("file", metavar="FILE", help="a pyalloc snapshot or trace")
    p.add_argument("-o", "--output", required=True, metavar="OUT.pickle",
                   help="output file (.pickle or .pkl)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = check_output_path(args.output, SUFFIXES)
    doc = load_document(args.file)
    if is_trace(doc) and doc.get("dropped_events"):
        print(f"pyalloc-stats: warning: {args.file}: {doc['dropped_events']} events were "
              "dropped; the viewer's replay may show blocks out of place", file=sys.stderr)
    data = to_memviz(doc)
    write_output(out, pickle.dumps(data, protocol=PICKLE_PROTOCOL))
    entries = sum(len(t) for t in data["device_traces"])
    print(f"wrote {out}: {len(data['segments'])} segments, {entries} trace entries; "
          "open it at https://pytorch.org/memory_viz")
    return 0


def to_memviz(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The memory_viz snapshot dict of a pyalloc snapshot or trace."""
    snapshot = snapshot_of(doc)
    device = snapshot.get("device", doc.get("device", 0))
    device = device if isinstance(device, int) and device >= 0 else 0
    # The viewer indexes device_traces by device, so earlier devices get empty lists.
    traces: List[List[Dict[str, Any]]] = [[] for _ in range(device + 1)]
    alloc_frames: Dict[int, List[Dict[str, Any]]] = {}
    if is_trace(doc):
        with _gc_paused():
            traces[device] = trace_entries(doc, alloc_frames)
    segments = [memviz_segment(seg, device, alloc_frames) for seg in snapshot["segments"]]
    return {"segments": segments, "device_traces": traces}


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Building a dict per event allocates millions of objects, none of them cyclic; the
    collector's passes over them (and over the loaded trace) halved the export's speed."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def memviz_segment(seg: Dict[str, Any], device: int,
                   alloc_frames: Dict[int, List[Dict[str, Any]]]) -> Dict[str, Any]:
    blocks, address = [], seg["address"]
    for block in seg["blocks"]:
        active = block["state"] != FREE
        blocks.append({
            "address": address,
            "size": block["size"],
            "requested_size": block.get("requested_size", block["size"]) if active else 0,
            "state": STATE_NAMES[block["state"]],
            "frames": alloc_frames.get(address, []) if active else [],
        })
        address += block["size"]
    allocated = [b for b in seg["blocks"] if b["state"] == ALLOCATED]
    return {
        "device": device,
        "address": seg["address"],
        "total_size": seg["total_size"],
        "stream": segment_stream(seg),
        # memory_viz knows "small" and "large"; the persistent region (INPLACE_UPDATE) is
        # shown as large, its blocks being parameters and optimizer state.
        "segment_type": "small" if seg.get("segment_type") == "small" else "large",
        "allocated_size": sum(b["size"] for b in allocated),
        "active_size": sum(b["size"] for b in seg["blocks"] if b["state"] != FREE),
        "requested_size": sum(b.get("requested_size", b["size"]) for b in allocated),
        "is_expandable": bool(seg.get("expandable", False)),
        "blocks": blocks,
    }


def segment_stream(seg: Dict[str, Any]) -> int:
    """PyTorch ties a segment to one stream; ours are tagged per block. Use the stream
    holding most of the segment's in-use bytes (0, the default stream, when none is)."""
    bytes_by_stream: Dict[int, int] = {}
    for block in seg["blocks"]:
        stream = block.get("stream", -1)
        if block["state"] != FREE and isinstance(stream, int) and stream >= 0:
            bytes_by_stream[stream] = bytes_by_stream.get(stream, 0) + block["size"]
    if not bytes_by_stream:
        return 0
    return max(bytes_by_stream, key=lambda s: (bytes_by_stream[s], -s))


def context_frames(contexts: List[Any], index: int) -> List[Dict[str, Any]]:
    """A trace context ("aten::mm @ train.py:42") as one viewer frame; [] for none."""
    if not isinstance(index, int) or not 0 < index < len(contexts):
        return []
    text = str(contexts[index])
    name, sep, where = text.rpartition(" @ ")
    if not sep:
        name, where = text, ""
    filename, _, line = where.rpartition(":")
    if not line.isdigit():
        filename, line = where, "0"
    return [{"filename": filename or "??", "line": int(line), "name": name or "??"}]


def trace_entries(doc: Dict[str, Any], alloc_frames: Dict[int, List[Dict[str, Any]]]
                  ) -> List[Dict[str, Any]]:
    """The trace's events as the viewer's TraceEntry dicts (see the Note above).

    Fills ``alloc_frames`` with the frames of each address's last allocation, so the
    blocks of the final snapshot show where they came from.
    """
    replay = MemoryReplay.for_trace(doc)
    device_total = doc.get("device_total_bytes")
    contexts = doc.get("contexts") or []
    frames_of: Dict[int, List[Dict[str, Any]]] = {}  # one list per context, shared
    out: List[Dict[str, Any]] = []
    for e in iter_events(doc):
        replay.apply(e)
        frames = frames_of.get(e.context)
        if frames is None:
            frames = frames_of[e.context] = context_frames(contexts, e.context)
        time_us = e.t_ns // 1000
        if e.action == "lifetime":
            continue   # a placement hint for the engine: nothing the viewer can show
        if e.action == "oom":
            limit = _memory_limit(replay.budget, device_total)
            free = max(0, limit - replay.reserved) if limit is not None else 0
            out.append({"action": "oom", "size": e.size, "stream": e.stream,
                        "time_us": time_us, "frames": frames, "device_free": free})
            continue
        action = _ACTIONS.get(e.action, e.action)
        if e.action == "alloc":
            alloc_frames[e.address] = frames
        elif e.action == "free" and not replay.last_free_was_awaiting:
            out.append({"action": "free_requested", "addr": e.address, "size": e.size,
                        "stream": e.stream, "time_us": time_us, "frames": frames})
        out.append({"action": action, "addr": e.address, "size": e.size, "stream": e.stream,
                    "time_us": time_us, "frames": frames})
    return out


# pyalloc action -> viewer action; the rest keep their names (see the Note above).
_ACTIONS = {"free": "free_completed", "segment_map": "segment_alloc",
            "segment_unmap": "segment_free", "segment_grow": "segment_map",
            "segment_shrink": "segment_unmap"}


def _memory_limit(budget: Any, device_total: Any) -> Optional[int]:
    """What the allocator may hold: the budget, or the device if it is smaller."""
    limits = [v for v in (budget, device_total) if isinstance(v, int) and v > 0]
    return min(limits) if limits else None
