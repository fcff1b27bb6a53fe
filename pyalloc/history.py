"""PyTorch's memory history API under pyalloc: ``record_memory_history``,
``memory_snapshot`` and ``dump_snapshot`` do what ``torch.cuda.memory._record_memory_history``,
``_snapshot`` and ``_dump_snapshot`` do under PyTorch's own allocator, and
``install(device="cuda")`` points those three at these (they raise or record nothing
under a pluggable allocator otherwise). The snapshot is the dict pytorch.org/memory_viz
opens: every segment and block now, and the allocator events since recording started.

A program written for stock PyTorch::

    torch.cuda.memory._record_memory_history(max_entries=100_000)
    train()
    torch.cuda.memory._dump_snapshot("snapshot.pickle")

runs unchanged under ``pyalloc.install()`` on a GPU; on the simulated device the same
calls are ``pyalloc.record_memory_history``, ``pyalloc.dump_snapshot``.

Events come from the engine's event ring (one per device; trace.py's ``record_trace``
uses the same ring, so the two do not run at once). Each event's ``frames`` are empty:
PyTorch's allocator records a C++ and Python stack per allocation, which pyalloc does not
(``pyalloc.record_trace(stacks=True)`` tags each event with its op and source line, at a
few microseconds per op).
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
from typing import Any, Dict, List, Optional, Union

from . import state
from .stats_cli.memviz import PICKLE_PROTOCOL, to_memviz
from .trace import _state, claim_ring, release_ring, trace_document

# The ring holds the most recent events, 48 bytes each: PyTorch's default of "all" would be
# unbounded, so history keeps at most this many unless max_entries asks for fewer.
MAX_ENTRIES = 1 << 20

_lock = threading.Lock()
# device -> (engine, the state when recording started, events drained so far)
_recording: Dict[int, Dict[str, Any]] = {}


def _device_index(device: Any) -> int:
    if device is None:
        if state.installed_device() == "cuda":
            import torch

            return torch.cuda.current_device()
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    import torch

    return torch.device(device).index or 0


def record_memory_history(enabled: Union[str, bool, None] = "all",
                          context: Optional[str] = "all", stacks: str = "all",
                          max_entries: int = sys.maxsize, device: Any = None,
                          clear_history: bool = False, **_ignored: Any) -> None:
    """Starts (``enabled="all"`` or ``"state"``) or stops (``enabled=None``) recording the
    allocator's events of ``device``, as ``torch.cuda.memory._record_memory_history``.

    ``context`` and ``stacks`` are accepted for compatibility; events carry no stacks (see
    the module's doc). ``max_entries``: the most recent events kept (at most
    ``MAX_ENTRIES``). Starting again restarts the history (``clear_history`` is implied);
    PyTorch's older ``enabled=True``/``False`` mean ``"all"``/``None``."""
    if isinstance(enabled, bool):
        enabled = "all" if enabled else None
    if enabled not in (None, "all", "state"):
        raise ValueError(f"record_memory_history: enabled must be None, 'state' or 'all', got "
                         f"{enabled!r}")
    if not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"record_memory_history: max_entries must be a positive int, got "
                         f"{max_entries!r}")
    index = _device_index(device)
    eng = state.engine(index)
    with _lock:
        current = _recording.pop(index, None)
        if current is not None:
            if current["events"]:
                eng.trace_stop()
            release_ring(eng, "record_memory_history")
        if enabled is None:
            return
        claim_ring(eng, "record_memory_history")
        _recording[index] = {"engine": eng, "initial": _state(eng), "events": enabled == "all",
                             "max_entries": min(max_entries, MAX_ENTRIES),
                             "recorded": {"dropped_events": 0, "events": []}}
        if enabled == "all":  # "state" keeps the segments only, as PyTorch's does: no events
            eng.trace_start(min(max_entries, MAX_ENTRIES))


def memory_snapshot(device: Any = None) -> Dict[str, Any]:
    """The memory_viz snapshot of ``device``'s engine: ``{"segments": [...],
    "device_traces": [[...], ...]}``, as ``torch.cuda.memory._snapshot()`` returns;
    recording, if on, goes on."""
    index = _device_index(device)
    with _lock:
        rec = _recording.get(index)
        eng = rec["engine"] if rec is not None else state.engine(index)
        if rec is None:
            recorded: Dict[str, Any] = {"dropped_events": 0, "events": []}
            initial = _state(eng)
        else:
            if rec["events"]:
                drained = eng.trace_drain()
                kept: List[Any] = rec["recorded"]["events"] + drained["events"]
                cut = max(0, len(kept) - rec["max_entries"])
                rec["recorded"] = {"dropped_events": rec["recorded"]["dropped_events"] +
                                   drained["dropped_events"] + cut, "events": kept[cut:]}
            recorded, initial = rec["recorded"], rec["initial"]
        doc = trace_document(eng, initial, recorded, [""])
    return to_memviz(doc)


def dump_snapshot(filename: Union[str, "os.PathLike[str]"] = "dump_snapshot.pickle",
                  device: Any = None) -> None:
    """Writes :func:`memory_snapshot` as the pickle ``torch.cuda.memory._dump_snapshot``
    writes (protocol 4, which pytorch.org/memory_viz reads)."""
    with open(filename, "wb") as f:
        pickle.dump(memory_snapshot(device), f, protocol=PICKLE_PROTOCOL)


def is_recording(device: Any = None) -> bool:
    return _device_index(device) in _recording
