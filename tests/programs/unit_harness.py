"""Runs one named check of a unit-check program: PyTorch under pyalloc on the simulated device.

A unit-check program (``*_units.py`` beside this module) defines its checks as functions
and ends with ``main([check, ...])``. Run as::

    python tests/programs/remat_units.py random_ops_replay_bit_for_bit

it installs pyalloc (``device="cpu"``, ``budget="2GiB"``; install() is one-way per
process, hence a fresh interpreter per check), seeds PyTorch's generator with 0, runs the
check and prints ``ok`` once it returns. A failed assertion exits non-zero with its
traceback. With ``--device cuda`` the check runs on the GPU instead: pyalloc installed as
PyTorch's CUDA allocator and CUDA made the default device, so the tensors a check creates
without naming a device are on the GPU (tests/test_gpu.py). Not a program itself.
"""
from __future__ import annotations

import argparse
from typing import Callable, Sequence

import torch

import pyalloc


def warm_up_cpu_matmul() -> None:
    """One threaded float32 matmul before the check, outside any policy.

    On a loaded CPU (the Xeon VM with AVX-512, two cores, three such processes at once), the
    first MKL sgemm of a process sometimes gave other bits than every later call with the same
    inputs, in the calling thread's half of the rows only: `tanh(x @ w)` of 1024x1024 operands
    differed from its recomputation in 116,359 elements by up to 9e-5, while the eleven calls
    after it agreed with each other. A check comparing a restored tensor with the process's
    first matmul then failed although the replay was faithful (it matched a fresh
    computation). It was seen only where a policy with a host pool had started before that
    first matmul: 40 of 600 runs; 0 of 150 with recompute and no pool, 0 of 150 with plain
    PyTorch, 0 of 150 with pyalloc installed and no policy, and 0 of 100 with this warm-up
    (notebook, twenty-fifth session; not explained). tests/programs/train.py calls it too,
    before install(), whose policy may start such a pool. A kernel that does not give the same
    bits for the same inputs falls outside the registry's bit-for-bit promise.
    """
    torch.randn(512, 512) @ torch.randn(512, 512)


def main(checks: Sequence[Callable[[], None]]) -> None:
    by_name = {check.__name__: check for check in checks}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=sorted(by_name), help="the check to run")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the simulated device (default); cuda: the GPU")
    args = parser.parse_args()
    pyalloc.install(device=args.device, budget="2GiB")
    if args.device == "cuda":
        torch.set_default_device("cuda")
    else:
        warm_up_cpu_matmul()
    torch.manual_seed(0)
    by_name[args.check]()
    print("ok")
