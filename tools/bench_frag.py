#!/usr/bin/env python3
"""Fragmentation benchmark: how much of the reserved memory holds data, and which requests

A command-line entry point: the program is :mod:`pyalloc.bench.frag` (``--help`` says the
rest), run here as ``python tools/bench_frag.py`` or anywhere as ``python -m pyalloc.bench.frag``.
"""
from pyalloc.bench.frag import main

if __name__ == "__main__":
    raise SystemExit(main())
