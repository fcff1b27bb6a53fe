#!/usr/bin/env python3
"""A model of PyTorch's native CUDA caching allocator, to replay traces where no GPU is.

``bench_frag.py --device cuda`` compares pyalloc with PyTorch's own allocator, with and
without ``expandable_segments``, by replaying each trace through ``torch.empty`` on a GPU.
Without a GPU that comparison cannot run, so this module replays a trace through a
re-implementation of the policy of ``c10/cuda/CUDACachingAllocator.cpp`` (read in the
PyTorch source; ../shared/reference/pytorch_allocator.md, section 2) on one stream:

* sizes round up to 512 B; requests up to 1 MiB go to the small pool (2 MiB segments),
  larger ones to the large pool (20 MiB segments below 10 MiB, else the request rounded
  up to 2 MiB);
* best fit over the pool's free blocks ordered by (size, address); a block splits when
  the rest is at least 512 B (small pool, or any expandable segment) or more than 1 MiB
  (large pool); freed blocks merge with free neighbours of their segment;
* a new segment only where ``reserved + segment size`` stays within the budget (PyTorch's
  ``set_per_process_memory_fraction`` check); when that fails, every cached segment with
  nothing live in it is released (``release_cached_blocks``) and the request is tried
  once more; a second failure is an out-of-memory error;
* with ``expandable=True`` (``expandable_segments:True``) each pool is one segment whose
  address range covers 9/8 of the device; it maps pages (2 MiB small, 20 MiB large) at
  the lowest address where free and unmapped space hold the request, prefers free blocks
  that are not the segment's growable end, and on release unmaps every whole free page.

What it leaves out: streams and events (one stream, nothing in flight), CUDA graphs and
private pools, ``max_split_size_mb``, ``roundup_power2_divisions`` and garbage collection
(all off by default), and where ``cudaMalloc`` places a segment, which the driver does
not say (modelled as the highest free address; it only breaks ties between free blocks
of equal size).

``tests/test_native_model.py`` checks the model against what PyTorch 2.11 did on an H100
(docs/results/bench_frag_h100.json): the same failures, peak reserved and peak allocated
bytes on every pattern with expandable segments and on three of four without (the
fourth within 2 failures and 2 MiB: a tie broken otherwise).

    python tools/native_model.py TRACE [--budget BYTES] [--expandable]
"""
from __future__ import annotations

import argparse
import bisect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

MiB = 1 << 20
MIN_BLOCK = 512              # kMinBlockSize
SMALL_SIZE = 1 * MiB         # kSmallSize: requests up to this go to the small pool
SMALL_BUFFER = 2 * MiB       # kSmallBuffer: small segments, and small expandable pages
LARGE_BUFFER = 20 * MiB      # kLargeBuffer: segments for 1-10 MiB, large expandable pages
MIN_LARGE_ALLOC = 10 * MiB   # kMinLargeAlloc: from here segments are sized to the request
ROUND_LARGE = 2 * MiB        # kRoundLarge
# About an H100 80GB's memory: it sizes expandable segments' address ranges (9/8 of it)
# and bounds what can be mapped; budgets below it are what limit a replay.
H100_BYTES = 85_028_093_952


def round_size(size: int) -> int:
    """Every request becomes a multiple of 512 B, at least 512 B."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """The segment a request that finds no free block would map (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class Block:
    """A range of a segment: allocated, free (cached) or, in an expandable segment,
    unmapped address space."""
    __slots__ = ("ptr", "size", "small", "segment", "prev", "next", "allocated", "mapped")

    def __init__(self, ptr: int, size: int, small: bool, segment: Optional["Expandable"]):
        self.ptr, self.size, self.small, self.segment = ptr, size, small, segment
        self.prev: Optional[Block] = None
        self.next: Optional[Block] = None
        self.allocated = False
        self.mapped = True

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: Optional["Block"], after: Optional["Block"]) -> None:
        """Links this block in between ``before`` and ``after`` (neighbours until now)."""
        self.prev, self.next = before, after
        if before:
            before.next = self
        if after:
            after.prev = self


@dataclass
class Expandable:
    """An expandable segment: an address range, mapped in pages of ``page`` bytes."""
    base: int
    page: int
    size: int


