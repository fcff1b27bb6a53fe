"""Replaying a recorded trace through a fresh engine: on the simulated device (the
default), or on a GPU through the CUDA backend (``device="cuda"``: real mappings, no data).

The trace's allocations and frees are the *inputs*: they are replayed in order, with the
trace's sizes and streams, through an engine with any options. Segment maps and unmaps are
*outcomes* of the live run and are compared with the replay's, not replayed. With the
live run's own options the replay reproduces its layout, so its peak reserved bytes match
(tests/test_replay.py checks this); with other options it answers "what would this
workload have needed under those options".

Blocks allocated before the trace began are unknown to the replay: their frees are
skipped and counted. OOMs of the live run are replayed as attempts: if the replay can
serve one, the block is freed at once (the live program never got it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from .engine import Engine
from .errors import OutOfMemoryError
from .options import parse_conf


@dataclass
class ReplayResult:
    events: int = 0
    allocs: int = 0
    frees: int = 0
    failures: int = 0                   # allocations the replay could not serve
    covered_failures: int = 0           # ... while free memory would hold them (see below)
    live_ooms: int = 0                  # OOM events in the trace
    live_ooms_served: int = 0           # ... that the replay could serve
    skipped_frees: int = 0              # frees of blocks allocated before the trace
    peak_reserved: int = 0
    peak_allocated: int = 0
    utilization: float = 1.0
    external_fragmentation: float = 0.0  # at the end of the replay
    num_alloc_retries: int = 0
    num_device_alloc: int = 0
    num_stitches: int = 0
    options: str = ""
    live: Dict[str, Any] = field(default_factory=dict)  # the live run's final figures

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def replay_options(trace: Mapping[str, Any], overrides: Mapping[str, Any] = (),
                   device: str = "host") -> Dict[str, str]:
    """The live run's options, made to fit the replaying device, with ``overrides`` on top."""
    opts = parse_conf(trace.get("options", ""))
    if device == "cuda":
        for key in [k for k in opts if k.startswith("sim_")]:
            del opts[key]
        default_budget = "90%"
    else:
        # The simulated device must be as large as the traced one (its memory is sparse:
        # only the replay's bookkeeping is touched, never the bytes).
        opts["sim_capacity"] = str(max(int(trace.get("device_total_bytes", 0)), 1 << 30))
        default_budget = opts["sim_capacity"]
        # On a GPU, stream 0's frees are not idle at once; keep that when replaying its trace.
        opts["sim_sync_stream0"] = "false" if trace.get("backend") == "cuda" else "true"
    if "budget" not in opts or not opts["budget"].isdigit():
        opts["budget"] = str(int(trace.get("budget_bytes", 0)) or default_budget)
    opts.pop("trace_capacity", None)
    opts.pop("check_invariants", None)
    opts.update({k: str(v) for k, v in dict(overrides).items()})
    return opts


CHUNK = 2 << 20   # the device's mapping granularity (both backends)


def free_chunk_bytes(engine: Engine) -> int:
    """Free memory a request could be given if placement were no object: the whole 2 MiB
    chunks inside free cached blocks, plus the budget not reserved yet, in whole chunks.
    A request no larger than this that fails, fails from fragmentation alone (what VMM
    stitching serves; docs/design.md, "Defragmentation")."""
    snap = engine.snapshot()
    total = 0
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            if block["state"] == "inactive":
                first = -(-block["address"] // CHUNK) * CHUNK
                last = (block["address"] + block["size"]) // CHUNK * CHUNK
                total += max(0, last - first)
    stats = engine.stats()
    room = stats["budget_bytes"] - stats["reserved_bytes.all.current"]
    return total + max(0, room) // CHUNK * CHUNK


def replay(trace: Mapping[str, Any], overrides: Mapping[str, Any] = (),
           check_every: int = 0, device: str = "host") -> ReplayResult:
    """Replays ``trace`` (a loaded pyalloc trace) and returns the replay's figures.

    ``check_every``: run ``check_invariants()`` every N events (0: only at the end).
    ``device``: ``"host"`` (the simulated device) or ``"cuda"``.
    """
    if device not in ("host", "cuda"):
        raise ValueError(f"replay device must be 'host' or 'cuda', not {device!r}")
    opts = replay_options(trace, overrides, device)
    result = ReplayResult(live=dict(trace.get("final", {}).get("stats", {})))
    columns: List[str] = list(trace["columns"])
    col = {name: columns.index(name) for name in ("action", "address", "size", "requested", "stream")}
    budget = opts.pop("budget")
    with Engine(device, budget=int(budget) if budget.isdigit() else budget, **opts) as engine:
        result.options = engine.options_string
        streams: Dict[int, int] = {0: 0}
        live: Dict[int, int] = {}  # trace address -> replay address

        def stream_of(traced: int) -> int:
            if traced not in streams:
                streams[traced] = engine.create_stream()
            return streams[traced]

        try:
            for i, event in enumerate(trace["events"]):
                result.events += 1
                action = event[col["action"]]
                if action == "alloc" or action == "oom":
                    if action == "oom":
                        result.live_ooms += 1
                    try:
                        ptr = engine.alloc(event[col["requested"]], stream_of(event[col["stream"]]))
                    except OutOfMemoryError:
                        result.failures += 1
                        if free_chunk_bytes(engine) >= event[col["requested"]]:
                            result.covered_failures += 1
                        continue
                    if action == "oom":
                        result.live_ooms_served += 1
                        engine.free(ptr)
                    else:
                        result.allocs += 1
                        live[event[col["address"]]] = ptr
                elif action == "empty_cache":
                    engine.empty_cache()
                elif action == "lifetime":
                    engine.set_long_lived(bool(event[col["size"]]))
                elif action == "set_budget" and "budget" not in overrides:
                    engine.set_budget(event[col["size"]])
                elif action in ("free", "free_requested"):
                    # free_requested marks a free that waited for record_stream events; the
                    # replay has no kernels in flight, so the block is free at once and the
                    # "free" that completes it later finds nothing left to do.
                    ptr = live.pop(event[col["address"]], None)
                    if ptr is None:
                        if action == "free":
                            result.skipped_frees += 1
                        continue
                    engine.free(ptr)
                    result.frees += 1
                if check_every and i % check_every == 0:
                    engine.check_invariants()
            engine.check_invariants()
            stats = engine.stats()
        finally:
            for ptr in live.values():
                engine.free(ptr)
            for s in streams.values():
                if s:
                    engine.destroy_stream(s)
    result.peak_reserved = stats["reserved_bytes.all.peak"]
    result.peak_allocated = stats["allocated_bytes.all.peak"]
    result.utilization = stats["utilization"]
    result.external_fragmentation = stats["external_fragmentation"]
    result.num_alloc_retries = stats["num_alloc_retries"]
    result.num_device_alloc = stats["num_device_alloc"]
    result.num_stitches = stats["num_stitches"]
    return result
