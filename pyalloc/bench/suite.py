"""Head-to-head benchmark suite: PyTorch's own allocator against pyalloc's policies.

For each model, side by side in one run, each configuration in its own process (the
allocator is chosen once per process, before the first tensor):

  stock       on a GPU: PyTorch's native caching allocator, no pyalloc at all, capped with
              ``torch.cuda.set_per_process_memory_fraction(budget / total memory)``; on the
              simulated device: pyalloc with policy "none", its budget a hard cap
  expandable  (GPU only) stock with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
  checkpoint  stock + ``torch.utils.checkpoint`` (non-reentrant) around every block
  recompute, swap, hybrid   ``pyalloc.install(policy=...)``

Every configuration gets the same budget per model: P, the stock configuration's peak
reserved bytes at the task's default batch, measured first, unconstrained, in the stock
process. Figures per configuration, all under P:

  max batch   the largest batch that trains a timed trial of ``--steps`` steps (4 on the
              simulated device, 3 on a GPU): doubling from the default batch, then bisection
              to 1/8 of the default batch, up to ``--limit`` x the default (8 on the
              simulated device, 4 on a GPU; shown as "≥" when the cap itself trained);
              the answer must then train a second trial, or the search goes on below it. A
              trial fails when it runs out of memory, its loss is not finite, or it thrashes:
              takes more than 10x the stock configuration's unconstrained time for the same
              samples (plus 10 s, 20 s on a GPU, for start-up).
  samples/s   per-sample throughput, batch / the median step time of the timed steps (the
              first step untimed), at the max batch and at the default batch
  peak reserved and utilization (peak allocated / peak reserved) at the max batch, and
              pyalloc's evictions, recomputes and swapped-out bytes per step there

Ratios are against stock: max batch, samples/s at each configuration's own max batch, and
samples/s at the default batch. The issue's target for pyalloc: at least 3x stock's batch
at no less than 0.85x its per-sample throughput.

    pyalloc-bench                        # simulated device: cnn, transformer, unet
    pyalloc-bench --device cuda          # resnet50, gpt2, unet_gpu, all six configurations
    pyalloc-bench --quick --tasks cnn --configs stock recompute    # smoke test

(``python tools/bench_suite.py`` is the same program, from a checkout.) Writes
``bench_suite.json``, ``bench_suite.md`` and ``bench_suite.png`` into ``--out``; the
partial JSON is rewritten after every worker, so an interrupted run keeps what it measured.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from pyalloc.bench.trial import HostSnapshot, Training, device_sync, run_trial, task_training

CONFIGS = ("stock", "expandable", "checkpoint", "recompute", "swap", "hybrid")
CUDA_ONLY = ("expandable",)            # a setting of PyTorch's CUDA allocator
PYALLOC_POLICIES = ("recompute", "swap", "hybrid")
SWAPPING = ("swap", "hybrid")
DEFAULT_TASKS = {"cpu": ["cnn", "transformer", "unet"],
                 "cuda": ["resnet50", "gpt2", "unet_gpu"]}
# The "unconstrained" budget of pyalloc's engine, as in tools/bench_remat.py: below the
# simulated device's 4 GiB and an H100's 80 GB, so a runaway trial still fails cleanly.
CAPACITY = {"cpu": 3 << 30, "cuda": 70 << 30}
# Per-worker wall-clock limits (seconds); a worker past it is killed and its figures so far
# kept, with the timeout recorded as its error.
WORKER_TIMEOUT = {"cpu": 300, "cuda": 120}
# The whole suite's wall-clock limit (minutes): GPU time is scarce, so past it the remaining
# configurations are recorded as skipped rather than run. None: no limit.
SUITE_MINUTES = {"cpu": None, "cuda": 10.0}
# On a GPU the swapping policies get an explicit pool: pyalloc's default (a quarter of the
# host's RAM, pinned) would pin tens of GiB in every worker process.
GPU_HOST_POOL = 8 << 30
# cuBLAS keeps a workspace per handle, so per thread (forward and backward); the default
# size eats much of a small model's budget. Set for every GPU worker, pyalloc or not, so
# the comparison is fair (tests/test_gpu.py sets the same).
GPU_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
# How far the batch search goes (x the default batch) and the steps of a timed trial (the
# first untimed). On a GPU less of both: its time is scarce, and the target (3x)
# is within 4x.
SEARCH_LIMIT = {"cpu": 8, "cuda": 4}
TIMED_STEPS = {"cpu": 4, "cuda": 3}
THRASH_FACTOR = 10.0
MiB = 1 << 20


# --- the search, shared with tools/bench_remat.py ----------------------------------------------
def largest_batch(trains: Callable[[int], bool], start: int, limit: int,
                  resolution: Callable[[int], int]) -> int:
    """The largest batch for which ``trains(batch)`` holds: doubling from ``start`` (up to
    ``limit``, which is returned if it trains), then bisection until the gap between the
    largest that trained and the smallest that did not is at most ``resolution(good)``.
    If ``start`` itself fails, bisects below it (0: not even batch 1 trains)."""
    good, bad = 0, None
    n = start
    while bad is None:
        if not trains(n):
            bad = n
        elif n >= limit:
            return n
        else:
            good, n = n, min(2 * n, limit)
    while bad - good > max(1, resolution(good)):
        mid = (good + bad) // 2
        if trains(mid):
            good = mid
        else:
            bad = mid
    return good


def repeated_largest_batch(trains: Callable[[int], bool], again: Callable[[int], bool],
                           start: int, limit: int, resolution: Callable[[int], int]) -> int:
    """:func:`largest_batch`, with its answer trained a second time (``again``). Under
    eviction a batch at the edge of the budget can train once and fail the next time: the
    layout, and so the outcome, depends on what ran before and, with swapping, on when
    copies finish. An answer that does not repeat counts as failing, and the search goes
    on below it. Each batch is tried once by ``trains`` (results are kept). A repeat in the
    same process does not catch a dependence on the process's history (BENCHMARKS.md: the
    UNet under swap)."""
    seen: Dict[int, bool] = {}

    def probe(n: int) -> bool:
        if n not in seen:
            seen[n] = trains(n)
        return seen[n]

    best = largest_batch(probe, start, limit, resolution)
    while best and not again(best):
        seen[best] = False
        below = max((n for n, ok in seen.items() if ok and n < best), default=0)
        # From the largest batch below that trained (found again at once), or, if none
        # did, from the failed one itself: largest_batch then bisects below it.
        best = largest_batch(probe, below or best, best - 1, resolution)
    return best


# --- worker: one configuration, in its own process ---------------------------------------------
class PyallocMemory:
    """The budget and the figures through pyalloc's engine (any configuration on the
    simulated device; the pyalloc policies on a GPU)."""

    def __init__(self, pyalloc: Any) -> None:
        self.pyalloc, self.engine = pyalloc, pyalloc._engine(None)

    def cap(self, budget: int) -> None:
        self.engine.set_budget(budget)

    def reset(self) -> None:
        self.pyalloc.empty_cache()
        self.engine.reset_peak_stats()

    def peaks(self) -> Dict[str, int]:
        s = self.engine.stats()
        return {"peak_reserved": s["reserved_bytes.all.peak"],
                "peak_allocated": s["allocated_bytes.all.peak"]}

    def counters(self) -> Dict[str, int]:
        s = self.pyalloc.memory_stats()   # the engine's keys and the registry's "remat.*"
        return {"evictions": s["num_evictions"], "recomputes": s.get("remat.recomputes", 0),
                "swapped_bytes": s.get("remat.swap_out_bytes", 0)}


class CudaMemory:
    """The budget and the figures through PyTorch's own CUDA caching allocator: no pyalloc.

    The cap is ``set_per_process_memory_fraction``, which bounds what the allocator reserves
    from the device (its ``cudaMalloc``'d segments), as pyalloc's budget bounds reserved
    bytes."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.total = torch.cuda.get_device_properties(0).total_memory

    def cap(self, budget: int) -> None:
        self.torch.cuda.set_per_process_memory_fraction(min(1.0, budget / self.total))

    def reset(self) -> None:
        self.torch.cuda.empty_cache()
        self.torch.cuda.reset_peak_memory_stats()

    def peaks(self) -> Dict[str, int]:
        return {"peak_reserved": self.torch.cuda.max_memory_reserved(),
                "peak_allocated": self.torch.cuda.max_memory_allocated()}

    def counters(self) -> Dict[str, int]:
        return {"evictions": 0, "recomputes": 0, "swapped_bytes": 0}


class Trainer:
    """One task under one configuration: the model built once (GPT-2's initialisation alone
    takes seconds) and reset in place before every trial, and timed trials under a budget."""

    def __init__(self, task: str, config: str, device: str, batch: int, host_pool: int,
                 threads: int) -> None:
        uses_pyalloc = device == "cpu" or config in PYALLOC_POLICIES
        if uses_pyalloc:
            import pyalloc   # installs before torch allocates anything

            policy = config if config in PYALLOC_POLICIES else "none"
            extra = {"host_pool": host_pool} if config in SWAPPING and host_pool else {}
            pyalloc.install(device=device, policy=policy, **extra)
        import torch

        from pyalloc.bench import models

        self.torch, self.device = torch, device
        self.memory = PyallocMemory(pyalloc) if uses_pyalloc else CudaMemory(torch)
        self.task, self.config, self.batch = models.TASKS[task], config, batch
        self.dev = "cuda" if device == "cuda" else "cpu"
        if threads:
            torch.set_num_threads(threads)
        # The same kernels in every configuration and every trial.
        torch.backends.cudnn.benchmark = False
        torch.manual_seed(0)
        self.model = self.task.build().to(self.dev)
        self.initial = HostSnapshot(self.model)
        if config == "checkpoint":
            from torch.utils.checkpoint import checkpoint

            for block in models.blocks(self.model):
                block.forward = (lambda f: lambda *a: checkpoint(f, *a, use_reentrant=False))(
                    block.forward)
        self.time_limit: Callable[[int, int], float] = lambda batch, steps: 600.0
        self.last_failure: Optional[str] = None   # why the last trial did not train

    def device_name(self) -> str:
        if self.dev == "cuda":
            return self.torch.cuda.get_device_name(0)
        from pyalloc.bench.results import sim_device_name
        return sim_device_name()

    def trial(self, budget: int, batch: int, steps: int, timed_from: int = 1
              ) -> Optional[Dict[str, Any]]:
        """Trains ``steps`` steps of ``batch`` under ``budget``: the figures, or None when it
        runs out of memory, thrashes past ``time_limit`` or the loss is not finite."""
        gc.collect()
        self.memory.reset()
        self.memory.cap(budget)
        before = self.memory.counters()

        def setup() -> Training:
            self.initial.restore(self.model)
            self.model.zero_grad(set_to_none=True)
            opt = self.torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            return task_training(self.task, self.model, opt, batch, self.dev)

        result = run_trial(setup, steps, warmup=timed_from, sync=device_sync(self.dev),
                           limit_s=self.time_limit(batch, steps))
        self.last_failure = result.failure
        if not result.trained:
            return None
        after = self.memory.counters()
        step_s = result.step_s
        peaks = self.memory.peaks()
        return {"batch": batch, "steps": steps, "step_s": step_s,
                "samples_per_s": batch / step_s, **peaks,
                "utilization": peaks["peak_allocated"] / max(1, peaks["peak_reserved"]),
                **{f"{key}_per_step": (after[key] - before[key]) / steps for key in after}}


def worker_main(args: argparse.Namespace) -> None:
    """Measures one configuration; prints a ``RESULT`` line after every phase, so that a
    worker killed at its timeout still reports what it found."""
    t = Trainer(args.task, args.config, args.device, args.batch, args.host_pool, args.threads)
    out: Dict[str, Any] = {"task": args.task, "config": args.config, "device": args.device,
                           "device_name": t.device_name(), "default_batch": args.batch}

    def report(**figures: Any) -> None:
        out.update(figures)
        print("RESULT " + json.dumps(out), flush=True)

    capacity = CAPACITY[args.device]
    # Unconstrained first: the budget P (stock's), the reference time, and a warm start
    # (cuDNN and cuBLAS handles, the shim, first-touch page faults) outside any time limit.
    free = t.trial(capacity, args.batch, args.steps)
    report(unconstrained=free)
    budget = args.budget or (free and free["peak_reserved"])
    if not budget:
        raise SystemExit("the unconstrained run did not train: no budget to measure under")
    per_sample = args.base_step or (free["step_s"] / args.batch if free else None)
    if per_sample:
        floor = 20.0 if args.device == "cuda" else 10.0   # start-up of a new batch size
        t.time_limit = lambda batch, steps: floor + THRASH_FACTOR * per_sample * batch * steps
    report(budget=budget, base_sample_s=per_sample)
    limit = args.limit * args.batch
    probes: List[Dict[str, Any]] = []
    trained: Dict[int, Dict[str, Any]] = {}

    # Every probe is a full timed trial: a batch at the edge of the budget can train two
    # steps and run out of memory in the fourth (the transformer under recompute on the
    # simulated device did), so a shorter probe would overstate the max batch. The trials
    # that trained give the figures at the default and the max batch.
    def trains(batch: int) -> bool:
        result = t.trial(budget, batch, args.steps)
        if result:
            trained[batch] = result
        probes.append({"batch": batch, "trains": bool(result),
                       **({} if result else {"why": t.last_failure})})
        # The best so far after every probe: a worker stopped at its timeout still gives a
        # lower bound (the search never returns other than the largest batch that trained).
        best = max(trained, default=0)
        report(probes=probes, max_batch=best, capped=best >= limit, search_done=False,
               at_default=trained.get(args.batch), at_max=trained.get(best))
        return bool(result)

    def again(batch: int) -> bool:
        result = t.trial(budget, batch, args.steps)
        probes.append({"batch": batch, "trains": bool(result), "repeat": True,
                       **({} if result else {"why": t.last_failure})})
        if not result:
            trained.pop(batch, None)
        best = max(trained, default=0)
        report(probes=probes, max_batch=best, capped=best >= limit,
               at_max=trained.get(best))
        return bool(result)

    best = repeated_largest_batch(trains, again, args.batch, limit,
                                  lambda good: max(1, args.batch // args.resolution))
    assert best == out["max_batch"], (best, out["max_batch"])
    report(search_done=True)


# --- driver ------------------------------------------------------------------------------------
def worker_env(device: str, config: str) -> Dict[str, str]:
    env = dict(os.environ)
    # A reproducible setting per configuration, whatever the caller's shell holds.
    env.pop("PYALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["PYTHONUNBUFFERED"] = "1"
    # The worker runs ``python -m pyalloc.bench.suite``: this pyalloc, wherever it is.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    if device == "cuda":
        env.update(GPU_ENV)
        if config == "expandable":   # read when torch's allocator starts: before the import
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def run_worker(worker_args: List[str], device: str, config: str, timeout: float,
               ident: Dict[str, Any]) -> Dict[str, Any]:
    """Runs one worker; its last RESULT (with ``error`` added if it failed or timed out), or
    the error alone. Never raises: one failing configuration must not end the suite."""
    # faulthandler: a worker that crashes in native code still says where, on stderr.
    cmd = [sys.executable, "-X", "faulthandler", "-m", "pyalloc.bench.suite", "--worker",
           *worker_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=worker_env(device, config))
    error = None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            stderr = (stderr or "").strip()
            # A crash: faulthandler's report starts with the thread that crashed; else the
            # traceback's end says what failed.
            fatal = stderr.find("Fatal Python error")
            error = f"exit status {proc.returncode}: " + (
                stderr[fatal:fatal + 4000] if fatal >= 0 else stderr[-2000:])
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        error = f"timed out after {timeout:.0f} s (figures found until then kept)"
    results = [line for line in (stdout or "").splitlines() if line.startswith("RESULT ")]
    result = {**ident, **json.loads(results[-1][len("RESULT "):])} if results else dict(ident)
    if error:
        result["error"] = error
    return result


def _mib(n: Optional[float]) -> str:
    return f"{n / MiB:.0f}" if n is not None else "—"


def _ratio(value: Optional[float], base: Optional[float]) -> str:
    return f"{value / base:.2f}x" if value and base else "—"


def summarize(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per row, the ratios against the same model's stock row (None where either is missing)."""
    stock = {r["task"]: r for r in results if r["config"] == "stock"}
    rows = []
    for r in results:
        base = stock.get(r["task"], {})
        at_max, at_default = r.get("at_max") or {}, r.get("at_default") or {}
        base_max, base_default = base.get("at_max") or {}, base.get("at_default") or {}

        def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
            return a / b if a and b else None

        row = {"task": r["task"], "config": r["config"],
               "max_batch_x": ratio(r.get("max_batch"), base.get("max_batch")),
               "samples_per_s_at_max_x": ratio(at_max.get("samples_per_s"),
                                               base_max.get("samples_per_s")),
               "samples_per_s_at_default_x": ratio(at_default.get("samples_per_s"),
                                                   base_default.get("samples_per_s"))}
        if r["config"] in PYALLOC_POLICIES:   # the target: >= 3x batch at >= 0.85x
            row["meets_target"] = bool(row["max_batch_x"] and row["max_batch_x"] >= 3
                                       and row["samples_per_s_at_max_x"]
                                       and row["samples_per_s_at_max_x"] >= 0.85)
        rows.append(row)
    return rows


def table(results: List[Dict[str, Any]], ratios: List[Dict[str, Any]]) -> str:
    lines = ["| model | config | max batch under P (x stock) | samples/s at max batch (x stock) "
             "| samples/s at default batch (x stock) | peak reserved MiB at max | utilization "
             "| evictions / recomputes per step | swapped MiB per step | target: ≥3x batch at "
             "≥0.85x samples/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r, q in zip(results, ratios):
        head = f"| {r['task']} | {r['config']} |"
        if "max_batch" not in r:
            why = r.get("error", "no result").strip().splitlines()[0][:100].replace("|", "/")
            lines.append(f"{head} error: {why} ||||||||")
            continue
        at_max, at_default = r.get("at_max") or {}, r.get("at_default") or {}
        capped = "≥" if r.get("capped") or not r.get("search_done") else ""
        batch = f"{capped}{r['max_batch']}" + (
            f" ({capped}{q['max_batch_x']:.2f}x)" if q["max_batch_x"] else "")

        def speed(trial: Dict[str, Any], ratio: Optional[float]) -> str:
            if not trial:
                return "—"
            return f"{trial['samples_per_s']:.1f}" + (f" ({ratio:.2f}x)" if ratio else "")

        counts = (f"{at_max['evictions_per_step']:.0f} / {at_max['recomputes_per_step']:.0f}"
                  if at_max else "—")
        swapped = f"{at_max['swapped_bytes_per_step'] / MiB:.1f}" if at_max else "—"
        target = {True: "yes", False: "**no**"}.get(q.get("meets_target"), "")
        timed_out = ("" if not r.get("error") else " (search cut short: timed out)"
                     if "timed out" in r["error"] else " (search cut short: the worker failed)")
        lines.append(f"{head} {batch}{timed_out} | {speed(at_max, q['samples_per_s_at_max_x'])} | "
                     f"{speed(at_default, q['samples_per_s_at_default_x'])} | "
                     f"{_mib(at_max.get('peak_reserved'))} | "
                     f"{at_max['utilization']:.2f} | " if at_max else
                     f"{head} {batch}{timed_out} | — | "
                     f"{speed(at_default, q['samples_per_s_at_default_x'])} | — | — | ")
        lines[-1] += f"{counts} | {swapped} | {target} |"
    return "\n".join(lines)


def budgets_line(results: List[Dict[str, Any]]) -> str:
    parts = [f"{r['task']} P = {_mib(r['budget'])} MiB at batch {r['default_batch']}"
             for r in results if r["config"] == "stock" and r.get("budget")]
    return "Budgets (stock's unconstrained peak reserved at the default batch): " + (
        "; ".join(parts) or "none measured") + "."


def plot(results: List[Dict[str, Any]], path: Path) -> None:
    """One row per model: max batch per configuration, and samples/s per configuration at
    its max batch and at the default batch (bars; missing figures are left out)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in results))
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.2 * len(tasks)), squeeze=False)
    for (batch_ax, speed_ax), task in zip(axes, tasks):
        rows = [r for r in results if r["task"] == task]
        names = [r["config"] for r in rows]
        xs = range(len(rows))
        batch_ax.bar(xs, [r.get("max_batch") or 0 for r in rows], color="tab:blue")
        budget = next((r["budget"] for r in rows if r.get("budget")), None)
        batch_ax.set_title(f"{task}: largest batch under P = {_mib(budget)} MiB")
        speed_ax.bar([x - 0.2 for x in xs],
                     [(r.get("at_max") or {}).get("samples_per_s", 0) for r in rows],
                     width=0.4, label="at max batch", color="tab:green")
        speed_ax.bar([x + 0.2 for x in xs],
                     [(r.get("at_default") or {}).get("samples_per_s", 0) for r in rows],
                     width=0.4, label="at default batch", color="tab:gray")
        speed_ax.set_title(f"{task}: samples/s under P")
        speed_ax.legend(fontsize="small")
        for ax in (batch_ax, speed_ax):
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    from pyalloc.bench.models import TASKS

    p = argparse.ArgumentParser(prog="pyalloc-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: the simulated device (default); cuda: a GPU")
    p.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                   help=f"models, of {', '.join(TASKS)} (default: "
                        f"{' '.join(DEFAULT_TASKS['cpu'])} on cpu, "
                        f"{' '.join(DEFAULT_TASKS['cuda'])} on cuda)")
    p.add_argument("--configs", nargs="+", default=None, metavar="CONFIG",
                   help=f"of {', '.join(CONFIGS)} (default: all the device has; stock always "
                        "runs, first: it sets the budget)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test, not figures: search up to 2x, timed trials of 2 steps")
    p.add_argument("--batch", type=int, default=None, help="override every task's default batch")
    p.add_argument("--limit", type=int, default=None,
                   help="search the batch up to this multiple of the default (default 8 on "
                        "cpu, 4 on cuda; 2 with --quick)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per timed trial, the first untimed (default 4 on cpu, 3 on "
                        "cuda; 2 with --quick)")
    p.add_argument("--host-pool", type=int, default=None,
                   help="host_pool bytes for swap and hybrid (default: 8 GiB on cuda, "
                        "pyalloc's own choice on the simulated device)")
    p.add_argument("--worker-timeout", type=float, default=None,
                   help="seconds per configuration before it is stopped and recorded as an "
                        "error (default 300 on cpu, 120 on cuda)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="the whole suite's limit: configurations not started by then are "
                        "recorded as skipped (default 10 on cuda, none on cpu)")
    p.add_argument("--out", default="bench-suite-out",
                   help="where bench_suite.json, .md and .png go (default bench-suite-out)")
    # Worker mode (internal).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--base-step", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--resolution", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    args.tasks = args.tasks or DEFAULT_TASKS[args.device]
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        p.error(f"unknown task(s): {', '.join(unknown)}; known: {', '.join(TASKS)}")
    configs = args.configs or [c for c in CONFIGS
                               if args.device == "cuda" or c not in CUDA_ONLY]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s): {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    cuda_only = [c for c in configs if c in CUDA_ONLY and args.device != "cuda"]
    if cuda_only:
        p.error(f"{', '.join(cuda_only)}: a setting of PyTorch's CUDA caching allocator, which "
                "the simulated device does not have; use --device cuda, or leave it out")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            p.error("--device cuda, but PyTorch sees no CUDA GPU (torch.cuda.is_available() is "
                    "False); leave --device out for the simulated device")
    # stock first: its process measures the budget every other configuration runs under.
    args.configs = ["stock"] + [c for c in dict.fromkeys(configs) if c != "stock"]
    args.limit = args.limit or (2 if args.quick else SEARCH_LIMIT[args.device])
    args.steps = args.steps or (2 if args.quick else TIMED_STEPS[args.device])
    if args.host_pool is None:
        args.host_pool = GPU_HOST_POOL if args.device == "cuda" else 0
    args.worker_timeout = args.worker_timeout or WORKER_TIMEOUT[args.device]
    args.max_minutes = args.max_minutes or SUITE_MINUTES[args.device]
    for name in ("batch", "limit", "steps"):
        value = getattr(args, name)
        if value is not None and value < (2 if name == "steps" else 1):
            p.error(f"--{name} must be at least {2 if name == 'steps' else 1}, got {value}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0

    from tqdm import tqdm

    from pyalloc.bench.results import write_results
    from pyalloc.bench.models import TASKS

    started = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: List[Dict[str, Any]] = []
    # One intra-op thread on the simulated device, as in tools/bench_swap.py: the swap
    # copies get the other core (a GPU's copy engines are not its SMs), and the figures
    # stay steady on a shared machine. On a GPU, torch's own choice.
    threads = 1 if args.device == "cpu" else 0
    jobs = [(task, config) for task in args.tasks for config in args.configs]
    with tqdm(jobs, unit="config", file=sys.stderr) as bar:
        stock: Dict[str, Dict[str, Any]] = {}
        for task, config in bar:
            bar.set_description(f"{task}/{config}")
            batch = args.batch or TASKS[task].default_batch
            ident = {"task": task, "config": config, "default_batch": batch}
            worker_args = ["--task", task, "--config", config, "--device", args.device,
                           "--batch", str(batch), "--steps", str(args.steps),
                           "--limit", str(args.limit), "--host-pool", str(args.host_pool),
                           "--threads", str(threads)]
            left = (started + 60 * args.max_minutes - time.time() if args.max_minutes
                    else args.worker_timeout)
            if left < 15:
                results.append({**ident, "error": "skipped: the suite's --max-minutes were spent"})
                continue
            if config != "stock":
                base = stock.get(task, {})
                if not base.get("budget") or not base.get("base_sample_s"):
                    results.append({**ident, "error": "skipped: stock did not measure a budget"})
                    continue
                worker_args += ["--budget", str(base["budget"]),
                                "--base-step", str(base["base_sample_s"])]
            result = run_worker(worker_args, args.device, config,
                                min(args.worker_timeout, left), ident)
            if config == "stock":
                stock[task] = result
            results.append(result)
            # Rewritten after every worker, so an interrupted suite keeps what it measured.
            (out / "bench_suite.partial.json").write_text(json.dumps(results, indent=1))
    device_name = next((r["device_name"] for r in results if r.get("device_name")), args.device)
    ratios = summarize(results)
    program = ("python tools/bench_suite.py" if Path(sys.argv[0]).name == "bench_suite.py"
               else "pyalloc-bench")
    text = (f"{budgets_line(results)} Search up to {args.limit}x the default batch; timed "
            f"trials of {args.steps} steps, the first untimed; "
            f"{'one CPU thread' if threads == 1 else 'torch threads by default'}.\n\n"
            + table(results, ratios))
    write_results(str(out), "bench_suite", device_name, started, argv, {
        "settings": {k: getattr(args, k) for k in ("device", "tasks", "configs", "quick",
                                                   "batch", "limit", "steps", "host_pool",
                                                   "worker_timeout", "max_minutes")},
        "results": results, "ratios": ratios}, text, program=program)
    plot(results, out / "bench_suite.png")
    (out / "bench_suite.partial.json").unlink(missing_ok=True)
    print(f"wrote {out / 'bench_suite.json'}, .md and .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
