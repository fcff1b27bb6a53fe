#!/usr/bin/env python3
"""Allocator latency: nanoseconds per malloc/free pair, pyalloc vs PyTorch's native allocator.

Both loops run in native code over the same request sequence, so the figures measure the
allocators, not Python or ctypes:

* pyalloc: ``pyalloc_bench_pairs`` calls the pluggable entry points ``pyalloc_malloc`` /
  ``pyalloc_free`` (exactly what PyTorch calls) in a C++ loop.
* native (GPU only): the same loop over ``c10::cuda::CUDACachingAllocator`` raw_alloc /
  raw_delete, compiled on the fly with ``torch.utils.cpp_extension.load_inline``.

The request sequence models one training step's mix (seeded, so runs are comparable):
55% small tensors (512 B - 256 KiB: biases, norms, scalars), 35% activations
(256 KiB - 8 MiB), 10% large buffers (8 - 64 MiB). A ring of ``--live`` blocks stays
allocated, so every malloc is paired with the free of a block allocated ``live`` steps
earlier, as activations are freed during backward. Steady state: the warm-up fills the
cache, so the timed loop measures the cached path both allocators take in training.

With ``--trace FILE`` it also replays a recorded training trace (``pyalloc.record_trace``,
e.g. the one ``pyalloc-demo`` writes): the run's exact sequence of allocations and frees,
sizes and order, timed through the same entry points. Training repeats the same sizes
every step, which the synthetic mix above deliberately does not.

Usage::

    python tools/bench_alloc.py                 # simulated device (+ GPU when present)
    python tools/bench_alloc.py --trace pyalloc-demo-out/trace.json.gz --json out.json
    python tools/bench_alloc.py --trace cnn.json.gz --options stitch_first:true
"""
from __future__ import annotations

import argparse
import ctypes
import json
import platform
import random
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List


from pyalloc import _lib

_NATIVE_SRC = r"""
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <vector>

double native_pairs(std::vector<int64_t> sizes, int64_t live, int64_t pairs) {
  auto* alloc = c10::cuda::CUDACachingAllocator::get();
  std::vector<void*> ring(live, nullptr);
  auto run = [&](int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      int64_t slot = i % live;
      if (ring[slot]) alloc->raw_delete(ring[slot]);
      ring[slot] = alloc->raw_alloc(static_cast<size_t>(sizes[i % sizes.size()]));
    }
  };
  run(pairs / 10 + live);
  auto start = std::chrono::steady_clock::now();
  run(pairs);
  auto stop = std::chrono::steady_clock::now();
  for (void* p : ring) if (p) alloc->raw_delete(p);
  return std::chrono::duration<double, std::nano>(stop - start).count() / pairs;
}

// The same replay as pyalloc_bench_sequence (csrc/debug_api.cpp), through the native allocator.
double native_sequence(std::vector<int64_t> ops, std::vector<int64_t> slots, int64_t n_slots,
                       int64_t repeats) {
  auto* alloc = c10::cuda::CUDACachingAllocator::get();
  std::vector<void*> live(n_slots, nullptr);
  auto release_all = [&] { for (auto& p : live) { if (p) alloc->raw_delete(p); p = nullptr; } };
  auto run = [&] {
    for (size_t i = 0; i < ops.size(); ++i) {
      void*& p = live[slots[i]];
      if (ops[i] > 0) { if (p) alloc->raw_delete(p); p = alloc->raw_alloc(ops[i]); }
      else if (p) { alloc->raw_delete(p); p = nullptr; }
    }
  };
  run(); release_all();
  auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < repeats; ++r) { run(); release_all(); }
  auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(stop - start).count() / (ops.size() * repeats);
}
"""


def size_mix(n: int, seed: int) -> List[int]:
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> int:
        return int(round(2 ** rng.uniform(lo.bit_length() - 1, hi.bit_length() - 1)))

    sizes = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            sizes.append(log_uniform(512, 256 << 10))
        elif r < 0.90:
            sizes.append(log_uniform(256 << 10, 8 << 20))
        else:
            sizes.append(log_uniform(8 << 20, 64 << 20))
    return sizes


def pyalloc_pairs(device: int, sizes: List[int], live: int, pairs: int) -> float:
    arr = (ctypes.c_size_t * len(sizes))(*sizes)
    out = ctypes.c_double()
    rc = _lib.lib().pyalloc_bench_pairs(device, 0, arr, len(sizes), live, pairs, ctypes.byref(out))
    if rc != 0:
        raise RuntimeError(_lib.last_error())
    return out.value


def trace_sequence(path: Path):
    """(ops, slots, n_slots) from a trace: alloc -> size > 0 into a slot, free -> 0."""
    from pyalloc import files

    doc = files.load(path, expect=files.TRACE)
    col = {name: doc["columns"].index(name) for name in ("action", "address", "requested")}
    ops, slots, free_slots, slot_of = [], [], [], {}
    next_slot = 0
    for event in doc["events"]:
        action, address = event[col["action"]], event[col["address"]]
        if action == "alloc":
            if free_slots:
                slot = free_slots.pop()
            else:
                slot, next_slot = next_slot, next_slot + 1
            slot_of[address] = slot
            ops.append(max(1, event[col["requested"]]))
            slots.append(slot)
        elif action in ("free", "free_requested") and address in slot_of:
            slot = slot_of.pop(address)
            ops.append(0)
            slots.append(slot)
            free_slots.append(slot)
    n_slots = max(slots) + 1 if slots else 0
    return ops, slots, n_slots


