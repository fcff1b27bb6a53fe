"""install() after CUDA is initialized refuses, says what to do, and installs nothing.

tests/test_gpu.py runs it as ``python tests/programs/gpu_install_after_init.py`` (needs a
GPU) and looks for the advice in what it prints: the error's message.
"""
from __future__ import annotations

import torch

import pyalloc


def main() -> None:
    torch.zeros(1, device="cuda")
    try:
        pyalloc.install(device="cuda")
    except RuntimeError as e:
        print(e)
    assert not pyalloc.is_installed()


if __name__ == "__main__":
    main()
