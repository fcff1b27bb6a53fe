"""The stats publisher writes the installed engine's stats to a file while the program runs.

tests/test_trace_replay.py runs it as ``python tests/programs/stats_publisher.py
--stats-file PATH`` and then reads PATH itself (the publisher writes once more at exit).
It installs with ``stats_interval=0.05``, allocates 3 MiB, waits 0.3 s and checks that
PATH holds a pyalloc-stats document counting the allocation.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stats-file", required=True, help="install()'s stats_file")
    path = parser.parse_args().stats_file
    pyalloc.install(device="cpu", budget="256MiB", stats_file=path, stats_interval=0.05)
    x = torch.empty(3 << 20, dtype=torch.uint8)  # noqa: F841  (live while published)
    time.sleep(0.3)
    with open(path) as f:
        doc = json.load(f)
    assert (doc["format"] == "pyalloc-stats"
            and doc["stats"]["allocated_bytes.all.current"] >= 3 << 20)


if __name__ == "__main__":
    main()
