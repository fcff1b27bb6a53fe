"""Trains the transformer on a GPU with AdamW, inplace_update on or off.

tests/test_gpu.py runs it as ``python tests/programs/gpu_inplace_update.py
--inplace-update true`` and ``false`` (needs a GPU; CUBLAS_WORKSPACE_CONFIG set for
deterministic cuBLAS). On CUDA PyTorch's Adam defaults to its foreach kernels, which the
in-place step mirrors with single-tensor arithmetic: the losses must agree bit for bit.
Prints ``loss <float.hex()>`` per step and ``allocations in step [<n per step>]``, the
allocations made inside ``optimizer.step()``.
"""
from __future__ import annotations

import argparse

import torch

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inplace-update", choices=["true", "false"], required=True,
                        help="the install option")
    args = parser.parse_args()
    pyalloc.install(device="cuda", budget="4GiB",
                    inplace_update=args.inplace_update == "true")
    from pyalloc.bench.models import TASKS

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.enabled = False
    task = TASKS["transformer"]
    model = task.build().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = task.batch(16, torch.Generator().manual_seed(1))
    x, y = x.cuda(), y.cuda()
    counts = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model, x, y)
        loss.backward()
        before = pyalloc.memory_stats()["allocation.all.allocated"]
        opt.step()
        counts.append(pyalloc.memory_stats()["allocation.all.allocated"] - before)
        print("loss", loss.item().hex())
    print("allocations in step", counts)


if __name__ == "__main__":
    main()
