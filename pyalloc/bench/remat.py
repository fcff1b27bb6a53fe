#!/usr/bin/env python3
"""Rematerialization benchmark: how little memory, how much batch, at what speed.

For each model, side by side in one run, each configuration in its own process (the
allocator and its options are chosen once per process):

  baseline    pyalloc, no eviction (the budget is a hard cap; nothing is recomputed)
  checkpoint  torch.utils.checkpoint (non-reentrant) around every block, no eviction
  dtr, dte, window   policy="recompute" with that victim strategy
  floor       not a strategy: the budget below which no victim choice can train, measured
              on one unconstrained run under the registry (see Worker.floor)

Figures, all against the baseline's peak reserved bytes P at the task's default batch:

  min budget  the smallest budget (fraction of P, bisection to 0.005 P) at which 3 steps train;
              then the four budgets 0.02 apart above it are tried too, and any that fails is
              listed beside it (bisection assumes more memory never hurts, and under eviction
              the layout, so the outcome, changes with the budget)
  t@0.9, t@0.5  median step time at budgets 0.9 P and 0.5 P over the baseline's unconstrained
              step time (empty where the configuration cannot train at that budget)
  max batch   the largest batch that trains 2 steps under the budget P (doubling, then
              bisection; searched up to 8x the default), and its ratio to the baseline's
  A trial that takes more than 10x the unconstrained time (at least 10 s; up to twice that
  for larger batches) counts as not training: thrashing is not a usable setting.

  op overhead the registry's cost per aten op, in the same process: on a chain of cheap ops
              whose every output is recorded (the worst case: each op also makes a node, and
              the node outlives its storage as lineage until the chain ends), forward and
              backward, registry on vs off, the median over 300 interleaved pairs; beside it,
              what a Python dispatch mode that does nothing but call the op costs on the same
              chain; and the ratio of the model's unconstrained step time with the registry
              on and off
  syncs/maps  at 0.5 P, per step after the warm-up steps: device-wide synchronizations and
              segment maps plus unmaps (a policy in steady state should make neither)

    python tools/bench_remat.py                         # simulated device: mlp, cnn, transformer
    python tools/bench_remat.py --device cuda --tasks cnn transformer resnet50 gpt2
    python tools/bench_remat.py --tasks transformer --configs baseline dtr window \
        --option stitch=false                           # the strategies without stitching

Writes ``bench_remat.json`` and ``bench_remat.md`` into ``--out`` and prints the table.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional


from pyalloc.bench.suite import largest_batch
from pyalloc.bench.trial import HostSnapshot, Training, device_sync, run_steps, run_trial, task_training

STRATEGIES = ("dtr", "dte", "window")
CONFIGS = ("baseline", "checkpoint") + STRATEGIES + ("floor",)
SKIPPABLE = ("min-budget", "max-batch", "overhead")


# --- worker: one configuration, in its own process ------------------------------------------

class Worker:
    def __init__(self, task: str, config: str, device: str, batch: int,
                 engine_options: Optional[Dict[str, str]] = None) -> None:
        import pyalloc

        policy = "recompute" if config in STRATEGIES + ("floor",) else "none"
        options = dict(engine_options or {})
        if config in STRATEGIES:
            options["evict_strategy"] = config
        self.device = pyalloc.install(device=device, policy=policy, **options)
        import torch

        from pyalloc import registry
        from pyalloc.bench import models

        self.torch = torch
        self.pyalloc = pyalloc
        self.registry = registry
        self.task = models.TASKS[task]
        self.blocks = models.blocks
        self.config = config
        self.batch = batch
        self.engine = pyalloc._engine(None)
        self.dev = "cuda" if self.device == "cuda" else "cpu"
        # Deterministic kernels where they exist, so the strategies compute the same thing.
        torch.backends.cudnn.benchmark = False

    def _model(self):
        """The model in its initial state: built once per process (GPT-2's initialisation
        alone takes seconds), then reset in place before every trial."""
        torch = self.torch
        if getattr(self, "model", None) is None:
            torch.manual_seed(0)
            self.model = self.task.build().to(self.dev)
            self.initial = HostSnapshot(self.model)
            if self.config == "checkpoint":
                from torch.utils.checkpoint import checkpoint

                for block in self.blocks(self.model):
                    block.forward = (lambda f: lambda *a: checkpoint(f, *a, use_reentrant=False))(
                        block.forward)
        self.initial.restore(self.model)
        self.model.zero_grad(set_to_none=True)
        return self.model

    time_limit = 60.0   # seconds per trial; set from the unconstrained step time
    last_failure: Optional[str] = None   # why the last trial did not train (trial.OUT_OF_MEMORY...)

    def trial(self, budget: int, batch: int, steps: int, warmup: int = 0) -> Optional[Dict[str, Any]]:
        """Trains ``steps`` steps under ``budget``; None when it runs out of memory or
        thrashes (takes longer than ``time_limit``, about 10x the unconstrained steps)."""
        engine = self.engine
        gc.collect()
        self.pyalloc.empty_cache()
        engine.set_budget(budget)
        engine.reset_peak_stats()
        before = engine.stats()
        reg = self.registry.active()
        ops0 = reg.ops if reg else 0
        rc0 = reg.recomputes if reg else 0
        settled = [before]   # from the end of the warm-up: the pool's shape is settled

        def setup() -> Training:
            model = self._model()
            opt = self.torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            return task_training(self.task, model, opt, batch, self.dev)

        result = run_trial(setup, steps, warmup=warmup, sync=device_sync(self.dev),
                           limit_s=self.time_limit * min(2.0, batch / self.batch),
                           on_warm=lambda: settled.append(engine.stats()))
        self.last_failure = result.failure
        if not result.trained:
            return None
        after, settled = engine.stats(), settled[-1]
        settled_steps = max(1, steps - warmup)
        return {
            # after the warm-up steps: what the policy costs in steady state
            "syncs_per_step": (after["num_sync_all_streams"] - settled["num_sync_all_streams"])
            / settled_steps,
            "maps_per_step": (after["num_segment_maps"] + after["num_segment_unmaps"]
                              - settled["num_segment_maps"] - settled["num_segment_unmaps"])
            / settled_steps,
            "step_s": result.step_s,
            "peak_reserved": after["reserved_bytes.all.peak"],
            "evictions_per_step": (after["num_evictions"] - before["num_evictions"]) / steps,
            # large requests the ladder's last rung served from small segments' holes
            "lends_per_step": (after["rung.lend"] - before["rung.lend"]) / steps,
            "recomputes_per_step": ((reg.recomputes - rc0) if reg else 0) / steps,
            "ops_per_step": ((reg.ops - ops0) / steps) if reg else 0,
        }

    def overhead_per_op(self, capacity: int, steps: int) -> Optional[Dict[str, float]]:
        """The registry's cost per aten op, paired in this process, two ways:

        * on the model: unconstrained steps with the registry on and off, alternated three
          times, fastest of each (the step-time ratio; per op it is as noisy as the steps);
        * on a chain of 200 cheap ops (64 KiB tensors, all recorded, forward and backward),
          where the registry's own work dominates: the per-op figure reported.
        """
        reg = self.registry.active()
        if reg is None:
            return None
        torch = self.torch

        def without_registry(fn):
            with reg.paused():
                return fn()

        # The model's step with the registry over the same step without it, paired step by
        # step in one trial under a budget that never binds.
        step_pairs = max(steps, 15)
        ratios: List[float] = []
        model = self._model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        training = task_training(self.task, model, opt, self.batch, self.dev)
        self.engine.set_budget(capacity)
        sync = device_sync(self.dev)

        def step() -> float:
            return run_steps(training, 1, sync=sync).seconds[0]

        for _ in range(3):
            step()
            without_registry(step)
        ops0 = reg.ops
        for _ in range(step_pairs):
            off_s = without_registry(step)
            ratios.append(step() / off_s)
        ops = (reg.ops - ops0) / step_pairs
        del model, opt, training
        self.model.zero_grad(set_to_none=True)
        gc.collect()

        x = torch.randn(16384, device=self.dev, requires_grad=True)   # 64 KiB: recorded

        def chain() -> float:
            sync()
            start = time.perf_counter()
            y = x
            for _ in range(100):
                y = y * 1.0001
            y.sum().backward()
            sync()
            return time.perf_counter() - start

        from torch.utils._python_dispatch import TorchDispatchMode

        class Bare(TorchDispatchMode):
            """Intercepts every op and does nothing else: what any Python dispatch mode
            costs before its first line of bookkeeping."""

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        def bare_chain() -> float:
            with Bare():
                return chain()

        # Paired: each run of the chain with the registry beside one without it and one
        # under a bare Python mode, the median of the differences over many pairs (this
        # cancels the slow drift of a shared machine, which the best of a few runs does not).
        for _ in range(10):
            chain()
        n0 = reg.ops
        plain_t, reg_d, bare_d = [], [], []
        pairs = 300
        for _ in range(pairs):
            with reg.paused():
                p = chain()
                b = bare_chain()
            q = chain()
            plain_t.append(p)
            reg_d.append(q - p)
            bare_d.append(b - p)
        chain_ops = (reg.ops - n0) / pairs
        quartiles = statistics.quantiles(reg_d, n=4)
        return {"us_per_op": statistics.median(reg_d) / chain_ops * 1e6,
                "us_per_op_quartiles": [quartiles[0] / chain_ops * 1e6,
                                        quartiles[2] / chain_ops * 1e6],
                "chain_ops": chain_ops,
                "plain_us_per_op": statistics.median(plain_t) / chain_ops * 1e6,
                "bare_mode_us_per_op": statistics.median(bare_d) / chain_ops * 1e6,
                "ops_per_step": ops, "step_ratio": statistics.median(ratios)}

    def floor(self, capacity: int, steps: int = 3) -> Dict[str, Any]:
        """The least memory any eviction strategy needs: the most, over every op of
        ``steps`` unconstrained steps, of what could not have been dropped while it ran.

        At an op, whatever strategy chose the victims, three things are on the device: the
        storages nothing may drop (parameters, gradients, optimizer state, inputs, tensors
        below ``min_bytes``, frozen ones: everything not a recomputable registered
        storage), the op's own inputs, and what the op allocates while it runs (outputs and
        scratch). So ``peak allocated during the op - bytes of recomputable storages the op
        does not read`` bounds every strategy's budget from below. It ignores placement (a
        real allocator also loses bytes to fragmentation and 2 MiB segments) and recompute
        chains (restoring an input needs its own inputs too), so no strategy can reach it;
        how close one gets is what is left for victim choice to win.
        """
        reg = self.registry.active()
        with reg.floor_probe() as worst:
            run = self.trial(capacity, self.batch, steps)
        if run is None:
            raise RuntimeError("the unconstrained run did not train")
        worst["peak_reserved"] = run["peak_reserved"]   # of the same run, for scale
        return worst

    def min_budget(self, peak: int, lo: float = 0.05, hi: float = 1.0, steps: int = 3,
                   resolution: float = 0.005) -> Optional[float]:
        """The least budget, as a fraction of ``peak``, at which ``steps`` steps train, by
        bisection to ``resolution``: the answer trains, and ``resolution`` less did not.

        0.005 of the peak, not the 0.02 used until 2026-11-28: the zoo's floors lie at
        0.09-0.42 of their peaks, so 0.02 could overstate a least budget by up to a fifth of
        its floor, more than the 15% margin issue 21 measures it by."""
        if self.trial(int(hi * peak), self.batch, steps) is None:
            hi = 1.5
            if self.trial(int(hi * peak), self.batch, steps) is None:
                return None
        while hi - lo > resolution:
            mid = (lo + hi) / 2
            if self.trial(int(mid * peak), self.batch, steps) is None:
                lo = mid
            else:
                hi = mid
        return hi

    def gaps_above(self, peak: int, found: float, steps: int = 3, points: int = 4) -> List[float]:
        """Budgets just above the bisection's answer (``points`` of them, 0.02 apart) at
        which training fails all the same. Bisection assumes that more memory never hurts;
        under eviction it can (the layout differs with the budget), and a user choosing a
        budget needs to know."""
        above = [round(found + 0.02 * (i + 1), 4) for i in range(points)]
        return [f for f in above if f <= 1.0 and self.trial(int(f * peak), self.batch, steps) is None]

    def max_batch(self, budget: int, limit: int = 8) -> int:
        """The largest batch that trains 2 steps under ``budget``, to 1/32 of itself."""
        return largest_batch(lambda n: self.trial(budget, n, 2) is not None, self.batch,
                             limit * self.batch, lambda good: good // 32)


def worker_main(args: argparse.Namespace) -> None:
    w = Worker(args.task, args.config, args.device, args.batch, parse_options(args.option))
    unlimited = args.capacity
    out: Dict[str, Any] = {"task": args.task, "config": args.config, "device": w.device}
    w.time_limit = 600.0
    free = w.trial(unlimited, args.batch, max(args.steps, 10), warmup=2)
    out["unconstrained"] = free
    if free:   # a trial of up to ~6 steps may take 10x the unconstrained time, at least 10 s
        w.time_limit = max(10.0, 10 * 6 * free["step_s"])
    peak = args.peak or (free["peak_reserved"] if free else None)
    out["peak"] = peak
    if w.config == "floor":
        out["overhead"] = None
        out["floor"] = w.floor(unlimited)
        out["min_budget"] = out["floor"]["bytes"] / peak if peak else None
        print("RESULT " + json.dumps(out), flush=True)
        return
    skip = set(args.skip or ())
    out["overhead"] = None if "overhead" in skip else w.overhead_per_op(unlimited, max(args.steps, 6))
    if peak:
        if "min-budget" not in skip:
            out["min_budget"] = w.min_budget(peak)
            if out["min_budget"] and w.config != "baseline":
                out["fails_above_min"] = w.gaps_above(peak, out["min_budget"])
        for frac in (0.9, 0.5):
            out[f"at_{frac}"] = w.trial(int(frac * peak), args.batch, args.steps, warmup=2)
        if "max-batch" not in skip:
            out["max_batch"] = w.max_batch(peak)
    print("RESULT " + json.dumps(out), flush=True)


# --- driver ----------------------------------------------------------------------------------
def parse_options(pairs: Optional[List[str]]) -> Dict[str, str]:
    """``--option KEY=VALUE`` pairs as install() keywords (validated there, by the engine)."""
    options: Dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--option takes KEY=VALUE (an engine option, docs/design.md), "
                             f"got {pair!r}")
        options[key] = value
    return options


def run_worker(task: str, config: str, device: str, batch: int, steps: int, peak: Optional[int],
               capacity: int, options: Optional[List[str]] = None,
               skip: Optional[List[str]] = None) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "pyalloc.bench.remat", "--worker", "--task", task, "--config", config,
           "--device", device, "--batch", str(batch), "--steps", str(steps),
           "--capacity", str(capacity)]
    if skip:
        cmd += ["--skip", *skip]
    for pair in options or []:
        cmd += ["--option", pair]
    if peak:
        cmd += ["--peak", str(peak)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"task": task, "config": config, "error": (proc.stderr or proc.stdout)[-2000:]}


def _ratio(a: Optional[Dict[str, Any]], base: Optional[Dict[str, Any]]) -> str:
    if not a or not base:
        return "—"
    return f"{a['step_s'] / base['step_s']:.2f}x"


def table(results: List[Dict[str, Any]]) -> str:
    rows = ["| model | config | min budget (of peak) | step time @0.9 | @0.5 | max batch @peak "
            "(x baseline) | per step @0.5 after warm-up: evictions / recomputes / syncs / maps+unmaps | registry: added per op; step with/without |",
            "|---|---|---|---|---|---|---|---|"]
    by_task: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for r in results:
        by_task.setdefault(r["task"], {})[r["config"]] = r
    for task, configs in by_task.items():
        base = configs.get("baseline", {})
        base_free = base.get("unconstrained")
        base_batch = base.get("max_batch") or 0
        for config in CONFIGS:
            r = configs.get(config)
            if r is None:
                continue
            if "error" in r:
                rows.append(f"| {task} | {config} | error: {r['error'].splitlines()[-1][:80]} |||||||")
                continue
            mb = r.get("min_budget")
            if config == "floor":
                f = r.get("floor") or {}
                rows.append(f"| {task} | floor (no strategy below) | {mb:.3f} | — | — | — | — | "
                            f"at {f.get('op', '?')}: {f.get('allocated', 0) / 2**20:.1f} MiB "
                            f"allocated, {f.get('droppable', 0) / 2**20:.1f} MiB of it "
                            f"droppable |" if mb else f"| {task} | floor | — |||||||")
                continue
            at5 = r.get("at_0.5")
            per_step = (f"{at5['evictions_per_step']:.0f} / {at5['recomputes_per_step']:.0f} / "
                        f"{at5.get('syncs_per_step', 0):.1f} / {at5.get('maps_per_step', 0):.1f}"
                        if at5 else "—")
            overhead = "—"
            o = r.get("overhead")
            if o:
                bare = (f" (a bare Python mode: {o['bare_mode_us_per_op']:.1f} µs; the op "
                        f"alone {o.get('plain_us_per_op', 0):.1f} µs)"
                        if "bare_mode_us_per_op" in o else "")
                ratio = o["step_ratio"] if "step_ratio" in o else o["step_on_s"] / o["step_off_s"]
                overhead = (f"{o['us_per_op']:.2f} µs{bare}; step "
                            f"{ratio:.3f}x ({o['ops_per_step']:.0f} ops)")
            batch = r.get("max_batch") or 0
            capped = "≥" if batch >= 8 * r.get("batch", 1) else ""
            gaps = r.get("fails_above_min") or []
            holes = f" (fails at {', '.join(f'{g:.3f}' for g in gaps)})" if gaps else ""
            rows.append(
                f"| {task} | {config} | {mb:.3f}{holes} |" if mb else f"| {task} | {config} | — |")
            batch_cell = (f"{capped}{batch} ({capped}{batch / base_batch:.2f}x)"
                          if batch and base_batch else "—")
            rows[-1] += (f" {_ratio(r.get('at_0.9'), base_free)} | {_ratio(at5, base_free)} | "
                         f"{batch_cell} | {per_step} | {overhead} |")
    return "\n".join(rows)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: the simulated device (default); cuda: a GPU")
    p.add_argument("--tasks", nargs="+", default=None,
                   help="models (pyalloc.bench.models.TASKS); default mlp mlp_small cnn transformer")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    p.add_argument("--steps", type=int, default=6, help="steps per timed trial (2 warm-up)")
    p.add_argument("--batch", type=int, default=None, help="override every task's default batch")
    p.add_argument("--out", default=".", help="where bench_remat.json and .md go")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="an engine option for every configuration, e.g. stitch=false "
                        "(repeatable)")
    p.add_argument("--skip", nargs="+", choices=SKIPPABLE, metavar="FIGURE",
                   help="leave out the slow searches, e.g. to time steps on a short GPU "
                        f"lease: {', '.join(SKIPPABLE)} (their columns stay empty)")
    # Worker mode (internal).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--peak", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--capacity", type=int, default=3 << 30, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    parse_options(args.option)   # a malformed pair stops here, before any run
    if args.worker:
        worker_main(args)
        return 0

    from pyalloc.bench.models import TASKS
    try:
        from tqdm import tqdm
    except ImportError:   # the progress bar is a nicety; the figures do not need it
        def tqdm(items, **_):
            class Bar(list):
                def __enter__(self): return self
                def __exit__(self, *a): pass
                def set_description(self, text): print(text, flush=True)
            return Bar(items)

    tasks = args.tasks or ["mlp", "mlp_small", "cnn", "transformer"]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:   # before any run: found after the others' trials, it lost all their figures
        p.error(f"unknown task(s): {', '.join(unknown)}; known: {', '.join(TASKS)}")
    capacity = (70 << 30) if args.device == "cuda" else (3 << 30)
    results: List[Dict[str, Any]] = []
    started = time.time()
    jobs = [(t, c) for t in tasks for c in args.configs]
    peaks: Dict[str, Optional[int]] = {}
    with tqdm(jobs, unit="run") as bar:
        for task, config in bar:
            bar.set_description(f"{task}/{config}")
            batch = args.batch or TASKS[task].default_batch
            r = run_worker(task, config, args.device, batch, args.steps,
                           peaks.get(task) if config != "baseline" else None, capacity,
                           args.option, args.skip)
            if config == "baseline":
                peaks[task] = r.get("peak")
            r["batch"] = batch
            results.append(r)
            # Written after every run, so an interrupted benchmark keeps what it measured.
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "bench_remat.partial.json").write_text(json.dumps(results, indent=1))
    import torch

    meta = {"device": args.device, "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - started),
            "command": "python tools/bench_remat.py " + " ".join(argv or sys.argv[1:])}
    if args.device == "cuda" and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_remat.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    md = table(results)
    (out / "bench_remat.md").write_text(
        f"{meta}\n\n{md}\n")
    print(json.dumps(meta))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