def sequence_ns(device: int, ops, slots, n_slots: int, repeats: int) -> float:
    n = len(ops)
    op_arr = (ctypes.c_int64 * n)(*ops)
    slot_arr = (ctypes.c_uint32 * n)(*slots)
    out = ctypes.c_double()
    rc = _lib.lib().pyalloc_bench_sequence(device, 0, op_arr, slot_arr, n, n_slots, repeats,
                                           ctypes.byref(out))
    if rc != 0:
        raise RuntimeError(_lib.last_error())
    return out.value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2_000_000, help="timed pairs per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--live", type=int, default=64, help="blocks kept alive in the ring")
    parser.add_argument("--sizes", type=int, default=4096, help="length of the request sequence")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--trace", type=Path, help="also replay this recorded trace's sequence")
    parser.add_argument("--trace-repeats", type=int, default=50)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--options", default="",
                        help="pyalloc options for the run, as PYALLOC_CONF takes them "
                             "(e.g. stitch_first:true), to time one configuration against "
                             "another; PyTorch's native allocator is unaffected")
    args = parser.parse_args()

    sizes = size_mix(args.sizes, args.seed)
    lib = _lib.lib()
    use_cuda = args.device == "cuda"
    if args.device == "auto":
        use_cuda = lib.pyalloc_has_cuda_backend() and lib.pyalloc_cuda_device_count() > 0
    backend = b"cuda" if use_cuda else b"host"
    # The simulated device must hold the ring: up to live x 64 MiB.
    options = ",".join(o for o in ("" if use_cuda else "sim_capacity:8GiB", args.options) if o)
    if lib.pyalloc_install(backend, options.encode()) != 0:
        raise SystemExit(f"pyalloc: {_lib.last_error()}")

    results: Dict[str, object] = {
        "benchmark": "bench_alloc",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "device": "simulated device (host memory)",
        "pairs": args.pairs,
        "repeats": args.repeats,
        "live": args.live,
        "size_mix": "55% 512B-256KiB, 35% 256KiB-8MiB, 10% 8-64MiB, log-uniform",
        "options": args.options,
    }
    runs = {"pyalloc": [pyalloc_pairs(0, sizes, args.live, args.pairs) for _ in range(args.repeats)]}

    if use_cuda:
        import torch
        from torch.utils.cpp_extension import load_inline

        results["device"] = torch.cuda.get_device_name(0)
        results["torch"] = torch.__version__
        ext = load_inline("pyalloc_bench_native", cpp_sources=[_NATIVE_SRC],
                          functions=["native_pairs", "native_sequence"], with_cuda=True,
                          verbose=False)
        runs["torch_native"] = [ext.native_pairs(sizes, args.live, args.pairs)
                                for _ in range(args.repeats)]

    if args.trace:
        ops, slots, n_slots = trace_sequence(args.trace)
        per_op = [sequence_ns(0, ops, slots, n_slots, args.trace_repeats)
                  for _ in range(args.repeats)]
        results["trace"] = str(args.trace)
        results["trace_ops"] = len(ops)
        results["trace_distinct_sizes"] = len({o for o in ops if o > 0})
        # One malloc and one free per allocation: a pair is two operations.
        runs["pyalloc_trace"] = [2 * v for v in per_op]
        if use_cuda:
            runs["torch_native_trace"] = [
                2 * ext.native_sequence(ops, slots, n_slots, args.trace_repeats)
                for _ in range(args.repeats)]

    table = []
    for name, values in runs.items():
        results[f"{name}_ns_per_pair"] = statistics.median(values)
        results[f"{name}_ns_all"] = values
        table.append((name, statistics.median(values), min(values), max(values)))
    if "torch_native_ns_per_pair" in results:
        results["ratio_pyalloc_over_native"] = (
            results["pyalloc_ns_per_pair"] / results["torch_native_ns_per_pair"])
    if "torch_native_trace_ns_per_pair" in results:
        results["ratio_trace_pyalloc_over_native"] = (
            results["pyalloc_trace_ns_per_pair"] / results["torch_native_trace_ns_per_pair"])

    print(json.dumps(results, indent=2))
    print()
    print(f"device: {results['device']}" + (f", pyalloc options {args.options}" if args.options else ""))
    print(f"{'allocator':<14}{'median ns/pair':>16}{'min':>10}{'max':>10}")
    for name, med, lo, hi in table:
        print(f"{name:<14}{med:>16.1f}{lo:>10.1f}{hi:>10.1f}")
    if "ratio_pyalloc_over_native" in results:
        print(f"pyalloc / native: {results['ratio_pyalloc_over_native']:.2f}x")
    if "ratio_trace_pyalloc_over_native" in results:
        print(f"pyalloc / native on the trace: {results['ratio_trace_pyalloc_over_native']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
