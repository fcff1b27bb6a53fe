"""A program written for stock PyTorch's memory tooling, unchanged but for
pyalloc.install() at the top: _record_memory_history, an OOM observer registered the way
Lightning and Megatron do, _dump_snapshot. Needs a GPU.

    python tests/programs/gpu_stock_tooling.py SNAPSHOT_PATH
Prints one JSON line of what it saw, then ``ok``.
"""
from __future__ import annotations

import json
import sys

import pyalloc

pyalloc.install(device="cuda", budget="2GiB")

import torch  # noqa: E402  (after install, as the README says)

path = sys.argv[1]
seen = {"observer": []}
torch.cuda.memory._record_memory_history(max_entries=100_000)
torch._C._cuda_attach_out_of_memory_observer(
    lambda device, alloc, device_alloc, device_free: seen["observer"].append(
        [device, alloc, device_alloc, device_free]))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                            torch.nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.Adam(model.parameters())
for _ in range(3):
    loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
try:
    torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as exc:
    seen["oom_message"] = str(exc).splitlines()[0]
torch.cuda.memory._dump_snapshot(path)
torch.cuda.memory._record_memory_history(enabled=None)
seen["allocated"] = torch.cuda.memory_allocated()
seen["reserved"] = torch.cuda.memory_reserved()
seen["summary_lines"] = len(torch.cuda.memory_summary().splitlines())
print(json.dumps(seen))
print("ok")
