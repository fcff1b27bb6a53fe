"""pyalloc_free stops repeating its warning about invalid frees after ten, and counts them all.

tests/test_bad_input.py runs it as ``python tests/programs/pluggable_free_warning_limit.py
--stderr PATH`` (in a process of its own: it needs pyalloc_install, which is one-way) and
reads the warnings the library wrote to fd 2 from PATH. It frees 1000 pointers pyalloc
never allocated and checks that the engine counted each.
"""
from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stderr", required=True, help="file to send fd 2 to")
    args = parser.parse_args()
    fd = os.open(args.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    from pyalloc import Engine, _lib

    lib = _lib.lib()
    assert lib.pyalloc_install(b"host", b"budget:64MiB") == 0, _lib.last_error()
    for i in range(1000):
        lib.pyalloc_free(0x1000 + 512 * i, 16, 0, None)
    engine = Engine._wrap(lib.pyalloc_installed_engine(0))
    assert engine.stats()["num_invalid_frees"] == 1000
    engine.check_invariants()


if __name__ == "__main__":
    main()
