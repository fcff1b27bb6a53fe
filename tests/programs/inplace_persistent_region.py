"""inplace.persistent() places what is made inside it apart from other allocations.

tests/test_inplace.py runs it as ``python tests/programs/inplace_persistent_region.py``.
It makes small tensors before, inside (nested) and after the block, and prints a dict of
each one's segment type: ``{'a': 'small', 'p': 'persistent', ...}``.
"""
from __future__ import annotations

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", budget="2GiB")
    from pyalloc import inplace

    a = torch.empty(1000, dtype=torch.uint8)
    with inplace.persistent():
        with inplace.persistent():       # nests
            p = torch.empty(1000, dtype=torch.uint8)
        q = torch.empty(3000, dtype=torch.uint8)
    b = torch.empty(1000, dtype=torch.uint8)
    kind = {}
    for s in pyalloc.snapshot()["segments"]:
        for t, name in ((a, "a"), (p, "p"), (q, "q"), (b, "b")):
            if s["address"] <= t.data_ptr() < s["address"] + s["total_size"]:
                kind[name] = s["segment_type"]
    print(kind)


if __name__ == "__main__":
    main()
