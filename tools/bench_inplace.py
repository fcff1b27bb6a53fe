#!/usr/bin/env python3
"""INPLACE_UPDATE benchmark: what the optimizer step allocates, and what the pool looks like,

A command-line entry point: the program is :mod:`pyalloc.bench.inplace` (``--help`` says the
rest), run here as ``python tools/bench_inplace.py`` or anywhere as ``python -m pyalloc.bench.inplace``.
"""
from pyalloc.bench.inplace import main

if __name__ == "__main__":
    raise SystemExit(main())
