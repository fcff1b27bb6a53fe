#!/usr/bin/env python3
"""Fragmentation benchmark: how much of the reserved memory holds data, and which requests
fail although the free memory would hold them.

Workloads, each replayed through a fresh simulated-device engine (pyalloc.replay):

  patterns    pyalloc.bench.patterns: growing_batches, interleaved, mixed_sizes, checkerboard,
              each under a budget of 1.25x its peak live bytes (checkerboard: 1.0x), with
              ``--seeds`` seeds; and under a loose budget (4 GiB) through the default,
              ``expandable``, both layout options and the models of PyTorch.
  models      traces recorded from pyalloc.bench.models' tasks on the simulated device (3 training
              steps, SGD with momentum, recorded with pyalloc.record_trace in a process of
              their own), replayed under the live run's options, under budgets of
              1.10x, 1.02x and 1.00x the replay's peak allocated bytes (rounded up to
              2 MiB), and under the least budget, in whole 2 MiB chunks up to 1.5x,
              that serves every request ("least budget with no failure": its
              utilization is what fragmentation costs, whatever the cache would hold).

Figures per workload and configuration:

  utilization       peak allocated / peak reserved (docs/stats.md)
  live/reserved     the trace's own peak of live requested bytes / peak reserved: the same
                    numerator for every configuration (allocated bytes are block sizes,
                    and configurations round and split blocks differently)
  ext. frag.        1 - largest free block / cached free bytes, at the end of the replay
  failures          requests the replay could not serve
  covered           of those, the ones the free memory would have held: whole free 2 MiB
                    chunks plus the unreserved budget (pyalloc.replay.free_chunk_bytes).
                    These are the failures of placement alone, what VMM stitching serves.

Configurations: ``best-fit`` (option ``stitch:false``), ``+ stitching`` (the default:
free 2 MiB chunks of several segments mapped into one range when no block holds a request
and the budget is spent), ``+ stitching first`` (option ``stitch_first``: stitch before
mapping more memory whenever free chunks cover the request, and grow by segments of the
request's size), ``+ stitching, expandable`` (option ``expandable``: the large pool is
one segment that grows by 2 MiB chunks at its end) and both (``+ stitching first,
expandable``). PyTorch's own allocator cannot run without a GPU, so ``pytorch (model)`` and
``pytorch + expandable (model)`` replay every workload through a model of its policy,
with and without ``expandable_segments`` (pyalloc/bench/native_model.py; checked against what
PyTorch did on an H100). The model traces also run ``+ stitching, lifetime classes off`` (option
``lifetime_classes:false``: small blocks placed by size alone, not by the training phase the
trace records; the patterns have no phases). Fragment-aware eviction needs a registry and a
model, so it is measured by bench_remat.py.

Compaction (rung compact: live storages moved device to device to open a hole) needs a registry
too, so it is measured by training, not by replay: ``inplace_mlp`` (pyalloc.bench.models; every
third activation frozen, so eviction cannot free it) trains 3 steps under
``policy="recompute"`` at budgets from 0.70 down to 0.30 of its unconstrained peak, with
``compact`` on and off, each run in a process of its own. Reported per run: whether it
trained, its final loss against the unconstrained run's (bit for bit), compaction rounds,
storages moved and their MiB; and per configuration the smallest budget that trained.
``--skip-compaction`` leaves it out.

Training (not a replay: the parameters, made after ``install()``, are in the pool too):
each task trains 3 steps, with SGD (momentum) and with Adam (``foreach``, the
implementation PyTorch picks on CUDA: its temporaries are made inside the step, so they
are long-lived requests), under each of ``TRAINING_CONFIGS`` (the defaults, lifetime
classes off, ``expandable``, ``stitch_first``, both), under a loose budget (peak
reserved) and at the least budget in whole 2 MiB chunks up from its peak allocated bytes
that trains all 3 steps. ``--skip-training`` leaves it out.

On a GPU (``--device cuda``) the model traces are recorded on the GPU, and every workload
is replayed, each configuration in a process of its own, through:

  pytorch               PyTorch's native caching allocator (torch.empty / del per event),
                        capped at the budget with set_per_process_memory_fraction
  pytorch + expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  pytorch (model), pytorch + expandable (model)
                        the model of those two (pyalloc/bench/native_model.py), on the same
                        traces: the GPU checks the model the simulated device relies on
  pyalloc best-fit      pyalloc's CUDA backend, stitching off
  pyalloc + stitching   pyalloc's CUDA backend (real VMM mappings; nothing is written)
  pyalloc + stitching first   the same with option stitch_first
  pyalloc + stitching, expandable   the same with option expandable
  pyalloc + stitching first, expandable   with both

Each allocator counts its own "allocated" bytes (rounding differs), so the GPU table also
gives ``live/reserved``: the trace's own peak of live requested bytes over the
allocator's peak reserved bytes, the same numerator for all.

    python tools/bench_frag.py                 # patterns and model traces, simulated device
    python tools/bench_frag.py --skip-models   # patterns only (seconds)
    python tools/bench_frag.py --device cuda --tasks cnn transformer resnet50 gpt2
    python tools/bench_frag.py --tasks gpt2 --batch 2 --sim-capacity 8GiB --skip-compaction \
        --skip-training

Writes ``bench_frag.json`` and ``bench_frag.md`` into ``--out`` and prints the table; the
recorded model traces are kept in ``--out``/traces/TASK.json.gz.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

from pyalloc.bench import native_model
from pyalloc.bench.results import write_results
from pyalloc import files
from pyalloc.bench.patterns import PATTERNS
from pyalloc.bench.trial import Training, run_steps, run_trial, task_training
from pyalloc.replay import replay

CHUNK = 2 << 20   # the mapping granularity: budgets are whole chunks


def whole_chunks(nbytes: float) -> int:
    """``nbytes`` rounded up to whole chunks."""
    return -(-int(nbytes) // CHUNK) * CHUNK


CONFIGS = {"best-fit": {"stitch": "false"}, "+ stitching": {},
           "+ stitching first": {"stitch_first": "true"},
           "+ stitching, expandable": {"expandable": "true"},
           "+ stitching first, expandable": {"stitch_first": "true", "expandable": "true"}}
# The patterns also run under a budget that never binds, through these (and the models).
LOOSE_BUDGET = 4 << 30
LOOSE_CONFIGS = {name: CONFIGS[name] for name in
                 ("+ stitching", "+ stitching, expandable", "+ stitching first, expandable")}
# The recorded traces carry the training phases (pyalloc.lifetime); the patterns do not,
# so lifetime classes can only matter on the traces.
MODEL_CONFIGS = {**CONFIGS, "+ stitching, lifetime classes off": {"lifetime_classes": "false"}}


# PyTorch's own allocator, modelled (pyalloc/bench/native_model.py): the comparison the GPU run
# makes with the real one, on the simulated device. Name -> expandable_segments.
NATIVE_MODELS = {"pytorch (model)": False, "pytorch + expandable (model)": True}


def replay_native_model(trace: Dict[str, Any], budget: Optional[int],
                        expandable: bool) -> SimpleNamespace:
    """``trace`` through the model of PyTorch's allocator, figures named as pyalloc's."""
    return SimpleNamespace(**native_model.replay(trace, budget, expandable))


def runners(trace: Dict[str, Any], configs: Dict[str, Dict[str, Any]],
            extra: Optional[Dict[str, Any]] = None) -> Dict[str, Callable[..., Any]]:
    """Configuration name -> ``run(budget=None)``: ``trace`` replayed under ``budget`` bytes
    (None: the trace's own) through each of pyalloc's ``configs`` (with the ``extra``
    options) and through the models of PyTorch's allocator (NATIVE_MODELS)."""
    out: Dict[str, Callable[..., Any]] = {}
    for name, overrides in configs.items():
        def run(budget: Optional[int] = None,
                options: Dict[str, Any] = {**overrides, **(extra or {})}) -> Any:
            return replay(trace, options if budget is None else {**options, "budget": budget})
        out[name] = run
    for name, expandable in NATIVE_MODELS.items():
        def run_model(budget: Optional[int] = None, expandable: bool = expandable) -> Any:
            return replay_native_model(trace, trace["budget_bytes"] if budget is None else budget,
                                       expandable)
        out[name] = run_model
    return out


def tightest_budget(run: Callable[[int], Any], peak: int, most: float = 1.5) -> Optional[Any]:
    """``run(budget)``'s replay under the smallest budget, in whole chunks from ``peak`` up
    to ``most`` x ``peak``, that serves every request; None if none up to there does."""
    budget = whole_chunks(peak)
    while budget <= most * peak:
        result = run(budget)
        if result.failures == 0:
            return result
        budget += CHUNK
    return None


# The optimizers the training runs use, over the model's parameters.
OPTIMIZERS: Dict[str, Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "Adam (foreach)": lambda params: torch.optim.Adam(params, lr=1e-3, foreach=True)}
STEPS = 3   # of every recorded and trained run


def installed_training(job: Dict[str, Any]) -> Training:
    """Installs pyalloc as ``job`` says (device, budget, options), then builds its task's
    model, optimizer and batch: the start of a worker process (install() is once per
    process, and the parameters must be made after it, in the pool)."""
    import pyalloc

    pyalloc.install(device=job["device"], budget=job["budget"], **job["options"])
    from pyalloc.bench.models import TASKS

    torch.manual_seed(0)
    dev = "cuda" if job["device"] == "cuda" else "cpu"
    task = TASKS[job["task"]]
    model = task.build().to(dev)
    optimizer = OPTIMIZERS[job.get("optimizer", "SGD")](model.parameters())
    return task_training(task, model, optimizer, job["batch"] or task.default_batch, dev)


def record_worker(job: Dict[str, Any]) -> None:
    """Trains ``job``'s task STEPS steps, recording the trace into ``job["path"]``."""
    import pyalloc

    training = installed_training(job)
    with pyalloc.record_trace(job["path"]):
        run_steps(training, STEPS)


def trial_worker(job: Dict[str, Any]) -> Dict[str, Any]:
    """Trains ``job``'s task STEPS steps: whether it trained, its last loss (bit for bit)
    and the allocator's figures. Used by the compaction runs and the training runs."""
    import pyalloc

    training = installed_training(job)
    last: List[float] = []

    def read_last_loss(index: int, loss: torch.Tensor) -> None:
        if index == STEPS - 1:   # a scalar, read once: no allocation, nothing recomputed
            last.append(loss.item())

    result = run_trial(training, STEPS, check_finite=False, clear_after=False,
                       after_step=read_last_loss)
    s = pyalloc.memory_stats()
    return {"trained": result.trained, "loss": last[0].hex() if result.trained else None,
            "peak": s["reserved_bytes.all.peak"], "peak_allocated": s["allocated_bytes.all.peak"],
            "compactions": s["num_compactions"], "relocations": s["num_relocations"],
            "relocated": s["num_relocated_bytes"], "evictions": s["num_evictions"]}


def trial(task: str, device: str, budget: Any, options: Dict[str, Any],
          batch: Optional[int] = None, optimizer: str = "SGD") -> Dict[str, Any]:
    """:func:`trial_worker` in a process of its own."""
    job = {"task": task, "device": device, "budget": budget, "options": options,
           "batch": batch, "optimizer": optimizer}
    proc = subprocess.run([sys.executable, "-m", "pyalloc.bench.frag", "--trial", json.dumps(job)],
                          capture_output=True, text=True)
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise RuntimeError(f"training trial failed:\n{(proc.stderr or proc.stdout)[-3000:]}")
    return json.loads(found[-1][len("RESULT "):])


def compaction_runs(task: str, device: str) -> Dict[str, Any]:
    """The unconstrained run, then recompute with compaction on and off at falling budgets."""
    free = trial(task, device, "90%" if device == "cuda" else "2GiB", {})
    runs = []
    for tenths in range(70, 25, -5):
        fraction = tenths / 100
        for compact in (True, False):
            budget = int(fraction * free["peak"])
            r = trial(task, device, budget, {"policy": "recompute", "compact": compact})
            runs.append({"fraction": fraction, "compact": compact, "budget": budget, **r,
                         "identical": r["trained"] and r["loss"] == free["loss"]})
    smallest = {}
    for compact in (True, False):
        ok = [r["fraction"] for r in runs if r["compact"] == compact and r["trained"]]
        smallest["on" if compact else "off"] = min(ok) if ok else None
    return {"task": task, "unconstrained": free, "runs": runs, "smallest": smallest}


# The configurations the training runs compare (options over the defaults).
TRAINING_CONFIGS = {"default": {}, "lifetime classes off": {"lifetime_classes": "false"},
                    "expandable": {"expandable": "true"},
                    "stitching first": {"stitch_first": "true"},
                    "stitching first, expandable": {"stitch_first": "true", "expandable": "true"}}


def training_runs(tasks: List[str], device: str, batch: Optional[int] = None,
                  sim_capacity: Optional[str] = None) -> List[Dict[str, Any]]:
    """Each task trained under each of TRAINING_CONFIGS: peak reserved under a loose
    budget, and the least budget, in whole 2 MiB chunks up from the peak allocated bytes
    (at most 1.25x; least_chunks), that trains all 3 steps. Training, not a replay: the
    parameters are in the pool too, made after install() as the docs ask."""
    loose = "90%" if device == "cuda" else (sim_capacity or "2GiB")
    extra = {"sim_capacity": sim_capacity} if device == "cpu" and sim_capacity else {}
    rows = []
    for task, optimizer, config in itertools.product(tasks, OPTIMIZERS, TRAINING_CONFIGS):
        options = {**TRAINING_CONFIGS[config], **extra}
        free = trial(task, device, loose, options, batch, optimizer)
        if not free["trained"]:
            raise RuntimeError(f"{task} does not train under the loose budget {loose}")
        least = least_chunks(
            lambda budget: trial(task, device, budget, options, batch, optimizer)["trained"],
            whole_chunks(free["peak_allocated"]), 1.25 * free["peak_allocated"])
        rows.append({"task": task, "optimizer": optimizer, "config": config,
                     "peak_allocated": free["peak_allocated"], "loose_peak": free["peak"],
                     "least_budget": least})
    return rows


def least_chunks(trains: Callable[[int], bool], start: int, most: float) -> Optional[int]:
    """The least budget in whole chunks from ``start`` up to ``most`` for which ``trains``
    holds (None if none does): start, then 1, 2, 4, ... chunks more until one trains, then
    bisection between the last that failed and it. Where the least is a few chunks above
    the start (the simulated device) it tries what a walk chunk by chunk would; where it
    is hundreds of chunks above (GPT-2 on a GPU: 2 MiB chunks of 10 GiB) it tries tens of
    budgets, not hundreds. Assumes more memory never hurts, as any search short of every
    budget must."""
    top = int(most) // CHUNK * CHUNK   # the largest budget in whole chunks up to `most`
    if start > top:
        return None
    failed, step, budget = None, 1, start
    while not trains(budget):
        failed = budget
        if budget >= top:
            return None
        budget = min(start + step * CHUNK, top)
        step *= 2
    while failed is not None and budget - failed > CHUNK:
        middle = failed + (budget - failed) // CHUNK // 2 * CHUNK
        if trains(middle):
            budget = middle
        else:
            failed = middle
    return budget


def training_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["Training 3 steps (parameters in the pool).", "",
             "| task | optimizer | configuration | peak allocated MiB | loose budget: peak "
             "reserved MiB (utilization) | least budget that trains MiB (utilization) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        least = r["least_budget"]
        lines.append(
            f"| {r['task']} | {r['optimizer']} | {r['config']} | "
            f"{r['peak_allocated'] / 2**20:.1f} | {r['loose_peak'] / 2**20:.0f} "
            f"({r['peak_allocated'] / r['loose_peak']:.3f}) | "
            + ("over 1.25x |" if least is None else
               f"{least / 2**20:.0f} ({r['peak_allocated'] / least:.3f}) |"))
    return "\n".join(lines)


def compaction_table(result: Dict[str, Any]) -> str:
    def frac(f: Optional[float]) -> str:
        return "—" if f is None else f"{f:.2f}"
    lines = [f"Compaction: `{result['task']}` under `policy=\"recompute\"`, 3 steps; unconstrained "
             f"peak {result['unconstrained']['peak'] / 2**20:.1f} MiB. Smallest budget that "
             f"trained: {frac(result['smallest']['on'])} of the peak with compaction, "
             f"{frac(result['smallest']['off'])} without.", "",
             "| budget (of peak) | compact | trained | loss = unconstrained | compactions | "
             "storages moved | MiB moved | evictions |", "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        lines.append(f"| {r['fraction']:.2f} | {'on' if r['compact'] else 'off'} | "
                     f"{'yes' if r['trained'] else 'OOM'} | "
                     f"{('yes' if r['identical'] else 'NO') if r['trained'] else '—'} | "
                     f"{r['compactions']} | {r['relocations']} | "
                     f"{r['relocated'] / 2**20:.1f} | {r['evictions']} |")
    return "\n".join(lines)


def live_over_reserved(live: int, reserved: int) -> float:
    """The trace's peak of live requested bytes over an allocator's peak reserved bytes."""
    return live / reserved if reserved else 1.0


def row(workload: str, config: str, result: Any, live: int) -> Dict[str, Any]:
    """One table row; ``live`` is the trace's peak of live requested bytes."""
    return {"workload": workload, "config": config, "events": result.events,
            "stitches": result.num_stitches,
            "utilization": result.utilization,
            "live_over_reserved": live_over_reserved(live, result.peak_reserved),
            "external_fragmentation": result.external_fragmentation,
            "failures": result.failures, "covered_failures": result.covered_failures,
            "peak_reserved": result.peak_reserved, "peak_allocated": result.peak_allocated}


def traces_dir(out: str) -> Path:
    """Where the recorded model traces are kept: beside the results, so that a trace
    recorded on a GPU can be studied later anywhere (``python tools/replay.py FILE``, or
    ``pyalloc.replay.replay`` on the simulated device)."""
    path = Path(out) / "traces"
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_model(task: str, directory: Path, device: str = "cpu", batch: Optional[int] = None,
                 sim_capacity: Optional[str] = None) -> Dict[str, Any]:
    """Trains ``task`` 3 steps (at ``batch``, default the task's own) in a process of its
    own and returns its trace. On the simulated device the budget is 2 GiB, or all of
    ``sim_capacity`` where given (GPT-2 at batch 2 needs about 7 GiB)."""
    path = directory / f"{task}.json.gz"
    extra = {"sim_capacity": sim_capacity} if device == "cpu" and sim_capacity else {}
    budget = "90%" if device == "cuda" else (sim_capacity or "2GiB")
    job = {"task": task, "device": device, "budget": budget, "options": extra, "batch": batch,
           "path": str(path)}
    subprocess.run([sys.executable, "-m", "pyalloc.bench.frag", "--record", json.dumps(job)],
                   check=True)
    return files.load(path)


# --- the GPU comparison ----------------------------------------------------------------------
GPU_CONFIGS = {"pytorch": None, "pytorch + expandable": None,
               **{name: None for name in NATIVE_MODELS},
               **{f"pyalloc {name}": options for name, options in CONFIGS.items()}}


def peak_live_requested(trace: Dict[str, Any]) -> int:
    """The most requested bytes live at once in ``trace``: what any allocator must hold."""
    col = {name: trace["columns"].index(name) for name in ("action", "address", "requested")}
    live: Dict[int, int] = {}
    total = peak = 0
    for event in trace["events"]:
        action = event[col["action"]]
        if action == "alloc":
            live[event[col["address"]]] = event[col["requested"]]
            total += event[col["requested"]]
            peak = max(peak, total)
        elif action in ("free", "free_requested"):
            total -= live.pop(event[col["address"]], 0)
    return peak


def replay_native(trace: Dict[str, Any], budget: int) -> Dict[str, Any]:
    """Replays ``trace`` through PyTorch's own CUDA allocator, capped at ``budget`` bytes
    (runs in a worker process: the allocator's settings are fixed per process)."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    col = {name: trace["columns"].index(name) for name in ("action", "address", "requested")}
    live: Dict[int, Any] = {}
    result = {"events": 0, "failures": 0, "covered_failures": None, "stitches": 0}
    # No local variable may hold a tensor: it would outlive the trace's free of it (until
    # the next allocation), and the last one would outlive this job into the next. The
    # H100 figures of 2026-11-23 were measured with both (native_model.GpuWorker2026).
    for event in trace["events"]:
        result["events"] += 1
        action = event[col["action"]]
        if action in ("alloc", "oom"):
            try:
                if action == "alloc":
                    live[event[col["address"]]] = torch.empty(
                        event[col["requested"]], dtype=torch.uint8, device="cuda")
                else:
                    torch.empty(event[col["requested"]], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                result["failures"] += 1
                continue
        elif action in ("free", "free_requested"):
            live.pop(event[col["address"]], None)
        elif action == "empty_cache":
            torch.cuda.empty_cache()
    stats = torch.cuda.memory_stats()
    reserved = stats.get("reserved_bytes.all.peak", 0)
    allocated = stats.get("allocated_bytes.all.peak", 0)
    free = stats.get("reserved_bytes.all.current", 0) - stats.get("allocated_bytes.all.current", 0)
    largest = max((b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"]
                   if b["state"] == "inactive"), default=0)
    live.clear()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return {**result, "peak_reserved": reserved, "peak_allocated": allocated,
            "utilization": allocated / reserved if reserved else 1.0,
            "external_fragmentation": 1 - largest / free if free > 0 else 0.0}


def gpu_worker(config: str, jobs_path: str) -> List[Dict[str, Any]]:
    """Replays every job (a trace file, a workload and configuration label, a budget)
    under ``config``; one process per configuration."""
    jobs = json.loads(Path(jobs_path).read_text())
    rows = []
    traces: Dict[str, Dict[str, Any]] = {}
    for job in jobs:
        if job["path"] not in traces:   # patterns are plain JSON; recorded traces, pyalloc's
            path = Path(job["path"])
            traces[job["path"]] = (json.loads(path.read_text()) if path.suffix == ".json"
                                   else files.load(path))
        trace = traces[job["path"]]
        label = f"{config}, {job['setting']}"
        live = job["peak_live"]
        if config in NATIVE_MODELS:
            r = row(job["workload"], label,
                    replay_native_model(trace, job["budget"], NATIVE_MODELS[config]), live)
        elif GPU_CONFIGS[config] is None:
            r = {**replay_native(trace, job["budget"]), "workload": job["workload"],
                 "config": label}
            r["live_over_reserved"] = live_over_reserved(live, r["peak_reserved"])
        else:
            r = row(job["workload"], label, replay(
                trace, {**GPU_CONFIGS[config], "budget": job["budget"]}, device="cuda"), live)
        rows.append(r)
    return rows


def gpu_main(args: argparse.Namespace, started: float, argv: Optional[List[str]]) -> int:
    import torch

    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []

        def add(path: Path, workload: str, trace: Dict[str, Any], settings: Dict[str, int]) -> None:
            live = peak_live_requested(trace)
            for setting, budget in settings.items():
                jobs.append({"path": str(path), "workload": workload, "setting": setting,
                             "budget": budget, "peak_live": live})

        for name, generate in PATTERNS.items():
            for seed in range(args.seeds):
                trace = generate(seed=seed)
                path = Path(tmp) / f"{name}-{seed}.json"
                path.write_text(json.dumps(trace))
                add(path, f"{name} (seed {seed})", trace, {"pattern budget": trace["budget_bytes"]})
        if not args.skip_models:
            traces = traces_dir(args.out)
            for task in args.tasks:
                print(f"recording {task} on the GPU", flush=True)
                trace = record_model(task, traces, device="cuda", batch=args.batch)
                live = peak_live_requested(trace)
                total = torch.cuda.get_device_properties(0).total_memory
                settings = {"budget 90% of the GPU": int(0.9 * total)}
                for slack in (1.10, 1.02):
                    settings[f"budget {slack:.2f}x peak live"] = whole_chunks(slack * live)
                add(traces / f"{task}.json.gz", f"{task} trace (GPU)", trace, settings)
        jobs_path = Path(tmp) / "jobs.json"
        jobs_path.write_text(json.dumps(jobs))
        for config in GPU_CONFIGS:
            print(f"replaying {len(jobs)} workloads through {config}", flush=True)
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if config == "pytorch + expandable":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            proc = subprocess.run([sys.executable, "-m", "pyalloc.bench.frag", "--worker", config, "--jobs",
                                   str(jobs_path)], capture_output=True, text=True, env=env)
            found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if not found:
                print(f"{config} failed:\n{(proc.stderr or proc.stdout)[-3000:]}", flush=True)
                continue
            rows.extend(json.loads(found[-1][len("RESULT "):]))
    order = {job["workload"]: i for i, job in enumerate(jobs)}
    rows.sort(key=lambda r: order.get(r["workload"], 0))   # stable: configs stay in order
    device = f"{torch.cuda.get_device_name(0)} (PyTorch {torch.__version__})"
    payload: Dict[str, Any] = {"rows": rows}
    text = gpu_table(rows)
    # Written now and again after each longer part, so that a run stopped in the training
    # runs (a device lease's time limit) keeps what it measured.
    write_results(args.out, "bench_frag", device, started, argv, payload, text)
    if not args.skip_compaction:
        print("compaction runs (inplace_mlp)", flush=True)
        payload["compaction"] = compaction_runs("inplace_mlp", "cuda")
        text += "\n\n" + compaction_table(payload["compaction"])
        write_results(args.out, "bench_frag", device, started, argv, payload, text)
    if not args.skip_models and not args.skip_training:
        print("training runs", flush=True)
        payload["training"] = training_runs(args.tasks, "cuda", args.batch)
        text += "\n\n" + training_table(payload["training"])
        write_results(args.out, "bench_frag", device, started, argv, payload, text)
    return 0


def gpu_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| workload | config | utilization (own count) | live/reserved | ext. frag. (end) | "
             "failures | covered by free chunks | stitches | peak reserved MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        covered = "—" if r["covered_failures"] is None else r["covered_failures"]
        lines.append(f"| {r['workload']} | {r['config']} | {r['utilization']:.3f} | "
                     f"{r['live_over_reserved']:.3f} | {r['external_fragmentation']:.3f} | "
                     f"{r['failures']} | {covered} | {r['stitches']} | "
                     f"{r['peak_reserved'] / 2**20:.1f} |")
    return "\n".join(lines)


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| workload | config | events | utilization | live/reserved | ext. frag. (end) | "
             "failures | covered by free chunks | stitches | peak reserved MiB | "
             "peak allocated MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        covered = "—" if r["covered_failures"] is None else r["covered_failures"]
        lines.append(f"| {r['workload']} | {r['config']} | {r['events']} | "
                     f"{r['utilization']:.3f} | {r['live_over_reserved']:.3f} | "
                     f"{r['external_fragmentation']:.3f} | "
                     f"{r['failures']} | {covered} | {r['stitches']} | "
                     f"{r['peak_reserved'] / 2**20:.1f} | {r['peak_allocated'] / 2**20:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per pattern")
    p.add_argument("--tasks", nargs="+", default=["mlp", "cnn", "transformer"])
    p.add_argument("--skip-models", action="store_true", help="patterns only")
    p.add_argument("--batch", type=int, help="record every task at this batch size "
                   "(default: each task's own)")
    p.add_argument("--sim-capacity", help="record on a simulated device this large, all of it "
                   "the budget (default: 2 GiB of the default device); e.g. 8GiB for "
                   "--tasks gpt2 --batch 2")
    p.add_argument("--skip-training", action="store_true",
                   help="leave out the training runs (each task trained under each of "
                        "off and on, down to the least budget that trains)")
    p.add_argument("--skip-compaction", action="store_true",
                   help="leave out the compaction runs (training inplace_mlp)")
    p.add_argument("--out", default=".", help="where bench_frag.json and .md go")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: the simulated device (default); cuda: a GPU, against PyTorch's "
                        "native allocator with and without expandable_segments")
    p.add_argument("--worker", choices=list(GPU_CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--jobs", help=argparse.SUPPRESS)
    p.add_argument("--record", metavar="JOB", help=argparse.SUPPRESS)   # record_worker's
    p.add_argument("--trial", metavar="JOB", help=argparse.SUPPRESS)    # trial_worker's
    args = p.parse_args(argv)
    started = time.time()
    if args.worker:
        print("RESULT " + json.dumps(gpu_worker(args.worker, args.jobs)), flush=True)
        return 0
    if args.record:
        record_worker(json.loads(args.record))
        return 0
    if args.trial:
        print("RESULT " + json.dumps(trial_worker(json.loads(args.trial))), flush=True)
        return 0
    if args.device == "cuda":
        return gpu_main(args, started, argv)
    rows: List[Dict[str, Any]] = []
    for name, generate in PATTERNS.items():
        for seed in range(args.seeds):
            trace = generate(seed=seed)
            live = peak_live_requested(trace)
            for config, run in runners(trace, CONFIGS).items():
                rows.append(row(f"{name} (seed {seed})", config, run(), live))
            # And with the budget far away: what each layout reserves when nothing makes
            # it give memory back (a shared GPU's question).
            loose = runners(trace, LOOSE_CONFIGS, {"sim_capacity": 2 * LOOSE_BUDGET})
            for config, run in loose.items():
                rows.append(row(f"{name} (seed {seed})", f"{config}, loose budget",
                                run(LOOSE_BUDGET), live))
    if not args.skip_models:
        traces = traces_dir(args.out)
        for task in args.tasks:
            trace = record_model(task, traces, batch=args.batch, sim_capacity=args.sim_capacity)
            # The replay's own peak: blocks allocated before the trace began
            # (the parameters) are not replayed, so the live run's is larger.
            peak = replay(trace).peak_allocated
            live = peak_live_requested(trace)
            for config, run in runners(trace, MODEL_CONFIGS).items():
                rows.append(row(f"{task} trace", config + ", live options", run(), live))
                for slack in (1.10, 1.02, 1.00):
                    rows.append(row(f"{task} trace",
                                    f"{config}, budget {slack:.2f}x peak allocated",
                                    run(whole_chunks(slack * peak)), live))
                # The figure that says whether fragmentation costs memory: peak allocated
                # over the least budget that serves every request.
                least = tightest_budget(run, peak)
                if least is not None:
                    rows.append(row(f"{task} trace", f"{config}, least budget with no failure",
                                    least, live))
    payload = {"rows": rows}
    text = table(rows)
    if not args.skip_compaction:
        payload["compaction"] = compaction_runs("inplace_mlp", "cpu")
        text += "\n\n" + compaction_table(payload["compaction"])
    if not args.skip_models and not args.skip_training:
        payload["training"] = training_runs(args.tasks, "cpu", args.batch, args.sim_capacity)
        text += "\n\n" + training_table(payload["training"])
    write_results(args.out, "bench_frag", "Replayed on the simulated device", started, argv,
                  payload, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
