#!/usr/bin/env python3
"""Rematerialization benchmark: how little memory, how much batch, at what speed.

A command-line entry point: the program is :mod:`pyalloc.bench.remat` (``--help`` says the
rest), run here as ``python tools/bench_remat.py`` or anywhere as ``python -m pyalloc.bench.remat``.
"""
from pyalloc.bench.remat import main

if __name__ == "__main__":
    raise SystemExit(main())
