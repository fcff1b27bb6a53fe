#!/usr/bin/env python3
"""The head-to-head benchmark suite, from a checkout: the same program as the console script
``pyalloc-bench`` (the code is :mod:`pyalloc.bench_suite`; ``--help`` says what it measures).

    python tools/bench_suite.py                  # simulated device: cnn, transformer, unet
    python tools/bench_suite.py --device cuda    # resnet50, gpt2, unet_gpu
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # pyalloc, from a checkout

from pyalloc.bench_suite import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
