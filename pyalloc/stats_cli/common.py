"""What every subcommand shares: the user-error type, loading input files, checking
output paths, and formatting bytes and ratios."""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

from .. import files
from .analysis import MalformedDocument, validate_document

PROG = "pyalloc-stats"


class CliError(Exception):
    """A user error: printed as one line ``pyalloc-stats: error: <message>``, exit code 2."""


def load_document(path: str) -> Dict[str, Any]:
    """Loads a snapshot or trace through :func:`pyalloc.files.load` and checks its shape.

    Every way a file can be unreadable becomes a :class:`CliError` naming the file, so
    the subcommands can trust the document they get.
    """
    try:
        doc = files.load(path)
    except files.FileFormatError as e:
        raise CliError(str(e)) from None
    # files.load lets these through: a gzip stream corrupt in the middle (zlib), JSON
    # whose bytes are not UTF-8, a file we may not read, nesting deep enough to recurse.
    except zlib.error as e:
        raise CliError(f"{path}: gzip data is corrupt ({e})") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a pyalloc file (not UTF-8 JSON)") from None
    except RecursionError:
        raise CliError(f"{path}: not a pyalloc file (JSON nested too deeply)") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        validate_document(doc)
    except MalformedDocument as e:
        raise CliError(f"{path}: {e}") from None
    return doc


def check_output_path(path: str, suffixes: Optional[Iterable[str]] = None) -> Path:
    """Fails early, before any work, when ``path`` cannot be written or has the wrong suffix."""
    out = Path(path)
    if suffixes is not None:
        allowed = tuple(suffixes)
        if out.suffix.lower() not in allowed:
            raise CliError(
                f"{path}: unknown output type {out.suffix or '(no suffix)'!r}; "
                f"use one of {', '.join(allowed)}")
    if out.is_dir():
        raise CliError(f"{path}: is a directory; give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"{path}: cannot write: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise CliError(f"{path}: cannot write: permission denied")
    return out


def write_output(path: Path, data: bytes) -> None:
    """Writes beside the target and renames, so a failed run leaves no half file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CliError(f"{path}: cannot write: {e.strerror or e}") from None


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: Optional[float]) -> str:
    """``1536`` → ``"1.50 KiB"``; exact below 1 KiB; ``None`` → ``"-"``."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_power_of_two(n: int) -> str:
    """Bucket bounds are powers of two, so they print without decimals: ``2 MiB``."""
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            return f"{n} {unit}"
        n //= 1024
    raise AssertionError("unreachable")


def format_ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_address(address: int) -> str:
    return f"0x{address:x}"
