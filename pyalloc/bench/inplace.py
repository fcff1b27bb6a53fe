#!/usr/bin/env python3
"""INPLACE_UPDATE benchmark: what the optimizer step allocates, and what the pool looks like,
with the mode off and on.

Each (model, optimizer, mode) trains in its own process (the mode is chosen once per
process, at install) on the simulated device, 8 steps, SGD with momentum or Adam. Figures
over the steady-state steps (from the third):

  step allocs    allocations inside ``optimizer.step()`` per step, and their bytes
  largest        the largest of them (bytes): parameter-sized ones are what the mode removes
  peak reserved  / utilization (peak allocated / peak reserved) of the whole run
  segments       of the pool at the end: activation segments (small/large) and persistent
  step ms        median wall time of a whole training step

    python tools/bench_inplace.py

Writes ``bench_inplace.json`` and ``bench_inplace.md`` into ``--out`` and prints the table.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import torch

from pyalloc.bench.results import write_results
from pyalloc.bench.trial import run_steps, task_training

STEPS = 8
SETTLED = 2   # the first steps allocate the optimizer's state: the figures are from the third

OPTIMIZERS: Dict[str, Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
}


def worker(task_name: str, optimizer: str, mode: bool) -> Dict[str, Any]:
    """One (model, optimizer, mode) in this process: install() is once per process."""
    import pyalloc

    pyalloc.install(device="cpu", budget="2GiB", inplace_update=mode)
    from pyalloc.bench.models import TASKS

    task = TASKS[task_name]
    torch.manual_seed(0)
    model = task.build()
    training = task_training(task, model, OPTIMIZERS[optimizer](model.parameters()),
                             task.default_batch, "cpu")
    engine = pyalloc._engine(None)
    allocs: List[int] = []
    nbytes: List[int] = []
    largest: List[int] = []

    @contextlib.contextmanager
    def step_allocations() -> Iterator[None]:
        """What ``optimizer.step()`` allocates, from the engine's trace."""
        engine.trace_start()
        yield
        events = [e for e in engine.trace_stop()["events"] if e[1] == "alloc"]
        allocs.append(len(events))
        nbytes.append(sum(e[3] for e in events))
        largest.append(max([e[3] for e in events], default=0))

    steps = run_steps(training, STEPS, warmup=SETTLED, around_optimizer_step=step_allocations)
    s = pyalloc.memory_stats()
    kinds: Dict[str, int] = {}
    for seg in pyalloc.snapshot()["segments"]:
        kinds[seg["segment_type"]] = kinds.get(seg["segment_type"], 0) + seg["total_size"]
    return {"step_allocs": statistics.median(allocs[SETTLED:]),
            "step_bytes": statistics.median(nbytes[SETTLED:]),
            "largest": max(largest[SETTLED:]),
            "peak_reserved": s["reserved_bytes.all.peak"],
            "utilization": s["utilization"],
            "segments": kinds,
            "step_ms": 1e3 * steps.step_s}


def run(task: str, optimizer: str, mode: bool) -> Dict[str, Any]:
    """:func:`worker` in a process of its own."""
    out = subprocess.run([sys.executable, "-m", "pyalloc.bench.inplace", "--worker",
                          json.dumps([task, optimizer, mode])],
                         capture_output=True, text=True, check=True)
    return {"task": task, "optimizer": optimizer, "inplace_update": mode,
            **json.loads(out.stdout.strip().splitlines()[-1])}


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| model | optimizer | INPLACE_UPDATE | step allocs (bytes) | largest (bytes) | "
             "peak reserved MiB | utilization | segments at the end (MiB) | step ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        segs = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in sorted(r["segments"].items()))
        lines.append(f"| {r['task']} | {r['optimizer']} | {'on' if r['inplace_update'] else 'off'} "
                     f"| {r['step_allocs']:.0f} ({r['step_bytes']:.0f}) | {r['largest']} | "
                     f"{r['peak_reserved'] / 2**20:.1f} | {r['utilization']:.3f} | {segs} | "
                     f"{r['step_ms']:.0f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["mlp", "cnn", "transformer"])
    p.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    p.add_argument("--out", default=".", help="where bench_inplace.json and .md go")
    p.add_argument("--worker", metavar="JOB", help=argparse.SUPPRESS)   # [task, optimizer, mode]
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))))
        return 0
    started = time.time()
    rows = [run(task, opt, mode) for task in args.tasks for opt in args.optimizers
            for mode in (False, True)]
    write_results(args.out, "bench_inplace", "Simulated device", started, argv,
                  {"rows": rows}, table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
