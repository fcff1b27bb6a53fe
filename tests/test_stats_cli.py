"""Tests of ``pyalloc-stats`` (pyalloc/stats_cli/).

* The figures: layouts built by hand where utilization, fragmentation, stranded bytes and
  the histogram are known exactly; and real engine snapshots, whose figures must equal the
  engine's own stats (docs/stats.md).
* Traces: recorded from a real Engine with ``pyalloc.record_trace``, whose replay must
  land on the final snapshot and on the engine's own peaks; hand-written traces pin down
  the replay rules (free_requested, initial state, set_budget, column order).
* Every subcommand end to end through ``main()``, every user error as one line + exit 2,
  and the memory_viz export read back by PyTorch's own ``torch.cuda._memory_viz``.
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from conftest import run_program
from pyalloc import Engine, OutOfMemoryError, files, record_trace
from pyalloc.stats_cli import (analyze_snapshot, analyze_trace, block_histogram, key_figures,
                               main, trace_timeline)
from pyalloc.stats_cli.analysis import replay_trace
from pyalloc.stats_cli.memviz import to_memviz
from pyalloc.stats_cli.render import Section, print_sections
from pyalloc.stats_cli.watch import sparkline, stats_path_for_pid

KiB, MiB = 1 << 10, 1 << 20
COLUMNS = ["t_ns", "action", "address", "size", "requested", "stream", "context"]


# --- building input files -------------------------------------------------------------

def snapshot_doc(engine: Engine) -> Dict[str, Any]:
    """The snapshot document ``pyalloc.save_snapshot`` writes (docs/formats.md)."""
    return {"format": "pyalloc-snapshot", "version": 1, "time": files.now_iso(),
            **engine.snapshot(), "stats": engine.stats()}


def block(state: str, size: int, requested: int = 0, stream: int = 0) -> Dict[str, Any]:
    return {"size": size, "requested_size": requested, "state": state,
            "stream": stream if state != "inactive" else -1}


def segment(address: int, blocks: List[Dict[str, Any]], kind: str = "large") -> Dict[str, Any]:
    """A segment whose blocks get their addresses by tiling it from ``address``."""
    offset = address
    for b in blocks:
        b["address"] = offset
        offset += b["size"]
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"address": address, "total_size": offset - address, "segment_type": kind,
            "allocated_size": allocated, "active_size": active, "blocks": blocks}


def hand_snapshot(segments: List[Dict[str, Any]], stats: Optional[dict] = None) -> Dict[str, Any]:
    doc = {"format": "pyalloc-snapshot", "version": 1, "time": "2026-01-01T00:00:00+00:00",
           "device": 0, "backend": "host (simulated device)", "budget_bytes": 64 * MiB,
           "segments": segments}
    if stats is not None:
        doc["stats"] = stats
    return doc


def hand_trace(events: List[list], initial: Optional[dict] = None, final: Optional[dict] = None,
               **extra: Any) -> Dict[str, Any]:
    empty = {"snapshot": {"segments": []}, "stats": {}}
    return {"format": "pyalloc-trace", "version": 1, "time": "2026-01-01T00:00:00+00:00",
            "device": 0, "backend": "host (simulated device)", "options": "budget:64MiB",
            "budget_bytes": 64 * MiB, "device_total_bytes": 256 * MiB, "dropped_events": 0,
            "columns": COLUMNS, "events": events, "contexts": [""],
            "initial": initial or empty, "final": final or empty, **extra}


@pytest.fixture
def engine(make_engine):
    return make_engine(budget="64MiB", sim_capacity="256MiB")


def record(engine: Engine, path: Path, workload) -> tuple:
    """Runs ``workload(engine)`` under ``pyalloc.record_trace``; returns the loaded trace
    and what the workload returned."""
    with record_trace(path, engine=engine):
        result = workload(engine)
    return files.load(path), result


def alloc_or_oom(engine: Engine, size: int) -> Optional[int]:
    try:
        return engine.alloc(size)
    except OutOfMemoryError:
        return None


def fragmenting_workload(engine: Engine) -> List[int]:
    """Fills segments with blocks of mixed sizes and frees every other one, needs the
    release rung once (a retry that unmaps an emptied small segment), lowers and restores
    the budget, calls empty_cache, and asks for more than the budget once (an oom event).
    Returns the pointers still allocated."""
    sizes = [4 * MiB] * 6 + [300 * KiB] * 8 + [2 * MiB] * 3
    live = [(engine.alloc(size), size) for size in sizes]
    for ptr, _ in live[::2]:
        engine.free(ptr)
    live = live[1::2]
    engine.free(engine.alloc(12 * MiB))  # fits a 20 MiB segment's freed tail
    for ptr, size in live:
        if size < MiB:
            engine.free(ptr)  # the small segments are now cached and empty
    retries = engine.stats()["num_alloc_retries"]
    big = engine.alloc(22 * MiB)  # 44 + 22 MiB > budget: fits once an empty small one goes
    assert engine.stats()["num_alloc_retries"] == retries + 1
    engine.free(big)
    engine.set_budget(48 * MiB)
    engine.set_budget(64 * MiB)
    engine.empty_cache()
    assert alloc_or_oom(engine, 200 * MiB) is None  # over the 64 MiB budget: an oom event
    return [ptr for ptr, size in live if size >= MiB]


@pytest.fixture
def recorded_trace(engine, tmp_path) -> Dict[str, Any]:
    warmup = engine.alloc(4 * KiB)  # allocated before recording: in the initial snapshot
    engine.reset_peak_stats()  # so the engine's peaks cover the recording only

    def workload(e: Engine) -> List[int]:
        live = fragmenting_workload(e)
        e.free(warmup)
        return live

    doc, live = record(engine, tmp_path / "recorded.json.gz", workload)
    for ptr in live:
        engine.free(ptr)
    # Engine calls run outside any PyTorch op, so stacks=True would tag nothing: tag the
    # allocations as record_trace(stacks=True) does under torch.
    doc["contexts"] = ["", "aten::empty @ train.py:7"]
    for event in doc["events"]:
        if event[1] == "alloc":
            event[6] = 1
    return doc


def write(tmp_path: Path, name: str, doc: Dict[str, Any]) -> str:
    return str(files.save(tmp_path / name, doc))


def run_cli(capsys, *argv: str):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the figures, on layouts made on purpose -------------------------------------------

def two_segment_layout() -> Dict[str, Any]:
    return hand_snapshot([
        segment(0x10000000, [block("active_allocated", 256 * KiB, 250_000),
                             block("inactive", 128 * KiB),
                             block("active_awaiting_free", 128 * KiB, 100_000),
                             block("inactive", 512 * KiB)]),
        segment(0x20000000, [block("inactive", 2 * MiB)], kind="small"),
    ])


def test_totals_fragmentation_and_stranded_bytes_of_a_known_layout():
    a = analyze_snapshot(two_segment_layout())
    t = a["totals"]
    assert t["reserved_bytes"] == 3 * MiB
    assert t["allocated_bytes"] == 256 * KiB
    assert t["active_bytes"] == 384 * KiB and t["awaiting_bytes"] == 128 * KiB
    assert t["requested_bytes"] == 250_000  # of allocated blocks only, as in docs/stats.md
    assert t["cached_free_bytes"] == 3 * MiB - 384 * KiB
    assert a["largest_free_block"] == 2 * MiB
    assert a["external_fragmentation"] == pytest.approx(1 - (2 * MiB) / (3 * MiB - 384 * KiB))
    # No stats in the file: utilization is the current ratio, and says so.
    assert a["utilization"] == pytest.approx((256 * KiB) / (3 * MiB))
    assert "current" in a["utilization_source"]
    first, second = a["segments"]
    assert first["allocated_fraction"] == pytest.approx(0.25)
    assert first["largest_free_block"] == 512 * KiB
    assert first["stranded_free_bytes"] == 128 * KiB  # the hole outside the largest one
    assert second["stranded_free_bytes"] == 0  # one free block strands nothing
    assert [s["address"] for s in a["most_fragmented"]] == [0x10000000]


def test_histogram_buckets_are_powers_of_two_split_by_state():
    rows = {r["bucket_bytes"]: r for r in block_histogram(two_segment_layout()["segments"])}
    assert sorted(rows) == [128 * KiB, 256 * KiB, 512 * KiB, 2 * MiB]
    assert rows[128 * KiB]["free_count"] == 1 and rows[128 * KiB]["awaiting_count"] == 1
    assert rows[256 * KiB]["allocated_bytes"] == 256 * KiB
    # 384 KiB falls in [256 KiB, 512 KiB), not in a bucket of its own.
    odd = block_histogram([segment(0, [block("inactive", 384 * KiB)])])
    assert odd == [{"bucket_bytes": 256 * KiB, "allocated_count": 0, "allocated_bytes": 0,
                    "awaiting_count": 0, "awaiting_bytes": 0, "free_count": 1,
                    "free_bytes": 384 * KiB}]


def test_no_cached_memory_means_no_fragmentation_and_full_utilization():
    a = analyze_snapshot(hand_snapshot([]))
    assert a["external_fragmentation"] == 0.0 and a["utilization"] == 1.0
    assert a["most_fragmented"] == [] and a["histogram"] == []


def test_every_other_block_freed_reads_what_the_engine_says(engine):
    ptrs = [engine.alloc(2 * MiB) for _ in range(8)]  # 16 MiB of one 20 MiB segment
    for p in ptrs[::2]:
        engine.free(p)
    doc = snapshot_doc(engine)
    a, stats = analyze_snapshot(doc), doc["stats"]
    assert a["totals"]["cached_free_bytes"] == stats["cached_free_bytes"]
    assert a["largest_free_block"] == stats["largest_free_block"]
    assert a["external_fragmentation"] == pytest.approx(stats["external_fragmentation"])
    assert a["utilization"] == pytest.approx(stats["utilization"])
    assert a["utilization_source"] == "stats peaks"
    assert a["totals"]["allocated_bytes"] == stats["allocated_bytes.all.current"]
    assert a["totals"]["requested_bytes"] == stats["requested_bytes.all.current"]
    (seg,) = a["segments"]
    # Four 2 MiB holes and the 4 MiB uncut tail: all but the tail are stranded.
    assert seg["free_blocks"] == 5 and seg["largest_free_block"] == 4 * MiB
    assert seg["stranded_free_bytes"] == 8 * MiB
    assert a["external_fragmentation"] == pytest.approx(1 - 4 / 12)
    assert a["counters"]["num_device_alloc"] == 1
    for p in ptrs[1::2]:
        engine.free(p)


def test_policy_counters_are_shown_when_present():
    doc = hand_snapshot([], stats={"num_ooms": 2, "num_evictions": 7, "num_swap_out": 1,
                                   "num_stitch_merges": 3, "num_unrelated": 9})
    counters = analyze_snapshot(doc)["counters"]
    assert counters == {"num_ooms": 2, "num_evictions": 7, "num_stitch_merges": 3,
                        "num_swap_out": 1}


# --- traces --------------------------------------------------------------------------

def test_timeline_replays_allocated_and_reserved_from_the_initial_state():
    initial_seg = segment(0x1000000, [block("active_allocated", 1 * MiB, MiB),
                                      block("inactive", 1 * MiB)], kind="small")
    initial = {"snapshot": {"segments": [initial_seg]}, "stats": {}}
    events = [
        [100, "segment_map", 0x9000000, 20 * MiB, 0, 0, 0],
        [200, "alloc", 0x9000000, 8 * MiB, 8 * MiB, 0, 0],
        [300, "alloc", 0x9800000, 4 * MiB, 4 * MiB, 0, 0],
        [400, "free_requested", 0x9000000, 8 * MiB, 0, 0, 0],  # awaiting: not allocated
        [450, "set_budget", 0, 32 * MiB, 0, 0, 0],
        [500, "oom", 0, 64 * MiB, 60 * MiB, 0, 0],
        [600, "free", 0x9000000, 8 * MiB, 8 * MiB, 0, 0],  # completes: no change again
        [700, "free", 0x1000000, 1 * MiB, MiB, 0, 0],  # allocated before recording began
        [800, "evict", 0x9800000, 4 * MiB, 4 * MiB, 0, 0],  # unknown to the replay: ignored
    ]
    doc = hand_trace(events, initial=initial)
    timeline = trace_timeline(doc)
    assert timeline.times_ns == [100, 100, 200, 300, 400, 700]
    assert timeline.allocated == [1 * MiB, 1 * MiB, 9 * MiB, 13 * MiB, 5 * MiB, 4 * MiB]
    assert timeline.reserved == [2 * MiB, 22 * MiB, 22 * MiB, 22 * MiB, 22 * MiB, 22 * MiB]
    a = analyze_trace(doc)
    assert a["peak_allocated_bytes"] == 13 * MiB and a["peak_reserved_bytes"] == 22 * MiB
    assert a["event_counts"] == {"alloc": 2, "free": 2, "evict": 1, "free_requested": 1,
                                 "oom": 1, "segment_map": 1, "set_budget": 1}
    assert a["duration_ns"] == 700
    assert a["ooms"] == [{"t_ns": 500, "size": 64 * MiB, "requested": 60 * MiB,
                          "reserved_bytes": 22 * MiB, "allocated_bytes": 5 * MiB,
                          "budget_bytes": 32 * MiB}]
    assert replay_trace(doc).budgets == [(100, 64 * MiB), (450, 32 * MiB)]
    assert not a["consistent"]  # the hand-made final state is empty: the replay says so


def test_events_are_read_through_their_columns():
    columns = ["action", "size", "t_ns", "address", "extra"]  # reordered, one unknown, some absent
    doc = hand_trace([["segment_map", 2 * MiB, 5, 0x100, "x"], ["alloc", 512, 9, 0x100, "y"]])
    doc["columns"] = columns
    timeline = trace_timeline(doc)
    assert timeline.allocated[-1] == 512 and timeline.reserved[-1] == 2 * MiB


def test_recorded_trace_replays_to_the_engines_own_peaks(recorded_trace):
    a = analyze_trace(recorded_trace)
    final_stats = recorded_trace["final"]["stats"]
    assert a["consistent"], a["replayed_final"]
    # Peaks were reset when recording began, so the engine's peaks cover the same window.
    assert a["peak_allocated_bytes"] == final_stats["allocated_bytes.all.peak"]
    assert a["peak_reserved_bytes"] == final_stats["reserved_bytes.all.peak"]
    assert a["event_counts"]["oom"] == 1 and len(a["ooms"]) == 1
    assert a["event_counts"]["set_budget"] == 2 and a["event_counts"]["empty_cache"] == 1
    assert a["event_counts"]["segment_unmap"] >= 1  # the release rung returned a segment
    figures = key_figures(recorded_trace)
    assert figures["events.alloc"] == a["event_counts"]["alloc"]
    assert figures["utilization"] == pytest.approx(
        a["peak_allocated_bytes"] / a["peak_reserved_bytes"])


def test_a_free_that_waits_for_another_stream_is_awaiting_until_it_completes(engine,
                                                                             tmp_path):
    side = engine.create_stream()
    engine.set_stream_delay(side, 50_000)  # 50 ms: the free must wait for it

    def free_on_a_busy_stream(e: Engine) -> int:
        ptr = e.alloc(3 * MiB)
        e.fill_async(side, ptr, 3 * MiB, 7)
        e.record_stream(ptr, side)
        e.free(ptr)
        return e.alloc(1 * MiB)

    pending, keep = record(engine, tmp_path / "pending.json", free_on_a_busy_stream)
    assert [e[1] for e in pending["events"]].count("free_requested") == 1
    a = analyze_trace(pending)
    assert a["consistent"]  # awaiting bytes stop counting as allocated at free_requested
    assert a["final"]["totals"]["awaiting_bytes"] == 3 * MiB
    data = to_memviz(pending)
    viewer_replay(data)
    assert "active_pending_free" in [b["state"] for seg in data["segments"]
                                     for b in seg["blocks"]]

    def complete(e: Engine) -> None:
        e.synchronize()
        e.empty_cache()  # completes the waiting free, then returns the empty segment

    done, _ = record(engine, tmp_path / "done.json", complete)
    actions = [e[1] for e in done["events"]]
    assert "free" in actions and "segment_unmap" in actions
    assert analyze_trace(done)["consistent"]
    viewer_replay(to_memviz(done))
    engine.free(keep)
    engine.destroy_stream(side)


# --- report --------------------------------------------------------------------------

def test_report_of_a_snapshot_shows_every_section(tmp_path, capsys, engine):
    ptrs = [engine.alloc(s) for s in (3 * MiB, 700 * KiB, 700 * KiB, 5 * MiB, 1000)]
    engine.free(ptrs[1])  # a 700 KiB hole in the small segment, before its other blocks
    doc = snapshot_doc(engine)
    small = next(s for s in doc["segments"] if s["segment_type"] == "small")
    path = write(tmp_path, "snap.json", doc)
    code, out, err = run_cli(capsys, "report", path)
    assert code == 0 and err == ""
    for title in ("snapshot (device 0", "Segments (2, by address)", "Block sizes",
                  "Most fragmented segments", "Reclaim counters"):
        assert title in out
    for counter in ("num_alloc_retries", "num_ooms", "num_stream_fences", "num_device_alloc",
                    "num_device_free", "num_sync_all_streams", "num_invalid_frees"):
        assert counter in out
    assert "[512 KiB, 1 MiB)" in out  # the hole's bucket
    ranking = out.split("Most fragmented segments")[1].split("Reclaim counters")[0]
    assert f"0x{small['address']:x}" in ranking
    for p in ptrs[2:] + ptrs[:1]:
        engine.free(p)


def test_report_names_the_segments_of_long_lived_blocks(tmp_path, capsys, engine):
    engine.set_long_lived(True)
    state = engine.alloc(256 * KiB)    # a small segment of its own, long-lived
    engine.set_long_lived(False)
    activation = engine.alloc(100 * KiB)
    path = write(tmp_path, "snap.json", snapshot_doc(engine))
    code, out, _ = run_cli(capsys, "report", path)
    segments = out.split("Segments (1, by address)")[1].split("Block sizes")[0]
    assert code == 0 and "small (long-lived)" in segments
    engine.free(state)
    engine.free(activation)


def test_report_names_an_expandable_segment_and_counts_its_growth(tmp_path, capsys):
    from pyalloc import Engine

    with Engine("host", budget="64MiB", expandable=True) as engine:
        ptrs = [engine.alloc(3 * MiB) for _ in range(3)]
        path = write(tmp_path, "snap.json", snapshot_doc(engine))
        for p in ptrs:
            engine.free(p)
    code, out, _ = run_cli(capsys, "report", path)
    segments = out.split("Segments (1, by address)")[1].split("Block sizes")[0]
    assert code == 0 and "large (expandable)" in segments and "10.00 MiB" in segments, segments
    assert "num_segment_grows" in out


def test_whole_chunks_count_free_and_evictable_blocks_only_where_nothing_stays():
    from pyalloc.stats_cli.analysis import (MalformedDocument, clearable_chunk_bytes,
                                            validate_snapshot)

    evictable = block("active_allocated", 2 * MiB, 2 * MiB)
    evictable["evictable"] = True
    # Chunks of 2 MiB: [free 1 + evictable 1] [evictable 1 + live 1] [free 2] [free 2].
    seg = segment(64 * MiB, [block("inactive", MiB), evictable,
                             block("active_allocated", MiB, MiB), block("inactive", 4 * MiB)])
    snap = hand_snapshot([seg])
    assert clearable_chunk_bytes(snap, evicting=True) == 6 * MiB
    assert clearable_chunk_bytes(snap, evicting=False) == 4 * MiB   # nothing may be evicted
    # Unaligned segments count only the chunks wholly inside them.
    assert clearable_chunk_bytes(hand_snapshot([segment(65 * MiB, [block("inactive", 4 * MiB)])])) \
        == 2 * MiB
    # The chunk is the granularity the file records (older files: 2 MiB): at 4 MiB only the
    # last chunk, [free 2 + free 2], is clear.
    assert analyze_snapshot(snap)["chunk_bytes"] == 2 * MiB
    snap["granularity_bytes"] = 4 * MiB
    snap["oom"] = {"size": 8 * MiB, "rounded": 8 * MiB}
    assert analyze_snapshot(snap)["chunk_bytes"] == 4 * MiB
    assert analyze_snapshot(snap)["clearable_chunk_bytes"] == 4 * MiB
    snap["granularity_bytes"] = "2MiB"
    with pytest.raises(MalformedDocument, match="granularity_bytes.*positive integer"):
        validate_snapshot(snap)


def test_a_snapshot_at_an_oom_keeps_the_layout_that_failed(tmp_path, capsys, make_engine):
    import pyalloc
    from pyalloc.errors import PyallocError

    engine = make_engine(budget="8MiB", stitch="false")
    assert engine.last_oom_snapshot() is None
    with pytest.raises(PyallocError, match="has not run out of memory yet.*after catching"):
        pyalloc.save_snapshot(tmp_path / "none.json", engine=engine, at_oom=True)
    # One 8 MiB segment, cut into four 2 MiB blocks; the first and third freed: 4 MiB free,
    # no 4 MiB of it contiguous, and (stitching off) no way to join it.
    engine.free(engine.alloc(8 * MiB))
    ptrs = [engine.alloc(2 * MiB) for _ in range(4)]
    engine.set_evictable(ptrs[3], 7)
    engine.free(ptrs[0])
    engine.free(ptrs[2])
    with pytest.raises(OutOfMemoryError) as raised:
        engine.alloc(4 * MiB)
    engine.free(ptrs[1])   # the layout changes after the error, as a failed op's unwinding does
    oom = engine.last_oom_snapshot()
    assert oom["oom"]["size"] == oom["oom"]["rounded"] == 4 * MiB
    assert oom["granularity_bytes"] == 2 * MiB   # the simulated device maps 2 MiB chunks
    assert oom["oom"]["report"] == str(raised.value)
    (seg,) = oom["segments"]
    assert [(b["size"], b["state"], b["evictable"]) for b in seg["blocks"]] == [
        (2 * MiB, "inactive", False), (2 * MiB, "active_allocated", False),
        (2 * MiB, "inactive", False), (2 * MiB, "active_allocated", True)]
    assert [b["state"] for b in engine.snapshot()["segments"][0]["blocks"]] == [
        "inactive", "active_allocated"]   # now: the freed block merged with its neighbours
    path = pyalloc.save_snapshot(tmp_path / "oom.json", engine=engine, at_oom=True)
    code, out, err = run_cli(capsys, "report", path)
    assert code == 0 and err == ""
    section = out.split("Out of memory when this snapshot was taken")[1]
    # No registry on this engine: its one evictable block could not have been freed. The
    # two free blocks are whole chunks, which stitching (off here) would have joined.
    assert oom["evicting"] is False and "free + headroom (no eviction policy)" in section
    assert oom["stitching"] is False and "stitching would have served it" in section
    assert "external fragmentation" in section   # the report's own lines, as notes
    assert "evictable" in out.split("Segments")[0]
    engine.free(ptrs[3])


def test_report_json_has_the_figures_and_top_limits_the_ranking(tmp_path, capsys):
    layout = two_segment_layout()
    layout["segments"].append(segment(0x30000000, [block("inactive", 64 * KiB),
                                                   block("active_allocated", 64 * KiB, 1),
                                                   block("inactive", 1 * MiB)]))
    path = write(tmp_path, "layout.json.gz", layout)
    code, out, _ = run_cli(capsys, "report", path, "--json", "--top", "1")
    assert code == 0
    data = json.loads(out)
    assert data["totals"]["reserved_bytes"] == 3 * MiB + 1152 * KiB
    assert [s["address"] for s in data["most_fragmented"]] == [0x10000000]  # 128 KiB > 64 KiB
    assert len(data["segments"]) == 3 and len(data["histogram"]) == 6


def test_report_of_a_trace_adds_events_and_peaks(tmp_path, capsys, recorded_trace):
    path = write(tmp_path, "trace.json.gz", recorded_trace)
    code, out, err = run_cli(capsys, "report", path)
    assert code == 0 and err == ""
    assert "final state of the trace" in out and "Events by action" in out
    assert "peak reserved" in out and "segment_map" in out and "oom" in out
    code, out, _ = run_cli(capsys, "report", path, "--json")
    data = json.loads(out)
    assert data["kind"] == "trace" and data["event_counts"]["oom"] == 1
    assert data["final"]["totals"]["reserved_bytes"] == data["replayed_final"]["reserved_bytes"]


def test_report_warns_about_dropped_events(tmp_path, capsys, recorded_trace):
    recorded_trace["dropped_events"] = 17
    path = write(tmp_path, "dropped.json", recorded_trace)
    code, out, err = run_cli(capsys, "report", path)
    assert code == 0
    assert "warning" in err and "17 events were dropped" in err
    assert "WARNING: incomplete trace" in out


def test_rich_tables_render_on_a_terminal():
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    print_sections([Section("Totals", [("reserved", "2.00 MiB")]),
                    Section("Segments", [["0x10", "large"]], ["address", "type"], "ll")],
                   stream=stream)
    text = stream.getvalue()
    assert "Totals" in text and "reserved" in text and "0x10" in text


# --- plot ----------------------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_trace_writes_a_png_and_an_html_page(tmp_path, capsys, recorded_trace):
    path = write(tmp_path, "trace.json", recorded_trace)
    png, page = tmp_path / "trace.png", tmp_path / "trace.html"
    assert run_cli(capsys, "plot", path, "-o", str(png))[0] == 0
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 10_000
    assert run_cli(capsys, "plot", path, "-o", str(page))[0] == 0
    text = page.read_text()
    encoded = text.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(encoded).startswith(PNG_MAGIC)
    assert "reserved_peak_bytes" in text and "events.oom" in text


def test_plot_caps_the_segment_map_and_says_so(tmp_path):
    from pyalloc.stats_cli.plot import build_figure

    segments = [segment(0x1000000 * (i + 1), [block("active_allocated", (i + 1) * 4 * KiB, 1),
                                              block("inactive", 2 * MiB)], kind="small")
                for i in range(100)]
    figure = build_figure(hand_snapshot(segments))
    (ax,) = figure.axes
    assert "100 segments (showing the 64 largest)" in ax.get_title(loc="left")
    assert len(ax.get_yticks()) == 64


# --- watch ---------------------------------------------------------------------------

def publish(path: Path, stats: Dict[str, Any], pid: Optional[int] = None) -> None:
    files.save(path, {"format": "pyalloc-stats", "version": 1, "time": files.now_iso(),
                      "pid": os.getpid() if pid is None else pid, "device": 0, "stats": stats})


def test_watch_once_shows_the_published_stats(tmp_path, capsys, engine):
    ptr = engine.alloc(3 * MiB)
    stats_file = tmp_path / "stats.json"
    publish(stats_file, engine.stats())
    code, out, err = run_cli(capsys, "watch", str(stats_file), "--once")
    assert code == 0 and err == ""
    assert "allocated" in out and "3.00 MiB" in out and "OOMs" in out
    assert "not running" not in out
    engine.free(ptr)


def test_watch_shows_rematerialization_counters_when_present(tmp_path, capsys, engine):
    stats = {**engine.stats(), "remat.evictions": 7, "remat.eager_evictions": 3,
             "remat.recomputes": 9, "remat.recompute_ns": 2_500_000_000,
             "remat.evicted_bytes": 4 * MiB}
    publish(tmp_path / "stats.json", stats)
    code, out, _ = run_cli(capsys, "watch", str(tmp_path / "stats.json"), "--once")
    assert code == 0
    assert "7 / 3" in out and "9 (2.50 s)" in out and "4.00 MiB" in out
    publish(tmp_path / "plain.json", engine.stats())   # no policy: no such rows
    code, out, _ = run_cli(capsys, "watch", str(tmp_path / "plain.json"), "--once")
    assert "recomputes" not in out


def test_watch_shows_swap_counters_under_swap(tmp_path, capsys, engine):
    stats = {**engine.stats(), "remat.evictions": 7, "remat.recomputes": 0,
             "remat.swap_outs": 5, "remat.swap_out_bytes": 10 * MiB, "remat.swap_ins": 4,
             "remat.swap_in_bytes": 8 * MiB, "remat.prefetches": 3, "remat.prefetch_hits": 3,
             "remat.prefetch_ready": 2, "host_pool_used_bytes.current": 2 * MiB,
             "host_pool_bytes": 64 * MiB}
    publish(tmp_path / "stats.json", stats)
    code, out, _ = run_cli(capsys, "watch", str(tmp_path / "stats.json"), "--once")
    assert code == 0
    assert "5 (10.00 MiB) / 4 (8.00 MiB)" in out and "3 (3 / 2)" in out
    assert "2.00 MiB of 64.00 MiB" in out


def test_watch_shows_stitches(tmp_path, capsys, engine):
    publish(tmp_path / "stats.json", {**engine.stats(), "num_stitches": 3,
                                      "num_stitched_bytes": 24 * MiB})
    code, out, _ = run_cli(capsys, "watch", str(tmp_path / "stats.json"), "--once")
    assert code == 0 and "3 (24.00 MiB)" in out


def test_watch_by_pid_reads_the_temp_file_and_counts_frames(capsys):
    path = stats_path_for_pid(os.getpid())
    try:
        publish(path, {"allocated_bytes.all.current": 5 * MiB, "num_ooms": 0})
        code, out, _ = run_cli(capsys, "watch", str(os.getpid()), "--count", "3",
                               "--interval", "0.01")
        assert code == 0 and out.count("allocated over the watch") == 3
    finally:
        path.unlink(missing_ok=True)


def test_watch_says_when_the_process_is_gone(tmp_path, capsys):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(proc.stdout)
    stats_file = tmp_path / "old.json"
    publish(stats_file, {"allocated_bytes.all.current": MiB}, pid=dead_pid)
    code, out, _ = run_cli(capsys, "watch", str(stats_file), "--count", "5", "--interval", "5")
    assert code == 0  # returns at once: a dead process publishes nothing new
    assert f"process {dead_pid} is not running" in out
    assert out.count("allocated over the watch") == 1


def test_watch_without_a_published_file_says_how_to_publish(tmp_path, capsys):
    code, out, err = run_cli(capsys, "watch", str(tmp_path / "none.json"), "--once")
    assert code == 2 and out == ""
    assert err.startswith("pyalloc-stats: error:") and err.count("\n") == 1
    assert "PYALLOC_STATS_FILE" in err and "stats_file" in err


def test_watch_rejects_a_snapshot(tmp_path, capsys):
    path = write(tmp_path, "snap.json", two_segment_layout())
    code, _, err = run_cli(capsys, "watch", path, "--once")
    assert code == 2 and "pyalloc-stats report" in err


def test_sparkline_scales_from_zero():
    assert sparkline([0, 4, 8]) == "▁▅█"
    assert sparkline([5, 5]) == "██" and sparkline([0, 0]) == "▁▁"


# --- compare -------------------------------------------------------------------------

def test_compare_two_snapshots_gives_deltas(tmp_path, capsys):
    a = hand_snapshot([segment(0x1000, [block("active_allocated", 1 * MiB, MiB),
                                        block("inactive", 1 * MiB)])],
                      stats={"num_alloc_retries": 1, "num_ooms": 0})
    b = hand_snapshot([segment(0x1000, [block("active_allocated", 1 * MiB, MiB),
                                        block("inactive", 1 * MiB)]),
                       segment(0x900000, [block("active_allocated", 2 * MiB, MiB)])],
                      stats={"num_alloc_retries": 4, "num_ooms": 1})
    pa, pb = write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)
    code, out, _ = run_cli(capsys, "compare", pa, pb, "--json")
    assert code == 0
    f = json.loads(out)["figures"]
    assert f["reserved_bytes"] == {"a": 2 * MiB, "b": 4 * MiB, "delta": 2 * MiB, "relative": 1.0}
    assert f["segments"]["delta"] == 1 and f["num_alloc_retries"]["delta"] == 3
    assert f["num_ooms"]["relative"] is None  # relative to 0 is undefined
    assert f["utilization"]["b"] == pytest.approx(0.75)
    code, out, _ = run_cli(capsys, "compare", pa, pb)
    assert code == 0 and "+2.00 MiB" in out and "+100.0%" in out and "+25.0 pt" in out


def test_compare_traces_includes_event_counts(tmp_path, capsys, recorded_trace):
    quiet = hand_trace([[10, "segment_map", 0x1000, 2 * MiB, 0, 0, 0]])
    pa, pb = write(tmp_path, "a.json", quiet), write(tmp_path, "b.json", recorded_trace)
    code, out, _ = run_cli(capsys, "compare", pa, pb, "--json")
    f = json.loads(out)["figures"]
    assert f["events.segment_map"]["a"] == 1
    assert f["events.oom"] == {"a": None, "b": 1, "delta": None, "relative": None}


# --- export-memviz -------------------------------------------------------------------

def viewer_replay(data: Dict[str, Any], device: int = 0) -> None:
    """What MemoryViz.js does when it opens the file (annotate_snapshot, then
    simulate_memory from the last event back to the first); raises where the viewer
    would fail or mis-draw."""
    blocks, segments = {}, {}
    for seg in data["segments"]:
        addr = seg["address"]
        segments[seg["address"]] = seg["total_size"]
        for b in seg["blocks"]:  # implicit addresses: the blocks must tile the segment
            assert b["address"] == addr
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[addr] = b["state"] == "active_pending_free"
            addr += b["size"]
        assert addr == seg["address"] + seg["total_size"]
    for e in reversed(data["device_traces"][device]):
        action = e["action"]
        if action == "free_completed":
            blocks[e["addr"]] = True
        elif action == "free_requested":
            assert e["addr"] in blocks, f"the viewer would crash on {e}"
            blocks[e["addr"]] = False
        elif action == "alloc":
            assert blocks.pop(e["addr"], None) is False, f"alloc of an unknown block: {e}"
        elif action == "segment_alloc":
            assert segments.pop(e["addr"]) == e["size"]
        elif action == "segment_free":
            segments[e["addr"]] = e["size"]
        elif action == "segment_map":     # an expandable segment's growth, undone: its end
            start = max(a for a in segments if a <= e["addr"])   # goes (the viewer cuts it)
            assert e["addr"] + e["size"] == start + segments[start], f"not at the end: {e}"
            segments[start] -= e["size"]
            assert segments[start] > 0, f"a growth undone past the segment's start: {e}"
        elif action == "segment_unmap":   # its trimming, undone: the end comes back
            start = max(a for a in segments if a <= e["addr"])
            assert start + segments[start] == e["addr"], f"not at the end: {e}"
            segments[start] += e["size"]


def plain_types(x: Any) -> bool:
    if isinstance(x, dict):
        return all(isinstance(k, str) and plain_types(v) for k, v in x.items())
    if isinstance(x, list):
        return all(plain_types(v) for v in x)
    return x is None or isinstance(x, (str, int, float, bool))


def test_export_of_a_trace_reads_back_with_torchs_memory_viz(tmp_path, capsys, recorded_trace):
    from torch.cuda import _memory_viz as viz

    path = write(tmp_path, "trace.json", recorded_trace)
    out = tmp_path / "trace.pickle"
    code, stdout, _ = run_cli(capsys, "export-memviz", path, "-o", str(out))
    assert code == 0 and "pytorch.org/memory_viz" in stdout
    raw = out.read_bytes()
    assert raw[:2] == b"\x80\x04"  # protocol 4: the viewer's unpickler reads 2-4
    data = pickle.loads(raw)
    assert plain_types(data) and set(data) == {"segments", "device_traces"}
    viewer_replay(data)

    summary = viz.segsum(data)  # re-adds every block; raises on an accounting mismatch
    final = recorded_trace["final"]["snapshot"]["segments"]
    assert f"segments: {len(final)}" in summary
    trace_text = viz.trace(data)
    assert "raise OutOfMemoryError" in trace_text and "cudaMalloc" in trace_text
    flame = viz.segments(data, format_flamegraph=lambda lines: lines)
    addr = final[0]["address"]
    assert f"seg_{addr};active_allocated;train.py:" in flame  # frames from the alloc context
    assert "inactive" in viz.memory(data, format_flamegraph=lambda lines: lines)
    html = viz.trace_plot(data)
    assert pickle.loads(_embedded_pickle(html)) == data
    assert "Allocator State History" in viz.segment_plot(data)


def test_an_expandable_segment_exports_as_pytorch_writes_its_own(tmp_path, capsys):
    # Growth and trimming become the viewer's segment_map/segment_unmap (which it merges
    # into the segment), the segment is marked expandable, and the trace's own replay
    # reaches the engine's peaks.
    from torch.cuda import _memory_viz as viz

    with Engine("host", budget="64MiB", expandable=True) as engine:
        def grow_and_trim(e: Engine) -> int:
            keep = e.alloc(3 * MiB)
            grown = [e.alloc(5 * MiB) for _ in range(4)]
            for ptr in grown:
                e.free(ptr)
            e.empty_cache()                  # trims the free end
            return keep

        engine.reset_peak_stats()
        doc, keep = record(engine, tmp_path / "expandable.json.gz", grow_and_trim)
        engine.free(keep)
    counts = analyze_trace(doc)["event_counts"]
    assert counts["segment_grow"] == 4 and counts["segment_shrink"] == 1, counts
    a = analyze_trace(doc)
    assert a["consistent"]
    assert a["peak_reserved_bytes"] == doc["final"]["stats"]["reserved_bytes.all.peak"]
    out = tmp_path / "expandable.pickle"
    code, _, _ = run_cli(capsys, "export-memviz", write(tmp_path, "e.json", doc), "-o", str(out))
    data = pickle.loads(out.read_bytes())
    actions = [e["action"] for e in data["device_traces"][0]]
    assert actions.count("segment_map") == 4 and actions.count("segment_unmap") == 1
    assert [s["is_expandable"] for s in data["segments"]] == [True]
    viewer_replay(data)
    assert "segments: 1" in viz.segsum(data)
    viz.trace_plot(data)


def _embedded_pickle(page: str) -> bytes:
    payload = json.loads(page.split("const local_files = ")[1].split("\n")[0])
    return base64.b64decode(payload[0]["base64"])


def test_export_maps_actions_as_the_viewer_expects():
    awaiting = segment(0x5000, [block("active_awaiting_free", 512, 100, stream=7),
                                block("inactive", 1536)])
    final = {"snapshot": {"device": 1, "segments": [awaiting]}, "stats": {}}
    events = [[1000, "segment_map", 0x5000, 2048, 0, 0, 0],
              [2000, "alloc", 0x5000, 512, 100, 0, 0],
              [3000, "free", 0x5000, 512, 100, 0, 0],  # plain free: requested + completed
              [4000, "alloc", 0x5000, 512, 100, 7, 0],
              [5000, "free_requested", 0x5000, 512, 100, 7, 0],  # still awaiting at the end
              [6000, "swap_out", 0x5000, 512, 100, 7, 0],
              [7000, "oom", 0, 8 * MiB, 8 * MiB - 3, 0, 0]]
    data = to_memviz(hand_trace(events, final=final, budget_bytes=4 * MiB))
    assert data["device_traces"][0] == []  # device 1's events sit at index 1
    actions = [e["action"] for e in data["device_traces"][1]]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed", "alloc",
                       "free_requested", "swap_out", "oom"]
    oom = data["device_traces"][1][-1]
    assert oom["device_free"] == 4 * MiB - 2048 and oom["time_us"] == 7 and "addr" not in oom
    (seg,) = data["segments"]
    assert seg["device"] == 1 and seg["stream"] == 7
    assert [b["state"] for b in seg["blocks"]] == ["active_pending_free", "inactive"]
    viewer_replay(data, device=1)


def test_export_of_an_engine_snapshot(tmp_path, capsys, engine):
    from torch.cuda import _memory_viz as viz

    ptrs = [engine.alloc(s) for s in (100, 5000, 3 * MiB)]
    engine.free(ptrs[1])
    path = write(tmp_path, "snap.json", snapshot_doc(engine))
    out = tmp_path / "snap.pkl"
    assert run_cli(capsys, "export-memviz", path, "-o", str(out))[0] == 0
    data = pickle.loads(out.read_bytes())
    assert data["device_traces"] == [[]]
    assert "total_allocated: 3.0MiB" in viz.segsum(data)  # it sums requests: 100 B + 3 MiB
    for p in (ptrs[0], ptrs[2]):
        engine.free(p)


# --- user errors: one line, exit 2, no traceback -------------------------------------

def _bad_inputs(tmp_path: Path) -> Dict[str, tuple]:
    good = files.save(tmp_path / "good.json", two_segment_layout())
    text = good.read_bytes()
    (tmp_path / "truncated.json").write_bytes(text[: len(text) // 2])
    packed = gzip.compress(text)
    (tmp_path / "truncated.json.gz").write_bytes(packed[: len(packed) // 2])
    corrupt = bytearray(packed)
    corrupt[len(corrupt) // 2] ^= 0xFF
    (tmp_path / "corrupt.json.gz").write_bytes(bytes(corrupt))
    (tmp_path / "d.png").mkdir()
    (tmp_path / "foreign.json").write_text(json.dumps({"name": "not ours"}))
    (tmp_path / "torch.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    gap = two_segment_layout()
    gap["segments"][0]["blocks"].pop(1)
    files.save(tmp_path / "gap.json", gap)
    bad_event = hand_trace([[1, "alloc", 0x10, 512, 512, 0]])  # one column short
    files.save(tmp_path / "bad_event.json", bad_event)
    bad_columns = hand_trace([])
    bad_columns["columns"] = ["t_ns", "action"]
    files.save(tmp_path / "bad_columns.json", bad_columns)
    return {
        "short event": (["report", str(tmp_path / "bad_event.json")], "event 0 is not 7 values"),
        "columns lack size": (["report", str(tmp_path / "bad_columns.json")],
                              "lacks address, size"),
        "missing": (["report", str(tmp_path / "nope.json")], "no such file"),
        "truncated JSON": (["report", str(tmp_path / "truncated.json")], "truncated"),
        "truncated gzip": (["report", str(tmp_path / "truncated.json.gz")], "gzip"),
        "corrupt gzip": (["report", str(tmp_path / "corrupt.json.gz")], "gzip"),
        "foreign JSON": (["report", str(tmp_path / "foreign.json")], "not a pyalloc"),
        "torch pickle": (["report", str(tmp_path / "torch.pickle")], "memory_viz"),
        "blocks not tiling": (["report", str(tmp_path / "gap.json")], "tile"),
        "no output dir": (["plot", str(good), "-o", str(tmp_path / "no/dir/x.png")],
                          "does not exist"),
        "output is a dir": (["plot", str(good), "-o", str(tmp_path / "d.png")],
                            "is a directory"),
        "output under a file": (["plot", str(good), "-o", str(good) + "/x.png"], "cannot write"),
        "plot suffix": (["plot", str(good), "-o", str(tmp_path / "x.svg")], "'.svg'"),
        "memviz suffix": (["export-memviz", str(good), "-o", str(tmp_path / "x.json")],
                          "'.json'"),
        "compare missing": (["compare", str(good), str(tmp_path / "nope.json")], "no such file"),
        "bad --top": (["report", str(good), "--top", "-1"], "must be 0 or more"),
        "bad --interval": (["watch", "123", "--interval", "0"], "more than 0"),
        "no subcommand": ([], "required"),
        "unknown subcommand": (["frobnicate"], "invalid choice"),
    }


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    for name, (argv, expected) in _bad_inputs(tmp_path).items():
        code, out, err = run_cli(capsys, *argv)
        assert code == 2, (name, code, err)
        assert err.startswith("pyalloc-stats: error:"), (name, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (name, err)
        assert expected in err, (name, err)
        assert not list(tmp_path.glob("**/x.*")), name  # nothing half-written


def test_help_of_every_subcommand_exits_0(capsys):
    for command in ("report", "plot", "watch", "compare", "export-memviz"):
        code, out, _ = run_cli(capsys, command, "--help")
        assert code == 0 and out.startswith(f"usage: pyalloc-stats {command}")
    assert "stranded" in run_cli(capsys, "report", "--help")[1]


def test_python_dash_m_runs_the_cli(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "pyalloc.stats_cli", "report",
                           str(tmp_path / "gone.json")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("pyalloc-stats: error:") and proc.stderr.count("\n") == 1


def test_watch_reads_what_a_real_process_published(capsys):
    pid = int(run_program("publish_stats_once", timeout=120).split()[-1])
    path = stats_path_for_pid(pid)
    try:
        code, out, err = run_cli(capsys, "watch", str(pid), "--once")
        assert code == 0, err
        assert "3.00 MiB" in out and "64.00 MiB" in out  # allocated, budget
        assert f"process {pid} is not running" in out  # it published once more at exit
    finally:
        path.unlink(missing_ok=True)
