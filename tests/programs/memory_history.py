"""PyTorch's memory history API under pyalloc, on the simulated device.

Run by tests/test_memory_history.py in a fresh interpreter (install() is once a process):
    python tests/programs/memory_history.py OUT_DIR
Writes OUT_DIR/pyalloc.pickle (pyalloc.dump_snapshot) and OUT_DIR/torch.pickle (the
same program through torch.cuda.memory's functions, as install(device="cuda") patches
them), and prints one JSON object of what it saw.
"""
import json
import sys
from pathlib import Path

import torch

import pyalloc
from pyalloc import torch_compat

out = Path(sys.argv[1])
MiB = 1 << 20
pyalloc.install(device="cpu", budget="256MiB")


def work():
    xs = [torch.empty(3 * MiB, dtype=torch.uint8) for _ in range(4)]
    small = [torch.empty(1000, dtype=torch.uint8) for _ in range(3)]
    del xs[1], small[0]
    return xs, small


# pyalloc's own calls.
pyalloc.record_memory_history(max_entries=10_000)
kept = work()
first = pyalloc.memory_snapshot()
more = torch.empty(5 * MiB, dtype=torch.uint8)
second = pyalloc.memory_snapshot()   # recording goes on between snapshots
pyalloc.dump_snapshot(out / "pyalloc.pickle")
try:
    with pyalloc.record_trace(out / "trace.json"):
        pass
    conflict = ""
except pyalloc.PyallocError as error:
    conflict = str(error)
pyalloc.record_memory_history(enabled=None)
stopped = pyalloc.memory_snapshot()   # segments only once stopped
with pyalloc.record_trace(out / "trace.json"):   # the ring is free again
    pass

# The same through torch.cuda.memory, as a program written for stock PyTorch calls it.
torch_compat.patch_torch_cuda()
try:
    torch.cuda.memory._record_memory_history(max_entries=3)
    again = work()
    torch.cuda.memory._dump_snapshot(str(out / "torch.pickle"))
    limited = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
finally:
    torch_compat.unpatch_torch_cuda()

try:
    pyalloc.record_memory_history(enabled="sometimes")
    refused = ""
except ValueError as error:
    refused = str(error)

print(json.dumps({
    "first_events": len(first["device_traces"][0]),
    "second_events": len(second["device_traces"][0]),
    "second_actions": [e["action"] for e in second["device_traces"][0]],
    "stopped_events": len(stopped["device_traces"][0]),
    "segments": len(second["segments"]),
    "allocated": pyalloc.memory_stats()["allocated_bytes.all.current"],
    "conflict": conflict,
    "limited_events": len(limited["device_traces"][0]),
    "refused": refused,
}))
