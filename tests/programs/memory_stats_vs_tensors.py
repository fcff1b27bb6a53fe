"""pyalloc.memory_stats() agrees with the live tensors on the simulated device.

tests/test_torch_sim.py runs it as ``python tests/programs/memory_stats_vs_tensors.py``.
Tensors of sizes in the small and the large pool must add exactly their requested bytes,
their count and the sizes of the blocks they sit in to the stats, and take them away again
when freed. Prints ``ok`` at the end.
"""
from __future__ import annotations

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", budget="256MiB")
    base = pyalloc.memory_stats()
    sizes = [1, 100, 4096, 300_000, 3 << 20, 12 << 20]   # small and large pool
    tensors = [torch.empty(n, dtype=torch.uint8) for n in sizes]
    s = pyalloc.memory_stats()
    assert s["requested_bytes.all.current"] - base["requested_bytes.all.current"] == sum(sizes)
    assert s["allocation.all.current"] - base["allocation.all.current"] == len(sizes)
    # allocated bytes are the sizes of exactly the blocks these tensors sit in
    blocks = {b["address"]: b for seg in pyalloc.snapshot()["segments"] for b in seg["blocks"]}
    mine = [blocks[t.data_ptr()] for t in tensors]
    assert all(b["state"] == "active_allocated" for b in mine)
    assert [b["requested_size"] for b in mine] == sizes
    assert (s["allocated_bytes.all.current"] - base["allocated_bytes.all.current"]
            == sum(b["size"] for b in mine))
    del tensors
    s = pyalloc.memory_stats()
    for key in ("requested_bytes.all.current", "allocated_bytes.all.current",
                "allocation.all.current"):
        assert s[key] == base[key], key
    pyalloc.check_invariants()
    print("ok")


if __name__ == "__main__":
    main()
