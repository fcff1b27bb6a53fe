#!/usr/bin/env python3
"""Where a training step's time goes under pyalloc's registry: a few steps of one model with

A command-line entry point: the program is :mod:`pyalloc.bench.profile_registry` (``--help`` says the
rest), run here as ``python tools/profile_registry.py`` or anywhere as ``python -m pyalloc.bench.profile_registry``.
"""
from pyalloc.bench.profile_registry import main

if __name__ == "__main__":
    raise SystemExit(main())
