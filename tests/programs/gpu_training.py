"""Trains a small MLP on a GPU, under pyalloc or PyTorch's own CUDA allocator.

tests/test_gpu.py runs it as ``python tests/programs/gpu_training.py --pyalloc`` and
without the flag, and compares the two: every loss and the parameters must match bit for
bit. It prints ``loss <float.hex()>`` per step and ``params <sha256>``; under pyalloc it
also checks the stats against the live parameters and the invariants and prints
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
                        help="install pyalloc first (budget 4GiB); without it PyTorch's own "
                             "allocator serves the run")
    args = parser.parse_args()
    if args.pyalloc:
        import pyalloc

        pyalloc.install(device="cuda", budget="4GiB")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Dropout(0.1),
                          nn.Linear(1024, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 256, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print("loss", loss.item().hex())
    print_param_digest(model)
    if args.pyalloc:
        s = pyalloc.memory_stats()
        live = sum(p.numel() * p.element_size() for p in model.parameters())
        assert s["allocated_bytes.all.current"] >= live, s
        assert s["reserved_bytes.all.current"] <= 4 << 30
        pyalloc.check_invariants()
        print("served", s["allocation.all.allocated"])


if __name__ == "__main__":
    main()
