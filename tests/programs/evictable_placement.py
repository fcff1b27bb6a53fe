"""The registry marks what it records evictable only under the evictable_placement option.

tests/test_evictor.py runs it as ``python tests/programs/evictable_placement.py
--placement true`` (and ``false``). Under ``policy="recompute"`` a small MLP's 256 KiB
activations land in small segments of the evictable class with the option, in none
without it. Prints ``evictable segments <bool>`` (whether any small segment is of the
evictable class after the forward).
"""
from __future__ import annotations

import argparse

import torch

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placement", choices=["true", "false"], required=True,
                        help="the evictable_placement option")
    args = parser.parse_args()
    pyalloc.install(device="cpu", policy="recompute", evictable_placement=args.placement)
    from pyalloc.bench.models import mlp

    model = mlp(256, 4)
    x = torch.randn(256, 256)
    loss = model(x).square().mean()
    kinds = {s["evictable_class"] for s in pyalloc.snapshot()["segments"]
             if s["segment_type"] == "small"}
    loss.backward()
    print("evictable segments", True in kinds)


if __name__ == "__main__":
    main()
