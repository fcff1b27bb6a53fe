"""A stitched range a side stream still writes is unmapped only after that stream is done.

tests/test_frag.py runs it as ``python tests/programs/stitched_range_side_stream.py`` (in
a process of its own because the failure it guards against is a crash: a write landing on
an unmapped range). On an engine of the simulated device it stitches a 12 MiB range from
the holes between 4 MiB blocks, records a slowed side stream on it, queues a fill there and
frees the range: the free must wait for the stream, and the fill must land in the pieces.
Prints ``ok`` at the end.
"""
from __future__ import annotations

import ctypes

from pyalloc import Engine


def main() -> None:
    engine = Engine("host", budget="40MiB", sim_capacity="256MiB")
    side = engine.create_stream()
    blocks = [engine.alloc(4 << 20) for _ in range(10)]
    for ptr in blocks[1::2]:
        engine.free(ptr)
    big = engine.alloc(12 << 20)
    pieces = engine.snapshot()["stitched"][0]["pieces"]
    engine.record_stream(big, side)
    engine.set_stream_delay(side, 200_000)
    engine.fill_async(side, big, 12 << 20, 0xEE)
    blocked = engine.blocked_ns()
    engine.free(big)
    assert engine.blocked_ns() > blocked            # it waited for the side stream
    assert engine.stats()["retired_stitched_ranges"] == 0
    for address, size in pieces:                     # the write landed, in the pieces
        assert ctypes.string_at(address, size) == b"\xee" * size
    for ptr in blocks[0::2]:
        engine.free(ptr)
    engine.check_invariants()
    print("ok")


if __name__ == "__main__":
    main()
