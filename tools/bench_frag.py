#!/usr/bin/env python3
"""Fragmentation benchmark: how much of the reserved memory holds data, and which requests
fail although the free memory would hold them.

Workloads, each replayed through a fresh simulated-device engine (pyalloc.replay):

  patterns    pyalloc.patterns: growing_batches, interleaved, mixed_sizes, checkerboard,
              each under a budget of 1.25x its peak live bytes (checkerboard: 1.0x), with
              ``--seeds`` seeds.
  models      traces recorded from pyalloc.models' tasks on the simulated device (3 training
              steps, SGD with momentum, recorded with pyalloc.record_trace in a process of
              their own), replayed under the live run's options and under budgets of
              1.10x, 1.02x and 1.00x the replay's peak allocated bytes (rounded up to
              2 MiB).

Figures per workload and configuration:

  utilization       peak allocated / peak reserved (docs/stats.md)
  ext. frag.        1 - largest free block / cached free bytes, at the end of the replay
  failures          requests the replay could not serve
  covered           of those, the ones the free memory would have held: whole free 2 MiB
                    chunks plus the unreserved budget (pyalloc.replay.free_chunk_bytes).
                    These are the failures of placement alone, what VMM stitching serves.

Configurations: ``best-fit`` (option ``stitch:false``) and ``+ stitching`` (the default:
free 2 MiB chunks of several segments mapped into one range when no block holds a
request). Fragment-aware eviction needs a registry and a model, so it is measured by
bench_remat.py, not here; compaction is not built. A GPU comparison with PyTorch's native
allocator (with and without expandable_segments) is not part of this tool yet.

    python tools/bench_frag.py                 # patterns and model traces, simulated device
    python tools/bench_frag.py --skip-models   # patterns only (seconds)

Writes ``bench_frag.json`` and ``bench_frag.md`` into ``--out`` and prints the table.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # pyalloc, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))          # bench_results, beside us

from bench_results import write_results  # noqa: E402
from pyalloc import files  # noqa: E402
from pyalloc.patterns import PATTERNS  # noqa: E402
from pyalloc.replay import replay  # noqa: E402

RECORD = """
import torch, pyalloc
pyalloc.install(device="cpu", budget="2GiB")
from pyalloc.models import TASKS
task = TASKS[{task!r}]
torch.manual_seed(0)
model = task.build()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = task.batch(task.default_batch, torch.Generator().manual_seed(1))
with pyalloc.record_trace({path!r}):
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        task.loss(model, x, y).backward()
        opt.step()
"""


CONFIGS = {"best-fit": {"stitch": "false"}, "+ stitching": {}}


def row(workload: str, config: str, result: Any) -> Dict[str, Any]:
    return {"workload": workload, "config": config, "events": result.events,
            "stitches": result.num_stitches,
            "utilization": result.utilization,
            "external_fragmentation": result.external_fragmentation,
            "failures": result.failures, "covered_failures": result.covered_failures,
            "peak_reserved": result.peak_reserved, "peak_allocated": result.peak_allocated}


def record_model(task: str, directory: Path) -> Dict[str, Any]:
    path = directory / f"{task}.json.gz"
    subprocess.run([sys.executable, "-c", RECORD.format(task=task, path=str(path))],
                   check=True, cwd=str(Path(__file__).resolve().parent.parent))
    return files.load(path)


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| workload | config | events | utilization | ext. frag. (end) | failures | "
             "covered by free chunks | stitches | peak reserved MiB | peak allocated MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['config']} | {r['events']} | "
                     f"{r['utilization']:.3f} | {r['external_fragmentation']:.3f} | "
                     f"{r['failures']} | {r['covered_failures']} | {r['stitches']} | "
                     f"{r['peak_reserved'] / 2**20:.1f} | {r['peak_allocated'] / 2**20:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per pattern")
    p.add_argument("--tasks", nargs="+", default=["mlp", "cnn", "transformer"])
    p.add_argument("--skip-models", action="store_true", help="patterns only")
    p.add_argument("--out", default=".", help="where bench_frag.json and .md go")
    args = p.parse_args(argv)
    started = time.time()
    rows: List[Dict[str, Any]] = []
    for name, generate in PATTERNS.items():
        for seed in range(args.seeds):
            trace = generate(seed=seed)
            for config, overrides in CONFIGS.items():
                rows.append(row(f"{name} (seed {seed})", config, replay(trace, overrides)))
    if not args.skip_models:
        with tempfile.TemporaryDirectory() as tmp:
            for task in args.tasks:
                trace = record_model(task, Path(tmp))
                # The replay's own peak: blocks allocated before the trace began
                # (the parameters) are not replayed, so the live run's is larger.
                peak = replay(trace).peak_allocated
                for config, overrides in CONFIGS.items():
                    rows.append(row(f"{task} trace", config + ", live options",
                                    replay(trace, overrides)))
                    for slack in (1.10, 1.02, 1.00):
                        tight = -(-int(slack * peak) // (2 << 20)) * (2 << 20)
                        rows.append(row(f"{task} trace",
                                        f"{config}, budget {slack:.2f}x peak allocated",
                                        replay(trace, {**overrides, "budget": tight})))
    write_results(args.out, "bench_frag", "Replayed on the simulated device", started, argv,
                  {"rows": rows}, table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
