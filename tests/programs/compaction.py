"""Compaction moves a frozen storage within the device, with its contents and views.

tests/test_frag.py (``--device cpu``, the simulated device) and tests/test_gpu.py
(``--device cuda``) run it as::

    python tests/programs/compaction.py --device cpu --compact true

Under recompute with spill off (no host pool), frozen storages (chains of in-place ops too
long to replay, never evicted) sit between 1.5 MiB holes, and the rest of the budget is filled; a
4 MiB request then fits only if one of them moves. It prints ``served`` or ``oom``,
``relocations <engine's count> <registry's count>``, ``moved <storages at a new
address>`` and ``intact <contents, views, view offsets and version counters kept>``.
"""
from __future__ import annotations

import argparse

import torch
from torch.utils._python_dispatch import _disable_current_modes

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--compact", choices=["true", "false"], required=True,
                        help="the install option")
    args = parser.parse_args()
    pyalloc.install(device=args.device, budget="2GiB", compact=args.compact == "true")
    engine = pyalloc._engine(None)
    MiB = 1 << 20
    dev = args.device
    w = torch.randn(3 * MiB // 8, device=dev, requires_grad=True)   # 1.5 MiB
    # The rest of its segment, held to the end.
    pad = torch.empty(37 * MiB // 2, dtype=torch.uint8, device=dev)  # noqa: F841
    with pyalloc.recompute(min_bytes=0, spill=False) as reg:   # no host pool to leave through
        parts = []
        for i in range(13):
            p = w * float(i)
            for _ in range(257):  # past a forward chain's 256 steps; a chain too long to replay: frozen, never evicted
                p.add_(1)
            parts.append(p)
        keep = parts[0::2]
        views = [p[10:20].view(2, 5).t() for p in keep]
        # Copies the registry does not see: a clone of a node made under no_grad would be a
        # node itself (Note [What no_grad derives]), evictable, and make the hole.
        with torch.no_grad(), reg.paused():
            want = [p.clone() for p in keep]
            want_views = [v.clone() for v in views]
        del parts, p
        torch.zeros(1, device=dev) + 1    # an op: the registry lets go of the dead storages
        fillers = []      # not registry nodes, so they stay put; only 1.5 MiB holes remain
        with _disable_current_modes():
            for seg in engine.snapshot()["segments"]:
                for b in seg["blocks"]:
                    if b["state"] == "inactive" and b["size"] >= 2 * MiB:
                        fillers.append(torch.empty(b["size"], dtype=torch.uint8, device=dev))
        s = pyalloc.memory_stats()
        engine.set_budget(int(s["reserved_bytes.all.current"]))
        before = [p.data_ptr() for p in keep]
        versions = [p._version for p in keep]
        try:
            big = torch.empty(4 * MiB, dtype=torch.uint8, device=dev)  # noqa: F841
            print("served")
        except torch.OutOfMemoryError:
            print("oom")
        s = pyalloc.memory_stats()
        print("relocations", s["num_relocations"], reg.stats()["relocations"])
        print("moved", sum(a != p.data_ptr() for a, p in zip(before, keep)))
        print("intact", all(torch.equal(p, x) for p, x in zip(keep, want))
              and all(torch.equal(v, x) for v, x in zip(views, want_views))
              and all(v.data_ptr() == p.data_ptr() + 40 for v, p in zip(views, keep))
              and [p._version for p in keep] == versions)
        engine.set_budget(2 << 30)
        pyalloc.check_invariants()


if __name__ == "__main__":
    main()
