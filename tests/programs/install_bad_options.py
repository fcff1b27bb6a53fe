"""install() refuses bad options with a ValueError that names the option.

tests/test_remat.py and tests/test_swap.py run it as::

    python tests/programs/install_bad_options.py '{"policy": "swapp"}' '{"prefetch": "-2"}'

For each JSON object of options it calls ``pyalloc.install(device="cpu", **options)``,
which must raise ValueError (the first install that succeeded would end the program's use:
install() is one-way), and prints the error's message.
"""
from __future__ import annotations

import argparse
import json

import pyalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("options", nargs="+", type=json.loads,
                        help="install() options, one JSON object per attempt")
    for options in parser.parse_args().options:
        try:
            pyalloc.install(device="cpu", **options)
        except ValueError as e:
            print(e)


if __name__ == "__main__":
    main()
