#!/usr/bin/env python3
"""Allocator latency: nanoseconds per malloc/free pair, pyalloc vs PyTorch's native allocator.

A command-line entry point: the program is :mod:`pyalloc.bench.alloc` (``--help`` says the
rest), run here as ``python tools/bench_alloc.py`` or anywhere as ``python -m pyalloc.bench.alloc``.
"""
from pyalloc.bench.alloc import main

if __name__ == "__main__":
    raise SystemExit(main())
