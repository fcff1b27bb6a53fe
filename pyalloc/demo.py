"""``pyalloc-demo``: the same model, the same memory budget, several times the batch.

The demo trains a small residual CNN three ways under one budget, side by side:

1. at the *stock* batch with no policy (what plain PyTorch runs), and takes the budget to
   be what that needs: its peak reserved memory, plus a tenth;
2. at ``--scale`` times that batch with no policy: out of memory, as in plain PyTorch;
3. at that batch again under ``--policy`` (recompute or hybrid): activations are evicted
   when memory is short and recomputed (or swapped back) when needed, and it trains.

It prints a table of both trained runs (batch, peak memory, samples/s, evictions) and writes
a plot of their memory step by step. The policy run is recorded as a trace; the demo ends
with ``pyalloc-stats report`` on it, so every subcommand of ``pyalloc-stats`` has files to
work on (see the closing lines). On a machine with a CUDA GPU the model trains on the GPU;
otherwise on the simulated device (CPU tensors served by pyalloc's engine under a budget),
labelled as such. The data are synthetic (seeded), so nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

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


@dataclass
class Run:
    """One training run of the demo: what it was and what it measured."""
    name: str
    batch: int
    policy: str
    trained: bool = False
    error: str = ""
    seconds: float = 0.0
    steps: int = 0
    final_loss: float = float("nan")
    peak_allocated: int = 0
    peak_reserved: int = 0
    evictions: int = 0
    recomputes: int = 0
    swap_outs: int = 0
    allocated: List[int] = field(default_factory=list)   # after each step
    reserved: List[int] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.batch * self.steps / self.seconds if self.seconds > 0 else 0.0


def train(run: Run, steps: int, image: int, device: torch.device, label: str,
          time_limit: float, snapshot: Optional[Path] = None) -> Run:
    """Trains a fresh, seeded model for ``steps`` steps at ``run.batch``. An out-of-memory
    error, or ``time_limit`` seconds (a policy that thrashes: evicting what it is about to
    need, again and again), ends the run, recorded in it, and leaves the engine usable.
    ``snapshot``: where to save the engine's layout at the end, while the model is alive."""
    from tqdm import tqdm

    from pyalloc.bench.trial import TooSlow, time_limit as limit

    torch.manual_seed(0)
    model = residual_cnn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(run.batch, 3, image, image, device=device)
    y = torch.randint(0, 10, (run.batch,), device=device)
    pyalloc.reset_peak_memory_stats()
    before = pyalloc.memory_stats()
    bar = tqdm(range(steps), desc=f"{run.name}: batch {run.batch} on {label}", unit="step",
               file=sys.stderr)
    start = time.perf_counter()
    try:
        with limit(time_limit):
            run_steps(run, bar, model, opt, loss_fn, x, y)
        if device.type == "cuda":
            torch.cuda.synchronize()
        run.trained = True
    except torch.OutOfMemoryError as error:
        run.error = str(error).splitlines()[0]
    except TooSlow:
        run.error = (f"stopped after {time_limit:.0f} s: the policy thrashes at this batch "
                     f"and budget")
    finally:
        bar.close()
    run.seconds = time.perf_counter() - start
    after = pyalloc.memory_stats()
    run.peak_allocated = int(after["allocated_bytes.all.peak"])
    run.peak_reserved = int(after["reserved_bytes.all.peak"])
    for key, attr in (("remat.evictions", "evictions"), ("remat.recomputes", "recomputes"),
                      ("remat.swap_outs", "swap_outs")):
        setattr(run, attr, int(after.get(key, 0) - before.get(key, 0)))
    if snapshot is not None:
        pyalloc.save_snapshot(snapshot)
    del model, opt, x, y
    pyalloc.empty_cache()
    return run


