"""torch.cuda.memory's history API under pyalloc (pyalloc/history.py): the snapshots are
what pytorch.org/memory_viz opens, checked as the viewer reads them (viewer_replay) and
through PyTorch's own torch.cuda._memory_viz."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

from test_stats_cli import viewer_replay

PROGRAM = Path(__file__).parent / "programs" / "memory_history.py"
MiB = 1 << 20


def test_record_memory_history_snapshot_and_dump_open_in_memory_viz(tmp_path):
    from torch.cuda import _memory_viz as viz

    proc = subprocess.run([sys.executable, str(PROGRAM), str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # 4 + 3 allocations and 2 frees, and the segments they mapped; then one more.
    assert seen["first_events"] >= 9
    assert seen["second_events"] >= seen["first_events"] + 1
    assert seen["second_actions"].count("alloc") == 8
    assert seen["second_actions"].count("free_completed") == 2
    assert seen["stopped_events"] == 0 and seen["segments"] >= 1
    assert "one recorder at a time" in seen["conflict"]
    # max_entries=3 keeps the 3 most recent events (a free shows as two viewer entries).
    assert seen["limited_events"] <= 2 * 3
    assert "enabled must be" in seen["refused"]

    for name in ("pyalloc.pickle", "torch.pickle"):
        raw = (tmp_path / name).read_bytes()
        assert raw[:2] == b"\x80\x04", name  # protocol 4: the viewer's unpickler reads 2-4
        data = pickle.loads(raw)
        assert set(data) == {"segments", "device_traces"}
        viewer_replay(data)
        summary = viz.segsum(data)  # re-adds every block; raises on an accounting mismatch
        assert f"segments: {len(data['segments'])}" in summary
        assert "Allocator State History" in viz.segment_plot(data)
        viz.trace_plot(data)
    data = pickle.loads((tmp_path / "pyalloc.pickle").read_bytes())
    allocated = sum(b["size"] for s in data["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    assert allocated >= 2 * 3 * MiB + 5 * MiB
