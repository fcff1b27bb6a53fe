"""Under recompute, a storage with no lineage leaves its place through the host pool.

tests/test_frag.py runs it as ``python tests/programs/relocate_through_host_pool.py``
(spill on, the pool's default size), with ``--host-pool 16777216``, and with ``--no-spill``
(no pool). A 4 MiB tensor with no
lineage left (a chain of in-place ops too long to replay) and a view of it stand in the
way of a request that fits only if the tensor leaves its place. It prints ``served`` or
``oom``, ``moved <swap-outs>`` and ``intact <whether the tensor and the view kept their
bytes>``.
"""
from __future__ import annotations

import argparse

import torch

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-pool", type=int, default=None,
                        help="the registry's host pool in bytes (default: the option's)")
    parser.add_argument("--no-spill", action="store_true", help="option spill off: no pool")
    args = parser.parse_args()
    pyalloc.install(device="cpu", budget="2GiB", evict_strategy="dtr")
    engine = pyalloc._engine(None)
    x = torch.randn(1024, 1024, requires_grad=True)         # 4 MiB
    with pyalloc.recompute(min_bytes=0, host_pool=args.host_pool,
                           spill=not args.no_spill) as reg:
        a = x * 2
        for _ in range(257):  # past a forward chain's 256 steps; a chain too long to replay: recompute cannot evict it
            a.add_(1)
        view = a[100:200].t()
        with torch.inference_mode():  # copies that are no nodes (else they could leave instead)
            want, want_view = a.detach().clone(), view.detach().clone()
        s = pyalloc.memory_stats()
        engine.set_budget(int(s["reserved_bytes.all.current"]))
        # More than the cached free bytes: it fits only if `a` leaves its place.
        request = (int(s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"])
                   + (1 << 20))
        try:
            big = torch.empty(request, dtype=torch.uint8)
            print("served")
            del big
        except torch.OutOfMemoryError:
            print("oom")
        print("moved", reg.stats().get("swap_outs", 0))
        print("host pool", engine.stats()["host_pool_bytes"],
              "usable", engine.stats()["host_pool_usable_bytes"])
        print("intact", torch.equal(a, want) and torch.equal(view, want_view))
        engine.set_budget(2 << 30)
        pyalloc.check_invariants()


if __name__ == "__main__":
    main()
