#!/usr/bin/env python3
"""Swap benchmark: how fast the engine's copies run, and what swapping does to a step.

Two parts, side by side in one run, each measurement in its own process (the allocator
and its options are chosen once per process):

  copy throughput   one block of each size (4, 16, 64, 256 MiB; 4 and 16 with --quick)
              swapped out to the host pool and back in through the engine
              (``swap_out`` + synchronize; ``swap_in`` + ``swap_wait`` + synchronize), against
              the platform's peak copy of the same size timed the same way: on a GPU,
              ``copy_(non_blocking=True)`` between a CUDA tensor and a pinned host tensor; on
              the simulated device, one thread's ``memmove`` (each swap copy runs on one
              copy-stream thread, so one thread's memcpy is the fair peak). GB/s (1e9 bytes
              per second), median of ``--reps`` rounds after one untimed round that faults the
              pages in and checks the bytes came back; rounds interleave the four copies, so
              a noisy neighbour slows them alike. swap/peak near 1.0: the swap path adds
              nothing to the copy.

  step time   per model, the baseline (policy none, unconstrained) gives the peak reserved
              bytes P and the reference step time; then policies recompute, swap and hybrid
              at budgets 0.9 P, 0.5 P and 0.3 P (``--fractions``). Figure: median step time
              over the baseline's (empty where it cannot train: out of memory, or past the
              thrash limit, 10x the baseline's time for the trial and at least 10 s), with the
              registry's counters for that trial (``pyalloc.memory_stats()["remat.*"]`` after
              minus before; the swap keys exist under swap and hybrid only) per step, warm-up
              steps included.

  Timed steps: ``--steps`` (6; 3 with --quick), of which the first ``min(2, steps // 3)``
  are warm-up and not timed. The model, the trial and the thrash limit are bench_remat's.
  On the simulated device the models train on one CPU thread (``--threads``), so that the
  swap copies have cores of their own, as a GPU's copy engines are not its SMs.

    python tools/bench_swap.py                        # simulated device: mlp, cnn, transformer
    python tools/bench_swap.py --device cuda          # cnn, transformer, resnet50, gpt2
    python tools/bench_swap.py --quick --tasks mlp --fractions 0.5   # smoke test

Writes ``bench_swap.json`` and ``bench_swap.md`` into ``--out`` and prints the tables.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import json
import mmap
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional


from pyalloc.bench.remat import Worker, _ratio

from pyalloc.bench.results import sim_device_name

POLICIES = ("recompute", "swap", "hybrid")
SWAPPING = ("swap", "hybrid")
# The registry's counters reported per trial (pyalloc.memory_stats() keys, less "remat.").
COUNTERS = ("swap_outs", "swap_ins", "swap_out_bytes", "prefetches", "prefetch_ready",
            "recomputes", "chose_swap", "chose_recompute", "swap_wait_ns")
DEFAULT_TASKS = {"cpu": ["mlp", "cnn", "transformer"],
                 "cuda": ["cnn", "transformer", "resnet50", "gpt2"]}
# The "unconstrained" budget, as in bench_remat: below the simulated device's 4 GiB and an
# H100's 80 GB, so an unconstrained run still fails cleanly rather than exhausting the device.
CAPACITY = {"cpu": 3 << 30, "cuda": 70 << 30}
MiB = 1 << 20


def _warmup(steps: int) -> int:
    """Untimed steps at the start of a trial: two of six, one of three. The first step
    of a swap policy has no previous iteration to prefetch from, and allocates its cache."""
    return min(2, steps // 3)


# --- part 1: copy throughput, in its own process ----------------------------------------------
class SimBuffers:
    """Two blocks of the simulated device and an ordinary host buffer, all ``n`` bytes.

    The peak copies are ``memmove`` on the calling thread (ctypes releases the GIL and
    calls libc directly), the same memcpy a swap runs on the engine's copy-stream thread.
    The host buffer is page-aligned, as the engine's blocks and host pool are: into a
    ``malloc``'d buffer (16 bytes past a page) glibc's large copy ran at a quarter of the
    speed on the dev VM (4.4 against 16 GB/s at 256 MiB), which would flatter the engine.
    """

    def __init__(self, engine: Any, n: int) -> None:
        self.engine, self.n = engine, n
        self.src, self.dst = engine.alloc(n), engine.alloc(n)
        self._map = mmap.mmap(-1, n)
        self._view = ctypes.c_char.from_buffer(self._map)
        self.host = ctypes.addressof(self._view)
        ctypes.memset(self.src, 0x5A, n)
        ctypes.memset(self.host, 0, n)   # commits the pages before the timed rounds

    def peak_d2h(self) -> None:
        ctypes.memmove(self.host, self.src, self.n)

    def peak_h2d(self) -> None:
        ctypes.memmove(self.dst, self.host, self.n)

    def clear_dst(self) -> None:
        ctypes.memset(self.dst, 0, self.n)

    def dst_matches(self) -> bool:
        """The first and last pages only: enough to catch a copy that did not happen, a
        wrong offset or a short length, without a second full pass over memory."""
        page = min(4096, self.n)
        return all(ctypes.string_at(self.dst + at, page) == ctypes.string_at(self.src + at, page)
                   for at in (0, self.n - page))

    def close(self) -> None:
        self.engine.free(self.src)
        self.engine.free(self.dst)
        del self._view   # the mapping cannot close while a ctypes view exports it
        self._map.close()


class CudaBuffers:
    """Two CUDA tensors from the installed engine and a pinned host tensor, ``n`` bytes.

    The peak copies are PyTorch's own ``copy_(non_blocking=True)`` with pinned memory:
    the best a program gets from the copy engines without pyalloc.
    """

    def __init__(self, torch: Any, n: int) -> None:
        self.torch, self.n = torch, n
        self.src_t = torch.full((n,), 0x5A, dtype=torch.uint8, device="cuda")
        self.dst_t = torch.zeros(n, dtype=torch.uint8, device="cuda")
        self.host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        self.src, self.dst = self.src_t.data_ptr(), self.dst_t.data_ptr()

    def peak_d2h(self) -> None:
        self.host.copy_(self.src_t, non_blocking=True)

    def peak_h2d(self) -> None:
        self.dst_t.copy_(self.host, non_blocking=True)

    def clear_dst(self) -> None:
        self.dst_t.zero_()

    def dst_matches(self) -> bool:
        return bool(self.torch.equal(self.src_t, self.dst_t))

    def close(self) -> None:
        del self.src_t, self.dst_t, self.host


def _timed(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    """Seconds from an idle device to ``fn``'s work being done. Engine and peak copies
    both go through this, so the fixed cost of a synchronize weighs on them alike."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def copy_worker(device: str, sizes_mib: List[int], reps: int) -> Dict[str, Any]:
    """Swap-out and swap-in bandwidth through the engine, and the peak copy, per size."""
    if device == "cuda":
        import pyalloc

        pyalloc.install(device="cuda")   # before anything touches CUDA
        import torch

        engine = pyalloc._engine(None)
        stream = torch.cuda.current_stream().cuda_stream
        name = torch.cuda.get_device_name()
        make = functools.partial(CudaBuffers, torch)
    else:
        from pyalloc import Engine

        engine = Engine("host")   # its own engine: nothing else allocates from it
        stream = 0                # stream 0 runs synchronously (sim_sync_stream0)
        name = sim_device_name()
        make = functools.partial(SimBuffers, engine)
    # One slot in flight at a time, released before the next; the slack covers rounding.
    engine.set_host_pool(max(sizes_mib) * MiB + MiB)
    rows = []
    for mib in sizes_mib:
        n = mib * MiB
        bufs = make(n)
        slot = 0

        def swap_out() -> None:
            nonlocal slot
            slot = engine.swap_out(bufs.src, n, stream)

        def swap_in() -> None:   # as the registry brings a tensor back: copy, then wait
            engine.swap_in(slot, bufs.dst, stream)
            engine.swap_wait(slot, stream)

        times: Dict[str, List[float]] = {"swap_out": [], "swap_in": [], "peak_d2h": [],
                                         "peak_h2d": []}
        verified = True
        for rep in range(reps + 1):   # round 0 faults the pages in and checks the bytes
            round_times = {"peak_d2h": _timed(bufs.peak_d2h, engine.synchronize),
                           "swap_out": _timed(swap_out, engine.synchronize)}
            bufs.clear_dst()
            round_times["swap_in"] = _timed(swap_in, engine.synchronize)
            if rep == 0:
                verified = bufs.dst_matches()
            engine.swap_release(slot)
            round_times["peak_h2d"] = _timed(bufs.peak_h2d, engine.synchronize)
            if rep > 0:
                for key, seconds in round_times.items():
                    times[key].append(seconds)
        bufs.close()
        gbps = {key: n / statistics.median(t) / 1e9 for key, t in times.items()}
        rows.append({"mib": mib, "bytes": n, "verified": verified, "gbps": gbps,
                     "seconds": times,
                     "out_over_peak": gbps["swap_out"] / gbps["peak_d2h"],
                     "in_over_peak": gbps["swap_in"] / gbps["peak_h2d"]})
    return {"part": "copy", "device": device, "device_name": name, "reps": reps,
            "statistic": "median", "rows": rows}


