"""Helpers shared by the engine tests: the size classes of allocator/src/block.h, and
patterns written into blocks so that any overlap or early reuse reads back wrong."""
from __future__ import annotations

import ctypes
import random
from typing import Any, Dict, Iterator, List, Tuple

KiB = 1 << 10
MiB = 1 << 20

# The size classes of allocator/src/block.h, restated so tests compute expectations
# independently of the engine.
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB        # <= this: small pool
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB    # segment for requests in (1 MiB, 10 MiB)
MIN_LARGE_ALLOC = 10 * MiB  # >= this: a segment of its own, rounded to 2 MiB
ROUND_LARGE = 2 * MiB
SIZE_MAX = (1 << 64) - 1


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else round_up(size, MIN_BLOCK)


def pool_of(size: int) -> str:
    return "small" if round_size(size) <= SMALL_SIZE else "large"


def segment_size_for(size: int) -> int:
    """The segment a cache miss for ``size`` bytes creates when the budget is not tight."""
    rounded = round_size(size)
    if rounded <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return round_up(rounded, ROUND_LARGE)


# --- patterns --------------------------------------------------------------------------

WHOLE_LIMIT = 64 * KiB
PIECE = 4 * KiB


def regions(size: int) -> List[Tuple[int, int]]:
    """(offset, length) pairs checked in a block: all of it when small, else 4 KiB at the
    start, the middle and the end."""
    if size <= WHOLE_LIMIT:
        return [(0, size)] if size else []
    return [(0, PIECE), (size // 2 - PIECE // 2, PIECE), (size - PIECE, PIECE)]


def pattern_bytes(tag: int, offset: int, length: int) -> bytes:
    return random.Random(tag * 1_000_003 + offset).randbytes(length)


def write_pattern(ptr: int, size: int, tag: int) -> None:
    for off, length in regions(size):
        ctypes.memmove(ptr + off, pattern_bytes(tag, off, length), length)


def pattern_mismatch(ptr: int, size: int, tag: int) -> str:
    """'' when the block at ptr holds its pattern, else where it differs."""
    for off, length in regions(size):
        got = ctypes.string_at(ptr + off, length)
        want = pattern_bytes(tag, off, length)
        if got != want:
            first = next(i for i in range(length) if got[i] != want[i])
            return (f"block 0x{ptr:x} ({size} bytes, tag {tag}): byte {off + first} is "
                    f"0x{got[first]:02x}, expected 0x{want[first]:02x}")
    return ""


def assert_pattern(ptr: int, size: int, tag: int) -> None:
    problem = pattern_mismatch(ptr, size, tag)
    assert not problem, problem


# --- snapshot --------------------------------------------------------------------------

def blocks(engine: Any) -> Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(segment, block) pairs in address order."""
    for seg in engine.snapshot()["segments"]:
        for block in seg["blocks"]:
            yield seg, block


def block_at(engine: Any, ptr: int) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    for seg, block in blocks(engine):
        if block["address"] == ptr:
            return seg, block
    raise AssertionError(f"no block starts at 0x{ptr:x}")


def segment_of(engine: Any, ptr: int) -> Dict[str, Any]:
    return block_at(engine, ptr)[0]
