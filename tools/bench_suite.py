#!/usr/bin/env python3
"""Head-to-head benchmark suite: PyTorch's own allocator against pyalloc's policies.

A command-line entry point: the program is :mod:`pyalloc.bench.suite` (``--help`` says the
rest), run here as ``python tools/bench_suite.py`` or anywhere as ``python -m pyalloc.bench.suite``.
"""
from pyalloc.bench.suite import main

if __name__ == "__main__":
    raise SystemExit(main())
