"""Options: one table, defined in the engine (allocator/src/options.h).

Options come from ``PYALLOC_CONF="key:value,key:value"``, from ``PYALLOC_<NAME>=value``
for any one option (``PYALLOC_INPLACE_UPDATE=1``, ``PYALLOC_BUDGET=8GiB``), from
keyword arguments to :func:`pyalloc.install`, and, for install(), from the keys of
PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` that have a pyalloc meaning (:mod:`pyalloc.torch_conf`);
keyword arguments win, then the one-option variables, then ``PYALLOC_CONF``, then
PyTorch's. The engine parses and validates the merged string, so the
rules, defaults and error messages are the same from every entry point.

``python tools/options_table.py`` prints the table as the Markdown docs/design.md carries
(``--write docs/design.md`` replaces it there).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Union

from . import _lib, torch_conf

Budget = Union[int, float, str, None]


def options_table() -> List[Dict[str, str]]:
    """Every option the engine knows: ``name``, ``kind``, ``default`` and ``doc``."""
    return json.loads(_lib.lib().pyalloc_options_table().decode())


def _format_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise TypeError(
            f"pyalloc option {name!r} must be a str, int, float or bool, "
            f"not {type(value).__name__}"
        )
    if "," in text or ":" in text:
        raise ValueError(f"pyalloc option {name!r} has value {text!r}: ',' and ':' are not allowed")
    return text


def env_name(option: str) -> str:
    """The environment variable that sets one option: ``PYALLOC_INPLACE_UPDATE``."""
    return "PYALLOC_" + option.upper()


def format_budget(budget: Budget) -> Optional[str]:
    """``8 << 30`` (bytes), ``0.8`` (fraction of device memory) or ``"8GiB"`` / ``"80%"``."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise TypeError("budget must be bytes (int), a fraction (float) or a string, not bool")
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(f"budget must be positive, got {budget} bytes")
        return str(budget)
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise ValueError(
                f"a float budget is a fraction of device memory and must be in (0, 1], got {budget}"
            )
        return repr(budget)
    return _format_value("budget", budget)


def parse_conf(text: str) -> Dict[str, str]:
    """Splits ``"k:v,k2:v2"``; values are checked later, by the engine."""
    out: Dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError(
                f"malformed PYALLOC_CONF entry {item!r}: expected key:value pairs separated by "
                'commas, e.g. "budget:8GiB,max_split_size:256MiB"'
            )
        out[key.strip()] = value.strip()
    return out


def build_options(budget: Budget = None, overrides: Mapping[str, Any] = (),
                  environ: Optional[Mapping[str, str]] = None,
                  torch_alloc_conf: bool = False) -> str:
    """Merges PYALLOC_CONF, ``budget`` and ``overrides`` and validates the result.

    ``torch_alloc_conf``: also read PyTorch's ``PYTORCH_ALLOC_CONF`` /
    ``PYTORCH_CUDA_ALLOC_CONF``, below everything else (:mod:`pyalloc.torch_conf`).
    Returns the normalized option string the engine will run with. Raises ``ValueError``
    naming the bad key or value and the accepted form.
    """
    env = os.environ if environ is None else environ
    merged: Dict[str, str] = {}
    if torch_alloc_conf:
        merged.update(torch_conf.read(env)[1])
    merged.update(parse_conf(env.get("PYALLOC_CONF", "")))
    known = {row["name"] for row in options_table()}
    for name in known:  # the one-option spellings, PYALLOC_<NAME>
        value = env.get(env_name(name))
        if value is not None:
            merged[name] = value.strip()
    for name, value in dict(overrides).items():
        if name not in known:
            raise ValueError(
                f"unknown pyalloc option {name!r}; known options are: {', '.join(sorted(known))}"
            )
        merged[name] = _format_value(name, value)
    if budget is not None:
        merged["budget"] = format_budget(budget)
    text = ",".join(f"{k}:{v}" for k, v in merged.items())
    normalized = _lib.lib().pyalloc_options_normalize(text.encode())
    if not normalized:
        raise ValueError(_lib.last_error())
    _lib.take_string(normalized)  # validation only; the engine parses `text` itself
    return text


def effective(text: str) -> Dict[str, str]:
    """Every option's value for the option string ``text`` (defaults filled in)."""
    normalized = _lib.lib().pyalloc_options_normalize(text.encode())
    if not normalized:
        raise ValueError(_lib.last_error())
    return parse_conf(_lib.take_string(normalized))


_TABLE_BEGIN = "<!-- options table: generated from allocator/src/options.h by tools/options_table.py -->"
_TABLE_END = "<!-- end of the options table -->"


def markdown_table() -> str:
    """The options table as docs/design.md carries it, between its two markers."""
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for row in options_table():
        doc = row["doc"]
        if row["choices"]:
            doc += f" One of: {row['choices']}."
        doc += f" Environment: `{env_name(row['name'])}`."
        rows.append(f"| `{row['name']}` | `{row['default']}` | {doc.replace('|', '/')} |")
    return "\n".join([_TABLE_BEGIN, *rows, _TABLE_END])


def main(argv: Optional[List[str]] = None) -> int:
    import argparse
    import re
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="tools/options_table.py",
                                     description="Print the options table as Markdown.")
    parser.add_argument("--write", metavar="FILE",
                        help="replace the table between its markers in FILE (docs/design.md)")
    args = parser.parse_args(argv)
    table = markdown_table()
    if not args.write:
        print(table)
        return 0
    path = Path(args.write)
    text = path.read_text()
    pattern = re.compile(re.escape(_TABLE_BEGIN) + ".*?" + re.escape(_TABLE_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no options table between {_TABLE_BEGIN!r} and {_TABLE_END!r}")
    path.write_text(pattern.sub(lambda _: table, text))
    return 0
