"""The pluggable entry point pyalloc_free survives bad pointers, warns, and counts them.

tests/test_bad_input.py runs it as ``python tests/programs/pluggable_free_bad_pointers.py
--stderr PATH`` (in a process of its own: it needs pyalloc_install, which is one-way). It
sends what the library writes to fd 2 into PATH, installs through the C API, and frees an
unknown pointer, a pointer twice, one with the wrong size, an interior pointer, NULL, and
pointers on devices pyalloc has no engine for. pyalloc_malloc throws on failure (fatal
through ctypes), so it is only called where it succeeds. Prints, last, a JSON object:
``invalid`` frees counted, ``allocated_then``, ``q_intact`` (the block freed with the
wrong size kept its bytes), then ``allocated_after`` and ``invalid_after`` once the
right frees are made.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stderr", required=True, help="file to send fd 2 to")
    args = parser.parse_args()
    # Capture what the library writes to fd 2 (the test reads stdout only).
    fd = os.open(args.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    from pyalloc import Engine, _lib

    lib = _lib.lib()
    assert lib.pyalloc_install(b"host", b"budget:64MiB") == 0, _lib.last_error()
    p = lib.pyalloc_malloc(4096, 0, None)
    q = lib.pyalloc_malloc(1000, 0, None)
    keep = lib.pyalloc_malloc(3 << 20, 0, None)
    ctypes.memset(q, 0x33, 1000)
    lib.pyalloc_free(0x1000, 16, 0, None)     # unknown pointer
    lib.pyalloc_free(p, 4096, 0, None)        # fine
    lib.pyalloc_free(p, 4096, 0, None)        # double free
    lib.pyalloc_free(q, 999, 0, None)         # wrong size: q stays allocated
    lib.pyalloc_free(q + 512, 1000, 0, None)  # interior pointer
    lib.pyalloc_free(None, 0, 0, None)        # NULL: a no-op, as free(NULL)
    lib.pyalloc_free(q, 1000, 7, None)        # a device pyalloc has no engine for
    lib.pyalloc_free(q, 1000, -1, None)       # a device index out of range
    engine = Engine._wrap(lib.pyalloc_installed_engine(0))
    engine.check_invariants()
    stats = engine.stats()
    still = ctypes.string_at(q, 1000) == b"\x33" * 1000
    lib.pyalloc_free(q, 1000, 0, None)        # the right size frees it
    lib.pyalloc_free(keep, 3 << 20, 0, None)
    engine.check_invariants()
    after = engine.stats()
    print(json.dumps({"invalid": stats["num_invalid_frees"],
                      "allocated_then": stats["allocation.all.current"],
                      "q_intact": still,
                      "allocated_after": after["allocation.all.current"],
                      "invalid_after": after["num_invalid_frees"]}))


if __name__ == "__main__":
    main()