def run_steps(run: Run, bar: Any, model: nn.Module, opt: torch.optim.Optimizer,
              loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    for _ in bar:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        stats = pyalloc.memory_stats()
        run.allocated.append(int(stats["allocated_bytes.all.current"]))
        run.reserved.append(int(stats["reserved_bytes.all.current"]))
        run.steps += 1
        run.final_loss = loss.item()
        bar.set_postfix(loss=f"{run.final_loss:.3f}",
                        allocated=_fmt(stats["allocated_bytes.all.current"]))


def table(runs: List[Run], budget: int) -> str:
    rows = [f"{'run':<22} {'batch':>5} {'policy':>9} {'trained':>8} {'peak alloc':>11} "
            f"{'peak resv':>10} {'samples/s':>10} {'evictions':>9} {'recomputes':>10}"]
    for r in runs:
        status = "yes" if r.trained else "stopped" if r.error.startswith("stopped") else "OOM"
        rows.append(f"{r.name:<22} {r.batch:>5} {r.policy:>9} {status:>8} "
                    f"{_fmt(r.peak_allocated):>11} {_fmt(r.peak_reserved):>10} "
                    f"{(f'{r.samples_per_s:.1f}' if r.trained else '-'):>10} "
                    f"{r.evictions:>9} {r.recomputes:>10}")
    rows.append(f"all under one budget of {_fmt(budget)}")
    return "\n".join(rows)


def plot(runs: List[Run], budget: int, path: Path) -> None:
    """Memory after each step of each trained run, against the budget."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for r in runs:
        if not r.allocated:
            continue
        steps = range(1, len(r.allocated) + 1)
        ax.plot(steps, [b / 2**20 for b in r.reserved], label=f"{r.name}: reserved")
        ax.plot(steps, [b / 2**20 for b in r.allocated], linestyle="--",
                label=f"{r.name}: allocated")
    ax.axhline(budget / 2**20, color="black", linewidth=1, label="budget")
    ax.set_xlabel("step")
    ax.set_ylabel("MiB (after the step)")
    ax.set_title("pyalloc: same budget, larger batch")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyalloc-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="the stock batch")
    parser.add_argument("--scale", type=int, default=4,
                        help="the larger batch is this many times the stock batch")
    parser.add_argument("--policy", choices=["recompute", "hybrid"], default="recompute")
    parser.add_argument("--image", type=int, default=32, help="image side in pixels")
    parser.add_argument("--time-limit", type=float, default=300.0, metavar="SECONDS",
                        help="stop a run after this long (default: %(default)s)")
    parser.add_argument("--out", default="pyalloc-demo-out",
                        help="folder for the trace, snapshot and plot (default: %(default)s)")
    parser.add_argument("--json", help="write the runs and the final stats here")
    args = parser.parse_args(argv)
    if args.scale < 2:
        parser.error("--scale must be at least 2")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Live stats too, so `pyalloc-stats watch` has something to show during (and after) the run.
    installed = pyalloc.install(device=args.device, stats_file=str(out / "stats.json"),
                                stats_interval=0.5)
    device = torch.device("cuda" if installed == "cuda" else "cpu")
    label = torch.cuda.get_device_name(0) if installed == "cuda" else "simulated device (CPU)"
    trace_path, snapshot_path, plot_path = (out / "trace.json.gz", out / "snapshot.json",
                                            out / "memory.png")
    engine = pyalloc._engine()

    stock = train(Run("stock batch", args.batch, "none"), args.steps, args.image, device, label,
                  args.time_limit)
    if not stock.trained:
        print(f"pyalloc-demo: the stock batch {args.batch} did not train ({stock.error}); "
              f"try a smaller --batch", file=sys.stderr)
        return 1
    budget = int(stock.peak_reserved * 1.1)
    engine.set_budget(budget)
    large = args.batch * args.scale
    plain = train(Run(f"{args.scale}x, no policy", large, "none"), args.steps, args.image,
                  device, label, args.time_limit)
    with pyalloc.record_trace(trace_path, stacks=True), pyalloc.recompute(policy=args.policy):
        managed = train(Run(f"{args.scale}x, {args.policy}", large, args.policy), args.steps,
                        args.image, device, label, args.time_limit, snapshot=snapshot_path)
    runs = [stock, plain, managed]

    stats = pyalloc.memory_stats()
    pyalloc.check_invariants()
    print()
    print(table(runs, budget))
    if managed.trained:
        ratio = managed.samples_per_s / stock.samples_per_s if stock.samples_per_s else 0.0
        print(f"\n{args.scale}x the batch in the memory the stock batch needs, at {ratio:.2f}x "
              f"its samples/s ({managed.evictions} evictions, {managed.recomputes} recomputes).")
    else:
        print(f"\n{args.scale}x the batch did not train under {args.policy} either "
              f"({managed.error}); try another --scale or --batch.")
    print()
    print("\n".join(summary_lines(stats, label)))
    plot(runs, budget, plot_path)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": label, "budget": budget, "runs": [asdict(r) for r in runs],
                       "stats": stats}, f, indent=2)

    from . import stats_cli

    print(f"\n$ pyalloc-stats report {trace_path}")
    sys.stdout.flush()
    rc = stats_cli.main(["report", str(trace_path), "--top", "5"])
    print(f"\nwrote {plot_path} (the runs' memory), {trace_path} (trace of the {args.policy} "
          f"run), {snapshot_path} (its snapshot at the end), {out / 'stats.json'} (live stats, for "
          f"pyalloc-stats watch)")
    print(f"next: pyalloc-stats plot {trace_path} -o timeline.png | "
          f"pyalloc-stats plot {snapshot_path} -o segments.html | "
          f"pyalloc-stats compare {snapshot_path} {trace_path} | "
          f"pyalloc-stats export-memviz {trace_path} -o memviz.pickle (open at "
          f"pytorch.org/memory_viz) | python tools/replay.py {trace_path}")
    return rc if managed.trained else (rc or 1)


if __name__ == "__main__":
    sys.exit(main())
