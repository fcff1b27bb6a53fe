"""The native stress loop on an engine that checks its invariants after every operation.

tests/test_stress.py runs it as ``python tests/programs/stress_check_invariants.py``, in
a process of its own because with check_invariants the engine aborts on a violation.
"""
from __future__ import annotations

from pyalloc import Engine


def main() -> None:
    engine = Engine("host", budget="32MiB", sim_capacity="64MiB", check_invariants=True)
    engine.stress(threads=4, ops=20_000, seed=5, max_size=8 << 20, check_every=0)
    engine.empty_cache()
    engine.close()


if __name__ == "__main__":
    main()
