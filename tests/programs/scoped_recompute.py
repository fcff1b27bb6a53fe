"""The scoped form, ``with pyalloc.recompute()``: what the program keeps is resident after it.

tests/test_remat.py runs it as ``python tests/programs/scoped_recompute.py --budget 40MiB``
(and with 2GiB, unconstrained). It trains a small MLP three steps, each inside its own
block, and checks after each that the logits the program still holds are resident again.
It prints, per step, ``logits <sum of the logits as float.hex()> recomputes <n>``.
"""
from __future__ import annotations

import argparse

import torch

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", required=True, help='the budget, such as "40MiB"')
    args = parser.parse_args()
    pyalloc.install(device="cpu", budget=args.budget)
    from pyalloc.bench.models import mlp

    torch.manual_seed(0)
    model = mlp(256, 6)
    x = torch.randn(4096, 256)
    for _ in range(3):
        with pyalloc.recompute() as reg:
            logits = model(x)
            logits.sum().backward()
        # Outside the block nothing intercepts reads: what the program still holds is resident.
        assert logits.untyped_storage().nbytes() == logits.numel() * 4
        print("logits", logits.double().sum().item().hex(),
              "recomputes", reg.stats()["recomputes"])
        model.zero_grad()


if __name__ == "__main__":
    main()
