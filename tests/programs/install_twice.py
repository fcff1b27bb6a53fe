"""install() with no arguments picks the device and says so; a second install() is refused.

tests/test_torch_sim.py runs it as ``python tests/programs/install_twice.py``; the notice
install() logs goes to stderr, the refusal to stdout as ``second: <message>``.
"""
from __future__ import annotations

import logging

import torch

import pyalloc


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    assert pyalloc.install() == ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        pyalloc.install(device="cpu")
    except RuntimeError as e:
        print("second:", e)


if __name__ == "__main__":
    main()