class SortedBlocks:
    """Blocks ordered by a key, as the std::set of the C++ allocator."""

    def __init__(self, key):
        self.key = key
        self.keys: List[Tuple[int, ...]] = []
        self.blocks: List[Block] = []

    def add(self, block: Block) -> None:
        k = self.key(block)
        i = bisect.bisect_left(self.keys, k)
        self.keys.insert(i, k)
        self.blocks.insert(i, block)

    def remove(self, block: Block) -> None:
        i = bisect.bisect_left(self.keys, self.key(block))
        assert self.blocks[i] is block, "a block's key changed while it was in a set"
        del self.keys[i]
        del self.blocks[i]

    def first_at_least(self, key: Tuple[int, ...]) -> int:
        return bisect.bisect_left(self.keys, key)

    def __len__(self) -> int:
        return len(self.blocks)


class AddressSpace:
    """Where cudaMalloc puts a segment. The driver does not say; taking the highest free
    range that holds it is the rule that reproduces most of the H100 figures (module
    docstring). It matters only for ties: free blocks of equal size are used in
    address order."""

    def __init__(self, start: int = 1 << 40):
        self.free: List[Tuple[int, int]] = [(start, 1 << 52)]   # (address, size), sorted

    def take(self, size: int) -> int:
        size = -(-size // ROUND_LARGE) * ROUND_LARGE
        for i in range(len(self.free) - 1, -1, -1):
            addr, length = self.free[i]
            if length >= size:
                self.free[i] = (addr, length - size)
                return addr + length - size
        raise MemoryError("address space exhausted")

    def give(self, addr: int, size: int) -> None:
        size = -(-size // ROUND_LARGE) * ROUND_LARGE
        bisect.insort(self.free, (addr, size))
        merged: List[Tuple[int, int]] = []
        for a, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            elif n:
                merged.append((a, n))
        self.free = merged


class NativeCachingAllocator:
    """PyTorch's DeviceCachingAllocator for one device and one stream, bytes only."""

    def __init__(self, budget: Optional[int] = None, expandable: bool = False,
                 device_bytes: int = H100_BYTES):
        self.budget = budget            # allowed_memory_maximum; None: no fraction set
        self.expandable = expandable
        self.device_bytes = device_bytes
        self.free = {small: SortedBlocks(lambda b: (b.size, b.ptr)) for small in (True, False)}
        self.unmapped = {small: SortedBlocks(lambda b: (b.ptr,)) for small in (True, False)}
        self.addresses = AddressSpace()
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.num_ooms = self.num_alloc_retries = 0

    # --- the public calls -----------------------------------------------------------------
    def malloc(self, nbytes: int) -> Optional[Block]:
        """The block serving ``nbytes``, or None where PyTorch raises OutOfMemoryError."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._free_block(size, small) or self._new_block(size, small)
        if block is None:
            self.release_cached_blocks()
            self.num_alloc_retries += 1
            block = self._new_block(size, small)
        if block is None:
            self.num_ooms += 1
            return None
        rest = block.size - size
        splits = rest >= MIN_BLOCK if small or self.expandable else rest > SMALL_SIZE
        if splits:
            remaining = Block(block.ptr + size, rest, small, block.segment)
            remaining.splice(block, block.next)
            block.size = size
            self.free[small].add(remaining)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free_block(self, block: Block) -> None:
        """Caches ``block`` again, merged with its free neighbours."""
        assert block.allocated, "double free"
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            self._merge(block, neighbour)
        self.free[block.small].add(block)

    def release_cached_blocks(self) -> None:
        """empty_cache(): every segment with nothing in it goes back; in an expandable
        segment, every whole free page is unmapped."""
        for small in (True, False):
            to_unmap = []
            for block in list(self.free[small].blocks):
                if block.segment is not None:
                    to_unmap.append(block)
                elif not block.is_split():
                    self.free[small].remove(block)
                    self.addresses.give(block.ptr, block.size)
                    self.reserved -= block.size
            for block in to_unmap:
                self._unmap(block)
                if not block.mapped and not block.is_split():     # the whole segment goes
                    self.unmapped[small].remove(block)

    def largest_free(self) -> int:
        return max((b.blocks[-1].size for b in self.free.values() if len(b)), default=0)

    # --- finding and making blocks --------------------------------------------------------
    def _free_block(self, size: int, small: bool) -> Optional[Block]:
        """Best fit (get_free_block): the smallest free block that holds ``size``."""
        pool = self.free[small]
        i = pool.first_at_least((size, 0))
        if i == len(pool):
            return None
        if pool.blocks[i].segment is not None:
            # A free block at an expandable segment's unmapped end counts as large as it
            # could grow, so that blocks elsewhere are used first.
            def growable(b: Block) -> int:
                return b.size + (b.next.size if b.next and not b.next.mapped else 0)
            while (pool.blocks[i].segment is not None and i + 1 < len(pool)
                   and growable(pool.blocks[i + 1]) < growable(pool.blocks[i])):
                i += 1
        block = pool.blocks[i]
        pool.remove(block)
        return block

    def _new_block(self, size: int, small: bool) -> Optional[Block]:
        """alloc_block: a new segment, or more of the expandable one, within the budget."""
        if self.budget is not None and self.reserved + segment_size(size) > self.budget:
            return None
        if self.expandable:
            return self._grow(size, small)
        nbytes = segment_size(size)
        block = Block(self.addresses.take(nbytes), nbytes, small, None)
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _grow(self, size: int, small: bool) -> Optional[Block]:
        """try_allocate_expandable_block: map pages at the lowest address where free and
        unmapped blocks side by side hold ``size``."""
        candidate = self._expandable_candidate(size, small)
        if not candidate.mapped and not self._map(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            if not self._map(following, min(size - candidate.size, following.size)):
                return None
            candidate = following     # _map merged the free block before it into it
        self.free[small].remove(candidate)
        return candidate

    def _expandable_candidate(self, size: int, small: bool) -> Block:
        def room_from(b: Optional[Block]) -> int:
            room = 0
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            return room
        for c in list(self.unmapped[small].blocks):
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            if room_from(c) >= size:
                return c
        page = SMALL_BUFFER if small else LARGE_BUFFER
        pages = -(-(self.device_bytes + self.device_bytes // 8) // page)
        segment = Expandable(self.addresses.take(page * pages), page, page * pages)
        block = Block(segment.base, segment.size, small, segment)
        block.mapped = False
        self.unmapped[small].add(block)
        return block

    def _map(self, block: Block, size: int) -> bool:
        """map_block: backs the pages under ``block``'s first ``size`` bytes."""
        segment = block.segment
        end = segment.base + -(-(block.ptr + size - segment.base) // segment.page) * segment.page
        mapped = end - block.ptr
        if self.reserved + mapped > self.device_bytes:
            return False                      # cuMemCreate out of memory
        self.unmapped[block.small].remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(end, block.size - mapped, block.small, segment)
            rest.mapped = False
            rest.splice(block, block.next)
            block.size = mapped
            self.unmapped[block.small].add(rest)
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self.free[block.small].add(block)
        self.reserved += mapped
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return True

    def _unmap(self, block: Block) -> None:
        """unmap_block: gives back the whole pages inside the free ``block``."""
        segment = block.segment
        first = segment.base + -(-(block.ptr - segment.base) // segment.page) * segment.page
        last = segment.base + (block.ptr + block.size - segment.base) // segment.page * segment.page
        if first >= last:
            return
        pool = self.free[block.small]
        pool.remove(block)
        if first > block.ptr:
            before = Block(block.ptr, first - block.ptr, block.small, segment)
            before.splice(block.prev, block)
            pool.add(before)
        if block.ptr + block.size > last:
            after = Block(last, block.ptr + block.size - last, block.small, segment)
            after.splice(block, block.next)
            pool.add(after)
        block.ptr, block.size, block.mapped = first, last - first, False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self.unmapped[block.small].add(block)
        self.reserved -= last - first

    def _merge(self, dst: Block, src: Optional[Block]) -> None:
        """try_merge_blocks: ``src`` joins ``dst`` if it is free and mapped alike."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        (self.free if src.mapped else self.unmapped)[src.small].remove(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next:
                dst.next.prev = dst
        dst.size += src.size


def _drive(model: NativeCachingAllocator, trace: Dict[str, Any],
           hold_last: bool) -> Tuple[int, int, Dict[Any, Block], Optional[Block]]:
    """Runs ``trace``'s events through ``model``: (events, failures, the blocks still
    live at its end, the block the harness still holds with ``hold_last``)."""
    col = {name: trace["columns"].index(name) for name in ("action", "address", "requested")}
    live: Dict[Any, Block] = {}
    held: Optional[Block] = None     # with hold_last: the newest tensor, still referenced
    held_dead = False                # ... and already dropped by the trace (or an oom event)
    events = failures = 0

    def drop(block: Block) -> None:
        nonlocal held_dead
        if block is held:
            held_dead = True
        else:
            model.free_block(block)

    for event in trace["events"]:
        events += 1
        action = event[col["action"]]
        if action in ("alloc", "oom"):
            block = model.malloc(event[col["requested"]])
            if block is None:
                failures += 1
                continue
            if held is not None and held_dead:
                model.free_block(held)
            held, held_dead = (block, False) if hold_last else (None, False)
            if action == "oom":
                drop(block)
            else:
                if event[col["address"]] in live:      # a reused address: the old one goes
                    drop(live[event[col["address"]]])
                live[event[col["address"]]] = block
        elif action in ("free", "free_requested"):
            block = live.pop(event[col["address"]], None)
            if block is not None:
                drop(block)
        elif action == "empty_cache":
            model.release_cached_blocks()
    return events, failures, live, held


def _result(model: NativeCachingAllocator, events: int, failures: int) -> Dict[str, Any]:
    """The figures bench_frag reports, as its GPU harness reads them from PyTorch."""
    cached = model.reserved - model.allocated
    return {"events": events, "failures": failures, "covered_failures": None, "num_stitches": 0,
            "peak_reserved": model.peak_reserved, "peak_allocated": model.peak_allocated,
            "utilization": (model.peak_allocated / model.peak_reserved
                            if model.peak_reserved else 1.0),
            "external_fragmentation": 1 - model.largest_free() / cached if cached > 0 else 0.0,
            "num_alloc_retries": model.num_alloc_retries}


def replay(trace: Dict[str, Any], budget: Optional[int] = None,
           expandable: bool = False) -> Dict[str, Any]:
    """Replays ``trace`` (pyalloc.trace format: alloc and free events, oom and empty_cache)
    through a fresh model capped at ``budget`` bytes: what PyTorch's allocator would
    reserve for it, each block freed where the trace frees it."""
    model = NativeCachingAllocator(budget, expandable)
    events, failures, _, _ = _drive(model, trace, hold_last=False)
    return _result(model, events, failures)


class GpuWorker2026:
    """bench_frag's GPU worker as it ran on the H100 on 2026-11-23, for checking the
    model against what it measured. Two quirks of that harness mattered: the newest
    tensor stayed referenced by a local variable until the next allocation returned,
    whatever the trace freed; and each configuration replayed all its jobs in one
    process, so the last tensor of a job was still held through the job's closing
    ``empty_cache()`` and the next job began with its segment cached (and counted
    against the budget). The harness now frees as the trace does and starts every job
    empty; this class keeps the old behaviour, the only one there are GPU figures for."""

    def __init__(self, expandable: bool = False):
        self.model = NativeCachingAllocator(None, expandable)

    def run(self, trace: Dict[str, Any], budget: int) -> Dict[str, Any]:
        model = self.model
        model.budget = budget
        events, failures, live, held = _drive(model, trace, hold_last=True)
        result = _result(model, events, failures)
        for block in live.values():                 # live.clear()
            if block is not held:
                model.free_block(block)
        model.release_cached_blocks()
        model.peak_reserved, model.peak_allocated = model.reserved, model.allocated
        if held is not None:
            model.free_block(held)
        return result


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a trace file (pyalloc.record_trace, .json or .json.gz)")
    p.add_argument("--budget", type=int, help="bytes (default: the trace's budget_bytes)")
    p.add_argument("--expandable", action="store_true", help="expandable_segments:True")
    args = p.parse_args(argv)
    from pyalloc import files
    trace = files.load(args.trace)
    result = replay(trace, args.budget or trace.get("budget_bytes"), args.expandable)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
