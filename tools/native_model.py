#!/usr/bin/env python3
"""A model of PyTorch's native CUDA caching allocator, to replay traces where no GPU is.

A command-line entry point: the program is :mod:`pyalloc.bench.native_model` (``--help`` says the
rest), run here as ``python tools/native_model.py`` or anywhere as ``python -m pyalloc.bench.native_model``.
"""
from pyalloc.bench.native_model import main

if __name__ == "__main__":
    raise SystemExit(main())
