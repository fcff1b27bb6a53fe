"""A process that publishes its stats (stats_file="auto") and exits, for pyalloc-stats watch.

tests/test_stats_cli.py runs it as ``python tests/programs/publish_stats_once.py`` and
then watches the file it left (named by its process id, which it prints last). It holds 3
MiB under a 64 MiB budget when it exits.
"""
from __future__ import annotations

import os

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", budget="64MiB", stats_file="auto")
    import torch

    x = torch.empty(3 << 20, dtype=torch.uint8)  # noqa: F841  (held to the exit)
    print(os.getpid())


if __name__ == "__main__":
    main()
