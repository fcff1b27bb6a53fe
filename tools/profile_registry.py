#!/usr/bin/env python3
"""Where a training step's host time goes under pyalloc's registry: cProfile of a few steps
of one model under a policy at a fraction of its unconstrained peak, beside the same steps
with no budget pressure and with no registry at all (each in this one process).

    python tools/profile_registry.py --device cuda --task resnet50 --policy recompute --fraction 0.5

Prints step times, the host time per step inside the registry's dispatch (all threads:
on CUDA backward runs on autograd's own thread, which cProfile does not see) split into
the aten ops themselves and the registry's own work, and the top functions of the main
thread by own and cumulative time. For finding per-op costs, not for reporting speed
(tools/bench_remat.py and tools/bench_suite.py do).
"""
from __future__ import annotations

import argparse
import cProfile
import threading
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Op:
    """An OpOverload stand-in: calls go through ``call``, everything else to ``func``."""

    def __init__(self, func, call) -> None:
        self._func, self._call = func, call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._func, name)

    def __hash__(self) -> int:
        return hash(self._func)

    def __eq__(self, other) -> bool:
        return self._func == (other._func if isinstance(other, _Op) else other)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--task", default="cnn")
    p.add_argument("--policy", default="recompute", choices=("recompute", "swap", "hybrid"))
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    import torch
    import pyalloc

    options = {"host_pool": 8 << 30} if args.policy != "recompute" and args.device == "cuda" else {}
    pyalloc.install(device=args.device, policy=args.policy, **options)
    from pyalloc import registry
    from pyalloc.models import TASKS

    dev = "cuda" if args.device == "cuda" else "cpu"
    task = TASKS[args.task]
    torch.manual_seed(0)
    model = task.build().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = task.batch(task.default_batch, torch.Generator().manual_seed(1))
    x, y = x.to(dev), y.to(dev)
    engine = pyalloc._engine(None)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    def steps(n: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            task.loss(model, x, y).backward()
            opt.step()
        sync()
        return (time.perf_counter() - start) / n

    reg = registry.active()
    # Host time inside the registry's dispatch, outermost calls only, every thread; and
    # within it, the time of the ops it calls.
    local = threading.local()
    totals = {"dispatch": 0.0, "op": 0.0, "calls": 0}
    cls = type(reg)
    original = cls.__torch_dispatch__

    def timed(self, func, types, args=(), kwargs=None):
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        start = time.perf_counter()
        token = object()
        if depth == 0:
            local.token = token
        try:
            def op(*a, **k):
                # Only the outermost dispatch's own op: lineage keeps this wrapper, and a
                # recompute may call it again later from inside another op's dispatch.
                counted = local.depth == 1 and getattr(local, "token", None) is token
                t = time.perf_counter()
                try:
                    return func(*a, **k)
                finally:
                    if counted:
                        totals["op"] += time.perf_counter() - t
            return original(self, _Op(func, op), types, args, kwargs)
        finally:
            local.depth = depth
            if depth == 0:
                totals["dispatch"] += time.perf_counter() - start
                totals["calls"] += 1

    steps(2)
    free = steps(args.steps)
    peak = pyalloc.memory_stats()["reserved_bytes.all.peak"]
    reg._hooks.__exit__(None, None, None)
    reg.__exit__(None, None, None)
    steps(1)
    plain = steps(args.steps)
    reg.__enter__()
    reg._hooks.__enter__()
    engine.set_budget(int(args.fraction * peak))
    steps(2)
    ops0, rc0 = reg._ops, reg.recomputes
    cls.__torch_dispatch__ = timed
    before = engine.stats()
    profile = cProfile.Profile()
    profile.enable()
    tight = steps(args.steps)
    profile.disable()
    cls.__torch_dispatch__ = original
    print(f"{args.task} on {args.device}: step {plain * 1e3:.1f} ms without the registry, "
          f"{free * 1e3:.1f} ms with it (no pressure), {tight * 1e3:.1f} ms under "
          f"{args.policy} at {args.fraction} P (profiled; P = {peak / 2**20:.0f} MiB); "
          f"{(reg._ops - ops0) / args.steps:.0f} ops, "
          f"{(reg.recomputes - rc0) / args.steps:.0f} recomputes per step")
    n = args.steps
    after = engine.stats()
    keys = ("num_alloc_retries", "num_sync_all_streams", "num_stream_fences", "num_evictions",
            "num_stitches", "num_device_alloc", "num_device_free")
    print("per step: " + ", ".join(f"{k} {(after[k] - before[k]) / n:.1f}" for k in keys))
    print(f"host time per step in dispatch: {totals['dispatch'] / n * 1e3:.1f} ms over "
          f"{totals['calls'] / n:.0f} outermost calls; in the ops themselves "
          f"{totals['op'] / n * 1e3:.1f} ms; the registry's own "
          f"{(totals['dispatch'] - totals['op']) / n * 1e3:.1f} ms "
          f"({(totals['dispatch'] - totals['op']) / max(1, totals['calls']) * 1e6:.1f} us a call)")
    for key in ("tottime", "cumtime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(key).print_stats(args.top)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
