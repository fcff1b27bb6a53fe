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
    torch.manual_seed(0)
    by_name[args.check]()
    print("ok")
