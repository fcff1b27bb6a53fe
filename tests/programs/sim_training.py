"""Trains a small CNN on the CPU, under pyalloc's simulated device or PyTorch's allocator.

tests/test_torch_sim.py runs it as ``python tests/programs/sim_training.py --pyalloc`` and
without the flag, and compares the two: every loss and the parameters must match bit for
bit. It prints ``loss <float.hex()>`` per step and ``params <sha256>``; under pyalloc it
also checks that the engine served the run's tensors and its invariants, and prints
``served <allocations>``.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from digests import print_param_digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyalloc", action="store_true",
                        help="install pyalloc first (budget 512MiB); without it PyTorch's "
                             "own allocator serves the run")
    args = parser.parse_args()
    if args.pyalloc:
        import pyalloc

        pyalloc.install(device="cpu", budget="512MiB")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(16, 3, 24, 24)
    y = torch.randint(0, 10, (16,))
    for _ in range(6):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print("loss", loss.item().hex())
    print_param_digest(model)
    if args.pyalloc:
        s = pyalloc.memory_stats()
        assert s["num_device_alloc"] > 0 and s["allocation.all.allocated"] > 100, s
        pyalloc.check_invariants()
        print("served", s["allocation.all.allocated"])


if __name__ == "__main__":
    main()
