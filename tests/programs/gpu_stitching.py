"""Stitching on a GPU maps free chunks of several segments into one range and keeps data.

tests/test_gpu.py runs it as ``python tests/programs/gpu_stitching.py`` (needs a GPU).
It fills the 40 MiB budget with 4 MiB tensors, frees every other one, then asks for 12
MiB, which no hole holds: stitching maps the free chunks into one range (a handle per 2 MiB
chunk, Note [One handle per chunk] in cuda_backend.cpp). What is written through it must
land in the pieces, leave the survivors alone, and outlive the range. Freed, the range stays
mapped, and the same request takes it again without a mapping. Prints ``ok`` at the end.
"""
from __future__ import annotations

import torch

import pyalloc

MiB = 1 << 20


def at(address: int, size: int) -> torch.Tensor:
    """The device bytes at an address, without a copy."""
    class View:
        __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                    "data": (address, False), "version": 3}
    return torch.as_tensor(View(), device="cuda")


def main() -> None:
    pyalloc.install(device="cuda", budget="40MiB")
    blocks = [torch.full((4 * MiB,), i, dtype=torch.uint8, device="cuda") for i in range(10)]
    survivors = blocks[0::2]
    del blocks
    big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
    big.fill_(99)
    torch.cuda.synchronize()
    s = pyalloc.memory_stats()
    assert s["num_stitches"] == 1 and s["reserved_bytes.all.peak"] <= 40 * MiB, s
    ranges = pyalloc.snapshot()["stitched"]
    assert len(ranges) == 1 and ranges[0]["address"] == big.data_ptr(), ranges
    assert sum(size for _, size in ranges[0]["pieces"]) == 12 * MiB
    for address, size in ranges[0]["pieces"]:     # the same pages, seen at home
        assert bool((at(address, size) == 99).all())
    for i, t in enumerate(survivors):
        assert bool((t == 2 * i).all()), i
    pyalloc.check_invariants()
    address = big.data_ptr()
    del big                                       # kept mapped (option keep_stitched)
    assert pyalloc.snapshot()["stitched"] == []
    assert pyalloc._engine(None).stats()["kept_stitched_ranges"] == 1
    # The same request finds the same free chunks: the kept range, no new mapping; what is
    # written through it lands in the pieces again (Note [Keeping stitched mappings]).
    maps = pyalloc.memory_stats()["num_segment_maps"]
    big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
    big.fill_(55)
    torch.cuda.synchronize()
    s = pyalloc.memory_stats()
    assert big.data_ptr() == address and s["num_stitch_reuses"] == 1, s
    assert s["num_segment_maps"] == maps, s
    for address, size in pyalloc.snapshot()["stitched"][0]["pieces"]:
        assert bool((at(address, size) == 55).all())
    for i, t in enumerate(survivors):
        assert bool((t == 2 * i).all()), i
    del big
    again = [torch.full((4 * MiB,), 7, dtype=torch.uint8, device="cuda") for _ in range(3)]
    torch.cuda.synchronize()
    for i, t in enumerate(survivors):
        assert bool((t == 2 * i).all()), i
    assert all(bool((t == 7).all()) for t in again)
    pyalloc.check_invariants()
    print("ok")


if __name__ == "__main__":
    main()
