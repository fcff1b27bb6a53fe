"""Prints the budget install() chose: from PYALLOC_CONF, or a keyword argument over it.

tests/test_torch_sim.py runs it with PYALLOC_CONF set, as
``python tests/programs/print_budget.py`` (install with no budget: PYALLOC_CONF's is
used) and ``python tests/programs/print_budget.py --budget 50%`` (the keyword argument
wins, a fraction of the device's memory). Prints ``<budget_bytes> <device_total_bytes>``.
"""
from __future__ import annotations

import argparse

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default=None,
                        help="install()'s budget argument (default: none given)")
    budget = parser.parse_args().budget
    if budget is None:
        pyalloc.install(device="cpu")
    else:
        pyalloc.install(device="cpu", budget=budget)
    s = pyalloc.memory_stats()
    print(s["budget_bytes"], s["device_total_bytes"])


if __name__ == "__main__":
    main()
