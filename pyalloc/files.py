"""Reading and writing pyalloc's snapshot and trace files (docs/formats.md).

Every reader goes through :func:`load`, which turns a missing, truncated or foreign file
into a :class:`FileFormatError` whose message names the file and what is wrong with it.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Optional, Union

SNAPSHOT = "pyalloc-snapshot"
TRACE = "pyalloc-trace"
VERSION = 1

PathLike = Union[str, "os.PathLike[str]"]


class FileFormatError(ValueError):
    """A file is not a readable pyalloc snapshot or trace."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def save(path: PathLike, document: Dict[str, Any]) -> Path:
    """Writes ``document`` as JSON (gzip when the name ends in .gz), atomically."""
    path = Path(path)
    data = json.dumps(document, separators=(",", ":")).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, compresslevel=6)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target and rename, so a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: PathLike, expect: Optional[str] = None) -> Dict[str, Any]:
    """Reads a snapshot or trace; ``expect`` restricts it to one of the two formats."""
    path = Path(path)
    if not path.exists():
        raise FileFormatError(f"{path}: no such file")
    if path.is_dir():
        raise FileFormatError(f"{path}: is a directory, not a pyalloc snapshot or trace")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise FileFormatError(f"{path}: cannot be read ({e.strerror or e})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise FileFormatError(f"{path}: gzip data is truncated or corrupt ({e})") from None
    if not raw.strip():
        raise FileFormatError(f"{path}: the file is empty")
    if raw[:1] not in (b"{", b"[", b" ", b"\n", b"\t", b"\r"):
        raise FileFormatError(
            f"{path}: not a pyalloc file (it is not JSON; a PyTorch memory snapshot .pickle "
            "can be viewed at pytorch.org/memory_viz, not read here)")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        hint = " — the file looks truncated" if e.pos >= len(raw.rstrip()) - 1 else ""
        raise FileFormatError(f"{path}: invalid JSON at byte {e.pos}: {e.msg}{hint}") from None
    except UnicodeDecodeError:
        raise FileFormatError(f"{path}: not UTF-8 text, so not a pyalloc file") from None
    except RecursionError:
        raise FileFormatError(f"{path}: JSON nested too deeply to be a pyalloc file") from None
    if not isinstance(doc, dict) or "format" not in doc:
        raise FileFormatError(
            f"{path}: JSON, but not a pyalloc snapshot or trace (no \"format\" key)")
    fmt = doc["format"]
    if fmt not in (SNAPSHOT, TRACE):
        raise FileFormatError(f"{path}: unknown format {fmt!r}; expected {SNAPSHOT!r} or {TRACE!r}")
    if expect is not None and fmt != expect:
        raise FileFormatError(f"{path}: is a {fmt}, but a {expect} is needed here")
    version = doc.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise FileFormatError(
            f"{path}: {fmt} version {version!r} is newer than this pyalloc reads "
            f"(version {VERSION}); upgrade pyalloc")
    required = ("segments",) if fmt == SNAPSHOT else ("events", "columns", "final")
    missing = [k for k in required if k not in doc]
    if missing:
        raise FileFormatError(f"{path}: {fmt} is missing {', '.join(missing)}")
    return doc


def final_snapshot(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The snapshot a document describes: itself, or a trace's final state."""
    return doc if doc["format"] == SNAPSHOT else doc["final"]["snapshot"]


def final_stats(doc: Dict[str, Any]) -> Dict[str, Any]:
    return doc.get("stats", {}) if doc["format"] == SNAPSHOT else doc["final"]["stats"]
