"""Traces, replay, torch-compatible stats, the stats publisher and the file loader."""
from __future__ import annotations

import gzip
import json
import pickle
import random
import shutil
from pathlib import Path

import pytest

import pyalloc
from pyalloc import files
from pyalloc.replay import replay
from conftest import PROGRAMS, run_program, run_python

MiB = 1 << 20


def random_workload(engine, steps=400, seed=0):
    rng = random.Random(seed)
    live = []
    for _ in range(steps):
        if live and (len(live) > 30 or rng.random() < 0.45):
            engine.free(live.pop(rng.randrange(len(live))))
        else:
            size = int(2 ** rng.uniform(6, 25))  # 64 B .. 32 MiB
            try:
                live.append(engine.alloc(size))
            except pyalloc.OutOfMemoryError:
                pass
        if rng.random() < 0.01:
            engine.empty_cache()
    for p in live:
        engine.free(p)


def test_trace_records_every_event_in_order(tmp_path):
    path = tmp_path / "t.json"
    with pyalloc.Engine("host", budget="64MiB", sim_capacity="128MiB") as e:
        with pyalloc.record_trace(path, engine=e):
            a = e.alloc(100)
            b = e.alloc(3 * MiB)
            e.free(a)
            with pytest.raises(pyalloc.OutOfMemoryError):
                e.alloc(100 * MiB)
            e.free(b)
            e.empty_cache()
    doc = files.load(path, expect=files.TRACE)
    actions = [ev[1] for ev in doc["events"]]
    # First the lifetime phase recording began in (short-lived: 0), for replays.
    assert actions == ["lifetime", "segment_map", "alloc", "segment_map", "alloc", "free", "oom",
                       "free", "empty_cache", "segment_unmap", "segment_unmap"]
    assert doc["events"][0][3] == 0
    t, _, addr, size, requested, stream, ctx = doc["events"][2]
    assert (addr, size, requested, stream, ctx) == (a, 512, 100, 0, 0)
    times = [ev[0] for ev in doc["events"]]
    assert times == sorted(times)
    assert doc["dropped_events"] == 0
    assert doc["initial"]["stats"]["allocation.all.current"] == 0
    assert doc["final"]["stats"]["num_ooms"] == 1


def test_full_ring_drops_oldest_and_says_so(tmp_path):
    with pyalloc.Engine("host", budget="64MiB") as e:
        with pyalloc.record_trace(tmp_path / "t.json", engine=e, capacity=10):
            for _ in range(20):
                e.free(e.alloc(1000))
    doc = files.load(tmp_path / "t.json")
    assert len(doc["events"]) == 10
    assert doc["dropped_events"] == 42 - 10  # lifetime + segment_map + 40 alloc/free
    assert [ev[1] for ev in doc["events"]][-2:] == ["alloc", "free"]


def test_replay_reproduces_the_live_run(tmp_path):
    with pyalloc.Engine("host", budget="256MiB", sim_capacity="512MiB") as e:
        with pyalloc.record_trace(tmp_path / "t.json.gz", engine=e):
            random_workload(e)
    trace = files.load(tmp_path / "t.json.gz")
    live = trace["final"]["stats"]
    result = replay(trace, check_every=50)
    assert result.allocs > 100 and result.skipped_frees == 0
    assert result.peak_reserved == live["reserved_bytes.all.peak"]
    assert result.peak_allocated == live["allocated_bytes.all.peak"]
    assert result.utilization == live["utilization"]
    assert result.num_alloc_retries == live["num_alloc_retries"]
    assert result.failures == live["num_ooms"]


def test_replay_with_other_options(tmp_path):
    with pyalloc.Engine("host", budget="256MiB", sim_capacity="512MiB") as e:
        with pyalloc.record_trace(tmp_path / "t.json", engine=e):
            random_workload(e, seed=3)
    trace = files.load(tmp_path / "t.json")
    tight = replay(trace, {"budget": "40MiB"})
    assert tight.failures > 0
    assert tight.peak_reserved <= 40 * MiB
    assert "budget:41943040" in tight.options


@pytest.mark.slow
def test_replay_tool_cli(tmp_path):
    import subprocess, sys
    from pathlib import Path
    with pyalloc.Engine("host", budget="128MiB") as e:
        with pyalloc.record_trace(tmp_path / "t.json", engine=e):
            random_workload(e, steps=100)
    tool = Path(__file__).resolve().parent.parent / "tools" / "replay.py"
    out = subprocess.run([sys.executable, str(tool), str(tmp_path / "t.json"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["allocs"] > 10
    bad = subprocess.run([sys.executable, str(tool), str(tmp_path / "nope.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no such file" in bad.stderr


@pytest.mark.slow
def test_training_trace_replays_to_the_same_peak(tmp_path):
    # Run from a copy outside the source tree: the program checks that its own frames name
    # the ops, and the trace takes every frame under the directory that holds the pyalloc
    # package for library code (pyalloc/trace.py's _TORCH_DIRS), which with an editable
    # install is the checkout, tests/programs included.
    program = Path(shutil.copy(PROGRAMS / "trace_training.py", tmp_path))
    out = run_python(program, "--trace", tmp_path / "train.json")
    assert "peak" in out


def test_torch_compat_functions_on_the_simulated_device():
    run_program("torch_compat_functions")


def test_stats_publisher(tmp_path):
    path = tmp_path / "live.json"
    run_program("stats_publisher", "--stats-file", path)
    assert json.loads(path.read_text())["format"] == "pyalloc-stats"  # final write at exit
    with pytest.raises(ValueError, match="interval must be positive"):
        from pyalloc.publish import StatsPublisher
        StatsPublisher(str(path), interval=0)


def test_loader_rejects_bad_files(tmp_path):
    cases = {
        "empty.json": b"",
        "truncated.json": b'{"format": "pyalloc-snapshot", "version": 1, "segm',
        "foreign.json": b'{"hello": 1}',
        "other.json": b'{"format": "something-else", "version": 1}',
        "newer.json": b'{"format": "pyalloc-trace", "version": 99}',
        "incomplete.json": b'{"format": "pyalloc-trace", "version": 1}',
        "snap.pickle": pickle.dumps({"segments": []}, protocol=4),
        "broken.json.gz": gzip.compress(b'{"format": "pyalloc-snapshot"}')[:-6],
    }
    expected = {
        "empty.json": "empty", "truncated.json": "truncated", "foreign.json": "no \"format\" key",
        "other.json": "unknown format", "newer.json": "newer than this pyalloc reads",
        "incomplete.json": "missing events", "snap.pickle": "memory_viz",
        "broken.json.gz": "truncated or corrupt",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(files.FileFormatError, match=expected[name]):
            files.load(tmp_path / name)
    with pytest.raises(files.FileFormatError, match="no such file"):
        files.load(tmp_path / "missing.json")
    snap = tmp_path / "s.json"
    with pyalloc.Engine("host") as e:
        pyalloc.save_snapshot(snap, e)
    with pytest.raises(files.FileFormatError, match="is a pyalloc-snapshot, but a pyalloc-trace"):
        files.load(snap, expect=files.TRACE)
