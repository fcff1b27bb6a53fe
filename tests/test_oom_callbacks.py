"""pyalloc.on_oom: callbacks on out-of-memory failures, and PyTorch's observer route
(pyalloc/oom.py). The program runs in a fresh interpreter: install() is once a process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROGRAM = Path(__file__).parent / "programs" / "oom_callbacks.py"
MiB = 1 << 20


def test_on_oom_callbacks_see_the_figures_before_the_error_and_can_be_removed():
    proc = subprocess.run([sys.executable, str(PROGRAM)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["raised"]
    # Every callback, in registration order (the failing one too), before the error.
    assert seen["order"][:4] == ["first", "second", "failing", "raised"]
    r = seen["report"]
    assert r["device"] == 0 and r["size"] == 30 * MiB and r["rounded"] >= r["size"]
    assert r["budget"] == 64 * MiB
    assert r["allocated"] == seen["allocated_before"] >= 40 * MiB
    assert r["reserved"] >= r["allocated"] + r["cached_free"]
    assert 0 <= r["largest_free_block"] <= r["cached_free"]
    assert r["evictable"] == 0 and r["evictable_blocks"] == 0  # no policy
    assert r["device_total"] > 0
    assert r["report"].startswith("pyalloc: out of memory") and "(31457280 bytes" in r["report"]
    # remove() and the with-block: only live callbacks are called.
    assert seen["events_after_remove"] == [50 * MiB]
    assert seen["second_sizes"] == [30 * MiB, 50 * MiB, 51 * MiB]
    # PyTorch's observer signature: (device, alloc, device_allocated, device_free).
    assert len(seen["observed"]) == 1
    device, alloc, device_allocated, device_free = seen["observed"][0]
    assert (device, alloc) == (0, 60 * MiB)
    assert device_allocated >= 40 * MiB and device_free >= 0
    assert "expects a callable" in seen["refused"]
