"""Writing a benchmark's results: the code lives in :mod:`pyalloc.bench_results` (the
console script ``pyalloc-bench`` needs it from an installed package); the scripts beside
this file import it from here."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # pyalloc, from a checkout

from pyalloc.bench_results import sim_device_name, write_results  # noqa: E402,F401
