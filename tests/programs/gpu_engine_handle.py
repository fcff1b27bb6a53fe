"""An Engine on CUDA, without PyTorch: allocations, invariants, empty_cache, no stress loop.

tests/test_gpu.py runs it as ``python tests/programs/gpu_engine_handle.py`` (needs a GPU).
Prints ``ok`` at the end.
"""
from __future__ import annotations

import pyalloc


def main() -> None:
    with pyalloc.Engine("cuda", budget="1GiB") as e:
        ptrs = [e.alloc(n) for n in (0, 1, 4096, 5 << 20, 40 << 20)]
        assert len(set(ptrs)) == len(ptrs)
        e.check_invariants()
        for p in ptrs:
            e.free(p)
        e.empty_cache()
        assert e.stats()["reserved_bytes.all.current"] == 0
        try:
            e.stress()
        except pyalloc.PyallocError as err:
            assert "simulated device" in str(err)
    print("ok")


if __name__ == "__main__":
    main()
