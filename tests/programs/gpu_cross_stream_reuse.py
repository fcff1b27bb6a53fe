"""Blocks reused across four CUDA streams are never clobbered.

tests/test_gpu.py runs it as ``python tests/programs/gpu_cross_stream_reuse.py`` (needs a
GPU). 3000 random steps fill tensors of random sizes on random streams and check, on the
stream each was made on, that it still holds its value before dropping it. Prints
``fences <n> retries <n>``.
"""
from __future__ import annotations

import random

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cuda", budget="512MiB")
    rng = random.Random(0)
    streams = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(3)]
    live = []
    for i in range(3000):
        if live and (len(live) > 40 or rng.random() < 0.45):
            t, value, s = live.pop(rng.randrange(len(live)))
            with torch.cuda.stream(s):
                assert bool((t == value).all()), f"block clobbered at step {i}"
            continue
        s = rng.choice(streams)
        n = rng.choice([1 << 10, 1 << 16, 1 << 20, 3 << 20, 9 << 20]) // 4
        with torch.cuda.stream(s):
            t = torch.full((n,), float(i), device="cuda")
        live.append((t, float(i), s))
    torch.cuda.synchronize()
    stats = pyalloc.memory_stats()
    pyalloc.check_invariants()
    print("fences", stats["num_stream_fences"], "retries", stats["num_alloc_retries"])


if __name__ == "__main__":
    main()
