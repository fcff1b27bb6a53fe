"""Randomized allocation patterns, as traces :func:`pyalloc.replay.replay` can run.

Fragmentation comes from the order of allocations and frees, not from their sizes alone,
so each pattern is a sequence that real training, or an adversary, produces. All are
seeded; each returns a trace in the format of
:mod:`pyalloc.trace` (synthetic addresses: an id per allocation) with ``budget_bytes``
set, so ``replay(pattern(...))`` runs it under that budget.

* ``growing_batches``: a layered forward/backward whose batch changes every iteration,
  up and down (PyTorch's note on expandable segments: "N -> N+1 creates many slivers").
* ``interleaved``: short-lived blocks with every k-th one kept for a long time, so the
  survivors pin the middle of freed ranges (long-lived tensors between activations).
* ``mixed_sizes``: log-uniform sizes from 512 bytes to 64 MiB with random lifetimes.
* ``checkerboard``: fill the budget with equal blocks, free every other one, then ask for
  blocks twice as large: half the memory is free and, without stitching, none of it fits.

Budgets are ``headroom`` x the pattern's peak live bytes, rounded to 2 MiB chunks.

``bench_frag.py`` replays them; tests/test_frag.py uses them to look for a request that
fails while free memory, counted in whole 2 MiB chunks, would hold it.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, List

MiB = 1 << 20
COLUMNS = ["t_ns", "action", "address", "size", "requested", "stream", "context"]


class _Recorder:
    """Builds the event list; an address is just an allocation's sequence number."""

    def __init__(self) -> None:
        self.events: List[List[Any]] = []
        self.next_id = 1
        self.live: Dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0    # of requested sizes rounded to 512 B (the engine's blocks)

    def alloc(self, size: int) -> int:
        ident = self.next_id
        self.next_id += 1
        self.events.append([len(self.events), "alloc", ident, size, size, 0, 0])
        self.live[ident] = size
        self.live_bytes += -(-size // 512) * 512
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return ident

    def free(self, ident: int) -> None:
        size = self.live.pop(ident)
        self.live_bytes -= -(-size // 512) * 512
        self.events.append([len(self.events), "free", ident, size, size, 0, 0])

    def trace(self, name: str, headroom: float) -> Dict[str, Any]:
        """The trace, under a budget of ``headroom`` x its peak live bytes (2 MiB chunks):
        tight enough that where blocks land decides whether a request fits."""
        for ident in list(self.live):   # end with nothing live
            self.free(ident)
        budget = -(-int(self.peak_bytes * headroom) // (2 * MiB)) * 2 * MiB
        return {"pattern": name, "columns": COLUMNS, "events": self.events,
                "budget_bytes": budget, "options": f"budget:{budget}",
                "peak_live_bytes": self.peak_bytes}


def growing_batches(seed: int = 0, headroom: float = 1.25, iterations: int = 30,
                    layers: int = 12) -> Dict[str, Any]:
    """Forward allocates one activation per layer (kept for backward) plus a transient;
    backward frees them in reverse while allocating gradients. The batch moves by a few
    samples each iteration, so every size changes a little."""
    rng = random.Random(seed)
    r = _Recorder()
    params = [r.alloc(rng.choice([256 * 1024, 1 * MiB, 4 * MiB])) for _ in range(layers)]
    per_sample = [rng.randint(40, 160) * 1024 for _ in range(layers)]
    batch = 64
    for _ in range(iterations):
        batch = max(8, batch + rng.choice([-5, -3, -1, 1, 3, 5, 9]))
        saved = []
        for size in per_sample:
            saved.append(r.alloc(size * batch // 8))
            r.free(r.alloc(size * batch // 16))           # a transient
        for ident, size in zip(reversed(saved), reversed(per_sample)):
            grad = r.alloc(size * batch // 8)
            r.free(ident)
            r.free(grad)
    for ident in params:
        r.free(ident)
    return r.trace("growing_batches", headroom)


def interleaved(seed: int = 0, headroom: float = 1.25, count: int = 3000,
                keep_every: int = 7) -> Dict[str, Any]:
    """Blocks of 1-8 MiB; every ``keep_every``-th one lives ten times longer."""
    rng = random.Random(seed)
    r = _Recorder()
    short: List[int] = []
    long: List[List[int]] = []   # [ident, steps left]
    for i in range(count):
        ident = r.alloc(rng.randint(1, 8) * MiB + rng.randint(0, 4) * 4096)
        if i % keep_every == 0:
            long.append([ident, 10 * keep_every])
        else:
            short.append(ident)
        while len(short) > 6:
            r.free(short.pop(rng.randrange(len(short))))
        for entry in long:
            entry[1] -= 1
        for entry in [e for e in long if e[1] <= 0]:
            r.free(entry[0])
            long.remove(entry)
    return r.trace("interleaved", headroom)


def mixed_sizes(seed: int = 0, headroom: float = 1.25, count: int = 4000,
                cap: int = 320 * MiB) -> Dict[str, Any]:
    """Log-uniform sizes (512 B - 64 MiB), lifetimes of 1-200 allocations, at most ``cap``
    bytes live."""
    rng = random.Random(seed)
    r = _Recorder()
    deaths: List[List[int]] = []   # [when, ident]
    live_bytes = 0
    for i in range(count):
        for entry in [e for e in deaths if e[0] <= i]:
            live_bytes -= r.live[entry[1]]
            r.free(entry[1])
            deaths.remove(entry)
        size = int(2 ** rng.uniform(9, 26))
        if live_bytes + size > cap:
            continue
        ident = r.alloc(size)
        live_bytes += size
        deaths.append([i + rng.randint(1, 200), ident])
    return r.trace("mixed_sizes", headroom)


def checkerboard(seed: int = 0, headroom: float = 1.0, block: int = 4 * MiB,
                 count: int = 60) -> Dict[str, Any]:
    """Equal blocks filling the budget, every other one freed, then requests of twice the
    size: half the budget is free, in holes of half the size asked for."""
    rng = random.Random(seed)
    r = _Recorder()
    idents = [r.alloc(block) for _ in range(count)]
    survivors = []
    for i, ident in enumerate(idents):
        if i % 2:
            r.free(ident)
        else:
            survivors.append(ident)
    big = [r.alloc(2 * block) for _ in range(len(survivors) // 4)]
    for ident in rng.sample(big, len(big)):
        r.free(ident)
    return r.trace("checkerboard", headroom)


PATTERNS: Dict[str, Callable[..., Dict[str, Any]]] = {
    "growing_batches": growing_batches,
    "interleaved": interleaved,
    "mixed_sizes": mixed_sizes,
    "checkerboard": checkerboard,
}
