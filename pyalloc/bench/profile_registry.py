#!/usr/bin/env python3
"""Where a training step's time goes under pyalloc's registry: a few steps of one model with
no registry, with the registry and no budget pressure, and under a policy at a fraction of
the unconstrained peak, all in this one process.

    python tools/profile_registry.py --device cuda --task resnet50 --policy recompute --fraction 0.5

Prints the three step times, the ops per step and the registry's host cost per op (step
with it minus step without, over the ops), and per step under the policy: the engine's
reclaim counters (device synchronizations, segment maps and unmaps, stitches, evictions,
release retries) and the registry's (recomputes, swaps, prefetches). ``--cprofile`` adds
the top Python functions of the main thread under the policy (the registry itself is C++
and does not show there). For finding per-step costs, not for reporting speed
(tools/bench_remat.py and tools/bench_suite.py do).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys


ENGINE_KEYS = ("num_sync_all_streams", "num_segment_maps", "num_segment_unmaps", "num_stitches",
               "num_stitch_reuses",
               "num_evictions", "num_alloc_retries", "num_stream_fences", "num_ooms",
               "num_evict_rounds")
REGISTRY_KEYS = ("recomputes", "swap_outs", "swap_ins", "prefetches", "eager_evictions")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--task", default="cnn")
    p.add_argument("--policy", default="recompute", choices=("recompute", "swap", "hybrid"))
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=None, help="default: the task's own")
    p.add_argument("--cprofile", action="store_true", help="cProfile the main thread's Python")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--torch-profile", action="store_true",
                   help="torch.profiler over the steps under the policy: the ops with the most "
                        "host time and the most device time (is the added time the host's or "
                        "the device's?)")
    args = p.parse_args()
    import torch
    import pyalloc

    options = {"host_pool": 8 << 30} if args.policy != "recompute" and args.device == "cuda" else {}
    pyalloc.install(device=args.device, policy=args.policy, **options)
    from pyalloc import registry
    from pyalloc.bench.models import TASKS
    from pyalloc.bench.trial import device_sync, run_steps, task_training

    dev = "cuda" if args.device == "cuda" else "cpu"
    task = TASKS[args.task]
    torch.manual_seed(0)
    model = task.build().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    training = task_training(task, model, opt, args.batch or task.default_batch, dev)
    engine = pyalloc._engine(None)
    reg = registry.active()
    sync = device_sync(dev)

    def steps(n: int) -> float:
        """The mean step time of ``n`` steps run back to back, as training runs them."""
        return run_steps(training, n, sync=sync, sync_every_step=False).mean_s

    steps(2)
    ops0 = reg.ops
    free = steps(args.steps)
    ops = (reg.ops - ops0) / args.steps
    peak = pyalloc.memory_stats()["reserved_bytes.all.peak"]
    with reg.paused():
        steps(1)
        plain = steps(args.steps)
    engine.set_budget(int(args.fraction * peak))
    steps(2)   # warm-up under the budget: the layout settles
    before, reg_before, blocked_before = engine.stats(), reg.stats(), engine.blocked_ns()
    replays_before = reg.replays_by_op()
    profile = cProfile.Profile() if args.cprofile else None
    if profile:
        profile.enable()
    if args.torch_profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        with torch_profile(activities=activities) as prof:
            tight = steps(args.steps)
        averages = prof.key_averages()
        print(averages.table(sort_by="self_cpu_time_total", row_limit=args.top))
        if dev == "cuda":
            print(averages.table(sort_by="self_device_time_total", row_limit=args.top))
    else:
        tight = steps(args.steps)
    if profile:
        profile.disable()
    after, reg_after, blocked_after = engine.stats(), reg.stats(), engine.blocked_ns()
    n = args.steps
    print(f"{args.task} on {args.device}: step {plain * 1e3:.1f} ms without the registry, "
          f"{free * 1e3:.1f} ms with it and no pressure ({free / plain:.2f}x), "
          f"{tight * 1e3:.1f} ms under {args.policy} at {args.fraction} P ({tight / plain:.2f}x; "
          f"P = {peak / 2**20:.0f} MiB)")
    print(f"{ops:.0f} ops per step through the registry; its host cost with no pressure: "
          f"{(free - plain) / max(ops, 1) * 1e6:.2f} us an op")
    print("per step under the policy, after warm-up: " +
          ", ".join(f"{k} {(after[k] - before[k]) / n:.1f}" for k in ENGINE_KEYS) + "; " +
          ", ".join(f"{k} {(reg_after.get(k, 0) - reg_before.get(k, 0)) / n:.1f}"
                    for k in REGISTRY_KEYS))
    # Where the added time goes: host time inside replays (the GPU work they launch overlaps
    # it; a nested replay counts in each enclosing one too, so this can exceed the step),
    # and the engine blocked on the device (stream fences, synchronous unmaps).
    replay_ms = (reg_after.get("recompute_ns", 0) - reg_before.get("recompute_ns", 0)) / n / 1e6
    print(f"per step: {replay_ms:.2f} ms of host time replaying (nested replays counted in "
          f"each enclosing one), "
          f"{(blocked_after - blocked_before) / n / 1e6:.2f} ms with the engine blocked on the "
          f"device; the step {(tight - plain) * 1e3:.1f} ms over the run without the registry")
    replays = {op: (count - replays_before.get(op, 0)) / n
               for op, count in reg.replays_by_op().items()}
    replays = sorted(((c, op) for op, c in replays.items() if c > 0), reverse=True)
    if replays:
        print("ops replayed per step: " + ", ".join(f"{op} {c:.1f}" for c, op in replays[:args.top]))
    if profile:
        for key in ("tottime", "cumtime"):
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(key).print_stats(args.top)
            print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