# --- part 2: step time under a budget, one configuration per process --------------------------
class PolicyWorker(Worker):
    """bench_remat's Worker (the model reset in place, the timed trial, the thrash limit)
    under any policy.

    ``Worker.__init__`` derives its policy from bench_remat's configurations (none, or
    recompute with a victim strategy) and installs pyalloc itself, which can happen once
    per process; so this sets up the same attributes with the policy given, and inherits
    everything else.
    """

    def __init__(self, task: str, policy: str, device: str, batch: int, host_pool: int = 0,
                 threads: int = 0) -> None:  # pylint: disable=super-init-not-called
        import pyalloc

        # host_pool 0 is pyalloc's own choice (as much as the device has, at most a quarter
        # of RAM): what a user who names only the policy gets.
        extra = {"host_pool": host_pool} if policy in SWAPPING and host_pool else {}
        self.device = pyalloc.install(device=device, policy=policy, **extra)
        import torch

        from pyalloc import registry
        from pyalloc.bench import models

        self.torch, self.pyalloc, self.registry = torch, pyalloc, registry
        self.task, self.blocks = models.TASKS[task], models.blocks
        self.config, self.batch = policy, batch   # config: no "checkpoint" wrapping
        self.engine = pyalloc._engine(None)
        self.dev = "cuda" if self.device == "cuda" else "cpu"
        torch.backends.cudnn.benchmark = False   # as in Worker: same kernels every policy
        if threads:
            torch.set_num_threads(threads)

    def counters(self) -> Dict[str, int]:
        stats = self.pyalloc.memory_stats()
        return {key: int(stats.get("remat." + key, 0)) for key in COUNTERS}


