"""The engine's swap copies on CUDA are stream-ordered: a block is reused only after its copy.

tests/test_gpu.py runs it as ``python tests/programs/gpu_swap_copies.py`` (needs a GPU).
With the pinned host pool and the copies on their own streams, a swapped-out 256 MiB block
is freed at once and its memory reused by the next tensor, which is written at once: the
swap-out must still have copied the old bytes. Prints ``ok out GB/s <x> in GB/s <y>``
(throughput for the log; pyalloc.bench.swap measures it properly).
"""
from __future__ import annotations

import time

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cuda", budget="300MiB")   # room for one 256 MiB tensor
    engine = pyalloc._engine(None)
    engine.set_host_pool(512 << 20)
    stream = torch.cuda.current_stream().cuda_stream
    n = 256 << 20
    x = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    want = x.cpu()
    slot = engine.swap_out(x.data_ptr(), n, stream)
    x.untyped_storage().resize_(0)              # free now; reuse only after the copy
    y = torch.zeros(n, dtype=torch.uint8, device="cuda")
    y.fill_(7)
    engine.swap_in(slot, y.data_ptr(), stream)
    engine.swap_wait(slot, stream)
    assert torch.equal(y.cpu(), want)
    engine.swap_release(slot)
    torch.cuda.synchronize()
    t = time.perf_counter()
    slot = engine.swap_out(y.data_ptr(), n, stream)
    engine.synchronize()
    out_s = time.perf_counter() - t
    t = time.perf_counter()
    engine.swap_in(slot, y.data_ptr(), stream)
    engine.swap_wait(slot, stream)
    torch.cuda.synchronize()
    print("ok", "out GB/s", n / out_s / 1e9, "in GB/s", n / (time.perf_counter() - t) / 1e9)


if __name__ == "__main__":
    main()
