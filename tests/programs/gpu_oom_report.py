"""An out-of-memory error on a GPU under a budget: the report, recovery, the snapshot at OOM.

tests/test_gpu.py runs it as ``python tests/programs/gpu_oom_report.py --snapshot
PATH`` (needs a GPU). A request past the 1 GiB budget raises torch.OutOfMemoryError
naming the budget (``oom reported``); a smaller request then succeeds; the snapshot saved
with ``at_oom=True`` to PATH holds the layout the request failed in (``oom snapshot
ok``).
"""
from __future__ import annotations

import argparse
import json

import torch

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", required=True, help="where to save the OOM snapshot")
    args = parser.parse_args()
    pyalloc.install(device="cuda", budget="1GiB")
    keep = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # noqa: F841
    try:
        torch.empty(768 << 20, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:   # raised by the torch shim's entry point
        assert "out of memory" in str(e) and "budget 1.00 GiB" in str(e), str(e)
        print("oom reported")
    small = torch.ones(16 << 20, device="cuda")        # 64 MiB of float32
    assert small.sum().item() == 16 << 20
    pyalloc.check_invariants()
    assert pyalloc.memory_stats()["num_ooms"] == 1
    # The layout the request failed in, kept by the engine (the 64 MiB tensor came later).
    with open(pyalloc.save_snapshot(args.snapshot, at_oom=True)) as f:
        doc = json.load(f)
    assert doc["oom"]["size"] == 768 << 20 and doc["backend"] == "cuda", doc["oom"]
    live = sum(b["size"] for seg in doc["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated")
    assert 512 << 20 <= live < 768 << 20, live   # `keep`, and nothing of the failed request
    print("oom snapshot ok")


if __name__ == "__main__":
    main()