def step_worker(args: argparse.Namespace) -> Dict[str, Any]:
    """One trial: the baseline (policy none, unconstrained), or a policy at a budget."""
    w = PolicyWorker(args.task, args.policy, args.device, args.batch, args.host_pool,
                     args.threads)
    # Built now, outside the trial's thrash limit: GPT-2's initialisation alone takes
    # seconds, which are not a step's.
    w._model()
    out: Dict[str, Any] = {"task": args.task, "policy": args.policy, "batch": args.batch,
                           "steps": args.steps, "device": w.device}
    if args.policy == "none":
        w.time_limit = 600.0
        budget = args.capacity
    else:
        w.time_limit = max(10.0, 10 * args.steps * args.base_step)
        budget = int(args.fraction * args.peak)
        out.update(fraction=args.fraction, peak=args.peak)
    out["budget"] = budget
    before = w.counters()
    result = w.trial(budget, args.batch, args.steps, warmup=_warmup(args.steps))
    after = w.counters()
    out["result"] = result
    out["counters"] = {key: after[key] - before[key] for key in COUNTERS}
    if result is None:
        out["failed"] = w.last_failure
    elif args.policy == "none":
        out["peak"] = result["peak_reserved"]
    return out


# --- driver ------------------------------------------------------------------------------------
def spawn(args: List[str], label: str, ident: Optional[Dict[str, Any]] = None,
          timeout: float = 3600) -> Dict[str, Any]:
    """Runs this file as a worker with ``args``: its RESULT, or the error, after ``ident``
    (what the run was, so that a failed one still says so in the tables)."""
    cmd = [sys.executable, "-m", "pyalloc.bench.swap", "--worker", *args]
    print(label, flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:   # a hang (a copy never completing) is a finding too
        return {**(ident or {}), "error": f"{label}: no result after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if lines:
        return {**(ident or {}), **json.loads(lines[-1][len("RESULT "):])}
    return {**(ident or {}), "error": f"{label}: " + (proc.stderr or proc.stdout)[-2000:]}


def copy_table(copy: Dict[str, Any]) -> str:
    rows = ["| size | swap-out GB/s | peak D2H GB/s | out / peak | swap-in GB/s | "
            "peak H2D GB/s | in / peak | bytes back intact |",
            "|---|---|---|---|---|---|---|---|"]
    if "error" in copy:
        return "\n".join(rows + [f"| error: {copy['error'].splitlines()[-1][:100]} ||||||||"])
    for r in copy["rows"]:
        g = r["gbps"]
        rows.append(f"| {r['mib']} MiB | {g['swap_out']:.2f} | {g['peak_d2h']:.2f} | "
                    f"{r['out_over_peak']:.2f} | {g['swap_in']:.2f} | {g['peak_h2d']:.2f} | "
                    f"{r['in_over_peak']:.2f} | {'yes' if r['verified'] else 'NO'} |")
    return "\n".join(rows)


def _per_step(r: Dict[str, Any]) -> str:
    """The counter columns, per step; empty where the trial did not train (its counters
    stop wherever the failure struck, so per step they would mislead)."""
    c, steps = r["counters"], r["steps"]
    if not r.get("result"):
        return " | ".join(["—"] * 6)
    ready = f" ({c['prefetch_ready'] / steps:.0f} ready)" if c["prefetches"] else ""
    return " | ".join([
        f"{c['swap_outs'] / steps:.0f} / {c['swap_ins'] / steps:.0f}",
        f"{c['swap_out_bytes'] / steps / MiB:.1f}",
        f"{c['prefetches'] / steps:.0f}{ready}",
        f"{c['recomputes'] / steps:.0f}",
        f"{c['chose_swap'] / steps:.0f} / {c['chose_recompute'] / steps:.0f}"
        if r["policy"] == "hybrid" else "—",
        f"{c['swap_wait_ns'] / steps / 1e6:.1f}"])


def step_table(results: List[Dict[str, Any]]) -> str:
    rows = ["| model | policy | budget (of peak P) | step time (x baseline) | swap-outs / "
            "swap-ins per step | swapped out MiB per step | prefetches per step | recomputes "
            "per step | hybrid: chose swap / recompute per step | swap wait ms per step |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    bases = {r["task"]: r.get("result") for r in results if r["policy"] == "none"}
    for r in results:
        task, base = r["task"], bases.get(r["task"])
        if "error" in r:
            rows.append(f"| {task} | {r['policy']} | {r.get('fraction', '')} | "
                        f"error: {r['error'].splitlines()[-1][:80]} |||||||")
            continue
        if r["policy"] == "none":
            peak = f"P = {r['peak'] / MiB:.1f} MiB" if r.get("peak") else r.get("failed", "—")
            step = f"1.00x ({base['step_s'] * 1e3:.1f} ms)" if base else "—"
            rows.append(f"| {task} | none | unconstrained: {peak} | {step} |||||||")
            continue
        why = f" ({r['failed']})" if r.get("failed") else ""
        rows.append(f"| {task} | {r['policy']} | {r['fraction']:.2f} | "
                    f"{_ratio(r.get('result'), base)}{why} | {_per_step(r)} |")
    return "\n".join(rows)


def step_args(task: str, policy: str, args: argparse.Namespace, batch: int, steps: int,
              capacity: int) -> List[str]:
    return ["--part", "step", "--task", task, "--policy", policy, "--device", args.device,
            "--batch", str(batch), "--steps", str(steps), "--capacity", str(capacity),
            "--host-pool", str(args.host_pool), "--threads", str(args.threads)]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: the simulated device (default); cuda: a GPU")
    p.add_argument("--tasks", nargs="+", default=None,
                   help="models (pyalloc.bench.models.TASKS); default mlp cnn transformer on cpu, "
                        "cnn transformer resnet50 gpt2 on cuda")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--fractions", nargs="+", type=float, default=[0.9, 0.5, 0.3],
                   help="budgets, as fractions of the baseline's peak reserved bytes")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per trial, the first min(2, steps // 3) untimed (default 6; "
                        "3 with --quick)")
    p.add_argument("--batch", type=int, default=None, help="override every task's default batch")
    p.add_argument("--sizes", nargs="+", type=int, default=None,
                   help="copy sizes in MiB (default 4 16 64 256; 4 16 with --quick)")
    p.add_argument("--reps", type=int, default=None,
                   help="timed rounds per copy size (default 7; 3 with --quick)")
    p.add_argument("--host-pool", type=int, default=0,
                   help="host_pool bytes for swap/hybrid (default 0: pyalloc's own choice)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch's CPU threads in the step workers (default 1 on the simulated "
                        "device, torch's own choice on cuda; 0: torch's own choice)")
    p.add_argument("--skip-copy", action="store_true", help="only the step-time part")
    p.add_argument("--skip-steps", action="store_true", help="only the copy-throughput part")
    p.add_argument("--quick", action="store_true",
                   help="fewer copy sizes, rounds and steps: a smoke test, not figures")
    p.add_argument("--out", default=".", help="where bench_swap.json and .md go")
    # Worker mode (internal).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", choices=("copy", "step"), help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--policy", help=argparse.SUPPRESS)
    p.add_argument("--fraction", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--peak", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--base-step", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--capacity", type=int, default=3 << 30, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = args.steps or (3 if args.quick else 6)
    sizes = args.sizes or ([4, 16] if args.quick else [4, 16, 64, 256])
    reps = args.reps or (3 if args.quick else 7)
    if args.threads is None:
        # On the simulated device compute and the swap copies share the CPU: one thread
        # leaves the copy streams cores of their own, as a GPU's copy engines are not its
        # SMs. It also keeps the figures steady on a shared machine: two intra-op threads
        # against one busy neighbour made the same mlp step take 0.26 s or 1.3 s on the
        # 2-core dev VM; one thread, 0.29 to 0.30 s.
        args.threads = 1 if args.device == "cpu" else 0
    if args.worker:
        out = (copy_worker(args.device, sizes, reps) if args.part == "copy"
               else step_worker(args))
        print("RESULT " + json.dumps(out), flush=True)
        return 0

    from pyalloc.bench.models import TASKS

    tasks = args.tasks or DEFAULT_TASKS[args.device]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        p.error(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    capacity = CAPACITY[args.device]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    copy: Dict[str, Any] = {}
    if not args.skip_copy:
        copy = spawn(["--part", "copy", "--device", args.device, "--reps", str(reps),
                      "--sizes", *map(str, sizes)],
                     f"copy throughput: {', '.join(map(str, sizes))} MiB x {reps} rounds")
    results: List[Dict[str, Any]] = []

    def record(r: Dict[str, Any]) -> Dict[str, Any]:
        results.append(r)
        # Written after every run, so an interrupted benchmark keeps what it measured.
        (out_dir / "bench_swap.partial.json").write_text(
            json.dumps({"copy": copy, "steps": results}, indent=1))
        return r

    for task in tasks if not args.skip_steps else []:
        batch = args.batch or TASKS[task].default_batch
        base = record(spawn(step_args(task, "none", args, batch, steps, capacity),
                            f"{task}/baseline", {"task": task, "policy": "none"}))
        for policy in args.policies:
            for frac in args.fractions:
                label = f"{task}/{policy}@{frac}"
                ident = {"task": task, "policy": policy, "fraction": frac}
                if not base.get("peak"):   # no peak, no budget to scale
                    record({**ident, "error": f"{label}: skipped, the baseline did not train"})
                    continue
                record(spawn(step_args(task, policy, args, batch, steps, capacity)
                             + ["--fraction", str(frac), "--peak", str(base["peak"]),
                                "--base-step", str(base["result"]["step_s"])], label, ident))
    import torch

    name = copy.get("device_name")
    if not name and args.device == "cpu":   # the copy part was skipped, or failed
        name = sim_device_name()
    elif not name:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
    meta = {"device": args.device, "device_name": name,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "seconds": round(time.time() - started),
            "command": "python tools/bench_swap.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "steps": steps, "warmup_steps": _warmup(steps), "threads": args.threads,
            "copy_statistic": "median"}
    (out_dir / "bench_swap.json").write_text(
        json.dumps({"meta": meta, "copy": copy, "steps": results}, indent=1))
    md = [f"Device: {name} (PyTorch {meta['torch']}), {meta['date']}, {meta['seconds']} s. "
          f"Command: `{meta['command']}`. Training threads: {args.threads or 'default'}."]
    if copy:
        md += ["## Copy throughput (GB/s, median of rounds)", copy_table(copy)]
    if results:
        md += [f"## Step time under a budget ({steps} steps, {_warmup(steps)} warm-up)",
               step_table(results)]
    text = "\n\n".join(md) + "\n"
    (out_dir / "bench_swap.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
