"""An expandable segment on a GPU grows, trims and stitches with its data intact.

tests/test_gpu.py runs it as ``python tests/programs/gpu_expandable.py`` (needs a GPU).
With option expandable, tensors land back to back in one segment that grows a 2 MiB chunk
(one cuMemCreate handle) at a time; empty_cache unmaps the free chunks at its end with the
rest still mapped and intact; holes are stitched by their per-chunk handles; the whole
segment goes once nothing in it is live. Prints ``ok`` at the end.
"""
from __future__ import annotations

import torch

import pyalloc

MiB = 1 << 20


def large_segments() -> list:
    return [s for s in pyalloc.snapshot()["segments"] if s["segment_type"] == "large"]


def main() -> None:
    pyalloc.install(device="cuda", budget="40MiB", expandable=True)
    blocks = [torch.full((4 * MiB,), i, dtype=torch.uint8, device="cuda") for i in range(10)]
    large = large_segments()
    assert len(large) == 1 and large[0]["expandable"], large
    offsets = [b.data_ptr() - blocks[0].data_ptr() for b in blocks]
    assert offsets == [i * 4 * MiB for i in range(10)], offsets
    survivors = blocks[0::2]
    del blocks
    big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")   # no hole holds it
    big.fill_(99)
    torch.cuda.synchronize()
    assert pyalloc.memory_stats()["num_stitches"] == 1
    for i, t in enumerate(survivors):
        assert bool((t == 2 * i).all()), i
    del big, survivors[-1]
    torch.cuda.synchronize()
    pyalloc.empty_cache()
    s = pyalloc.memory_stats()
    assert s["num_segment_trims"] == 1, s
    seg = large_segments()[0]
    tail = seg["blocks"][-1]     # live, or free but less than a chunk
    assert tail["state"] != "inactive" or tail["size"] < 2 * MiB, seg
    for i, t in enumerate(survivors):
        assert bool((t == 2 * i).all()), i
    more = torch.full((10 * MiB,), 5, dtype=torch.uint8, device="cuda")   # grows again
    torch.cuda.synchronize()
    assert bool((more == 5).all()) and pyalloc.memory_stats()["num_segment_grows"] > 0
    pyalloc.check_invariants()
    del more, survivors, t       # (the loop's variable holds a survivor too)
    pyalloc.empty_cache()
    assert pyalloc.memory_stats()["reserved_bytes.large_pool.current"] == 0
    print("ok")


if __name__ == "__main__":
    main()
