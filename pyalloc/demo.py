"""``pyalloc-demo``: train a small residual CNN through pyalloc and show where memory went.

On a machine with a CUDA GPU the model trains on the GPU; otherwise on the simulated
device (PyTorch CPU tensors served by pyalloc's engine under a budget), labelled as such.
The data are synthetic (seeded), so the run needs no download. The run is recorded as a
trace; the demo ends with ``pyalloc-stats report`` on it and writes a plot, so every
subcommand of ``pyalloc-stats`` has files to work on (see the closing lines).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import nn

import pyalloc
from pyalloc.bench.models import residual_cnn

log = logging.getLogger("pyalloc.demo")


def _fmt(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def summary_lines(stats: Dict[str, float], device_label: str) -> List[str]:
    """The few figures a person looks at first; every key is defined in docs/stats.md."""
    return [
        f"device                 {device_label}",
        f"budget                 {_fmt(stats['budget_bytes'])}",
        f"allocated now / peak   {_fmt(stats['allocated_bytes.all.current'])} / "
        f"{_fmt(stats['allocated_bytes.all.peak'])}",
        f"reserved now / peak    {_fmt(stats['reserved_bytes.all.current'])} / "
        f"{_fmt(stats['reserved_bytes.all.peak'])}",
        f"utilization            {100 * stats['utilization']:.1f}%  (peak allocated / peak reserved)",
        f"external fragmentation {100 * stats['external_fragmentation']:.1f}%  "
        f"(1 - largest free block / cached free)",
        f"largest free block     {_fmt(stats['largest_free_block'])}",
        f"segments created/freed {stats['num_device_alloc']} / {stats['num_device_free']}",
        f"alloc retries / OOMs   {stats['num_alloc_retries']} / {stats['num_ooms']}",
    ]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyalloc-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--budget", default="256MiB", help='cap on reserved memory, e.g. "1GiB"')
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=32, help="image side in pixels")
    parser.add_argument("--out", default="pyalloc-demo-out",
                        help="folder for the trace, snapshot and plot (default: %(default)s)")
    parser.add_argument("--json", help="write the final stats here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Live stats too, so `pyalloc-stats watch` has something to show during (and after) the run.
    installed = pyalloc.install(device=args.device, budget=args.budget,
                                stats_file=str(out / "stats.json"), stats_interval=0.5)
    device = torch.device("cuda" if installed == "cuda" else "cpu")
    label = torch.cuda.get_device_name(0) if installed == "cuda" else "simulated device (CPU)"
    trace_path, snapshot_path, plot_path = (out / "trace.json.gz", out / "snapshot.json",
                                            out / "memory.png")

    from tqdm import tqdm

    with pyalloc.record_trace(trace_path, stacks=True):
        torch.manual_seed(0)
        model = residual_cnn().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        x = torch.randn(args.batch, 3, args.image, args.image, device=device)
        y = torch.randint(0, 10, (args.batch,), device=device)
        start = time.perf_counter()
        bar = tqdm(range(args.steps), desc=f"training on {label}", unit="step", file=sys.stderr)
        for _ in bar:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            stats = pyalloc.memory_stats()
            bar.set_postfix(loss=f"{loss.item():.3f}",
                            allocated=_fmt(stats["allocated_bytes.all.current"]),
                            reserved=_fmt(stats["reserved_bytes.all.current"]))
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start

    stats = pyalloc.memory_stats()
    pyalloc.check_invariants()
    pyalloc.save_snapshot(snapshot_path)
    print(f"\npyalloc: {args.steps} steps, batch {args.batch}, {elapsed:.2f} s, "
          f"final loss {loss.item():.4f}")
    print("\n".join(summary_lines(stats, label)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": label, "steps": args.steps, "batch": args.batch,
                       "seconds": elapsed, "final_loss": loss.item(), "stats": stats}, f, indent=2)

    from . import stats_cli

    print(f"\n$ pyalloc-stats report {trace_path}")
    sys.stdout.flush()
    rc = stats_cli.main(["report", str(trace_path), "--top", "5"])
    rc = rc or stats_cli.main(["plot", str(trace_path), "-o", str(plot_path)])
    print(f"\nwrote {trace_path} (trace), {snapshot_path} (snapshot), {plot_path} (plot), "
          f"{out / 'stats.json'} (live stats, for pyalloc-stats watch)")
    print(f"next: pyalloc-stats plot {snapshot_path} -o segments.html | "
          f"pyalloc-stats compare {snapshot_path} {trace_path} | "
          f"pyalloc-stats export-memviz {trace_path} -o memviz.pickle (open at "
          f"pytorch.org/memory_viz) | python tools/replay.py {trace_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
