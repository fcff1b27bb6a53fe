"""Prints the engine's options table as Markdown, or rewrites it in docs/design.md.

    python tools/options_table.py                          # print it
    python tools/options_table.py --write docs/design.md   # replace it between its markers

The table itself is PYALLOC_OPTIONS in allocator/src/options.h; tests/test_readme.py checks
that docs/design.md carries it as this prints it.
"""
from pyalloc.options import main

if __name__ == "__main__":
    raise SystemExit(main())
