"""A training step compiled with torch.compile(mode="reduce-overhead") (CUDA graphs through
cudagraph trees), with and without pyalloc.install().

tests/test_gpu.py runs it twice, ``python tests/programs/gpu_reduce_overhead.py`` and with
``--pyalloc``, and compares the printed losses: they must match bit for bit (the same
kernels on the same inputs; the allocator changes only addresses). Prints ``ok`` at the end.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

if "--pyalloc" in sys.argv:
    import pyalloc
    pyalloc.install(device="cuda")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
compiled = torch.compile(model, mode="reduce-overhead")
data = [(torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda"))
        for _ in range(8)]
for step, (x, y) in enumerate(data):
    torch.compiler.cudagraph_mark_step_begin()
    loss = F.cross_entropy(compiled(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item().hex()}", flush=True)
# Evaluation on the same compiled module: a new path in cudagraph trees' tree.
try:
    with torch.no_grad():
        torch.compiler.cudagraph_mark_step_begin()
        print(f"eval {compiled(data[0][0]).sum().item().hex()}")
except RuntimeError as exc:
    if "pyalloc:" not in str(exc):
        raise
    print(f"eval refused: {str(exc).splitlines()[0]}")
if "--pyalloc" in sys.argv:
    pyalloc.check_invariants()
    s = pyalloc.memory_stats()
    print(f"syncs {s.get('num_sync_all_streams')} maps {s.get('num_segment_maps')}")
print("ok")
