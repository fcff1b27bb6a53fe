"""A full host pool, with no lineage to fall back on, is an out-of-memory error naming the pool.

tests/test_swap.py runs it as ``python tests/programs/host_pool_full_oom.py``. Under
``policy="swap"`` with a 1 MiB host pool, a 4 MiB tensor with no lineage (a chain of
in-place ops too long to replay) could leave the device only by a swap the pool cannot
hold; a request that fits only if it leaves must fail. It prints ``oom: <the report on
one line>`` (or ``no error``), ``intact <whether the tensor kept its bytes>`` and
``refused <num_host_pool_full>``.
"""
from __future__ import annotations

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", budget="2GiB", evict_strategy="dtr")
    engine = pyalloc._engine(None)
    x = torch.randn(1024, 1024, requires_grad=True)         # 4 MiB
    with pyalloc.recompute(min_bytes=0, policy="swap", host_pool=1 << 20):
        a = x * 2
        for _ in range(257):  # past a forward chain's 256 steps; no lineage: only a swap could evict it, and the pool is 1 MiB
            a.add_(1)
        with torch.inference_mode():  # a copy that is no node (else it could leave instead)
            want = a.detach().clone()
        s = pyalloc.memory_stats()
        engine.set_budget(int(s["reserved_bytes.all.current"]))
        # More than the cached free bytes: it fits only if `a` goes.
        request = (int(s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"])
                   + (1 << 20))
        try:
            torch.empty(request, dtype=torch.uint8)
            print("no error")
        except torch.OutOfMemoryError as e:
            print("oom:", str(e).replace(chr(10), " "))
        print("intact", torch.equal(a, want))
        print("refused", pyalloc.memory_stats()["num_host_pool_full"])
        engine.set_budget(2 << 30)


if __name__ == "__main__":
    main()
