#!/usr/bin/env python3
"""Swap benchmark: how fast the engine's copies run, and what swapping does to a step.

A command-line entry point: the program is :mod:`pyalloc.bench.swap` (``--help`` says the
rest), run here as ``python tools/bench_swap.py`` or anywhere as ``python -m pyalloc.bench.swap``.
"""
from pyalloc.bench.swap import main

if __name__ == "__main__":
    raise SystemExit(main())
