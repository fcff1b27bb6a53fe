"""Engine.compact on demand moves nothing when it need not or may not, and refuses bad sizes.

tests/test_frag.py runs it as ``python tests/programs/compact_on_demand.py``. On an engine
of the simulated device with no registry (so no callbacks that could move a storage) it
prints ``no callbacks <moved>`` for a request only a move could open, ``fits <moved>``
for one a free block holds, and ``refused <error type>`` for each bad size.
"""
from __future__ import annotations

from pyalloc import Engine


def main() -> None:
    e = Engine("host", budget="64MiB")
    p = e.alloc(4 << 20)
    print("no callbacks", e.compact(30 << 20))      # nothing can move without a registry
    print("fits", e.compact(1 << 20))               # a free block holds it already
    for bad in (0, -1, 2 ** 70, "1MiB"):
        try:
            e.compact(bad)
        except (ValueError, TypeError) as err:
            print("refused", type(err).__name__)
    e.free(p)
    e.check_invariants()


if __name__ == "__main__":
    main()
