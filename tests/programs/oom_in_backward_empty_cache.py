"""empty_cache() after an out-of-memory error in backward frees what the failed step left.

tests/test_remat.py runs it as ``python tests/programs/oom_in_backward_empty_cache.py``.
It trains the zoo's UNet two steps under ``policy="recompute"``, lowers the budget below
what the model trains in (above its floor), so that the next step runs out of memory in
backward (``oom``), then drops the step's gradients, runs any backward, collects garbage
and empties the cache, and prints ``held <bytes allocated beyond what the model held
before the failed step>``.
"""
from __future__ import annotations

import gc

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", policy="recompute")
    from pyalloc.bench import zoo  # noqa: F401  (adds the zoo_* tasks)
    from pyalloc.bench.models import TASKS

    task = TASKS["zoo_unet"]
    torch.manual_seed(0)
    model = task.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = task.batch(task.default_batch, torch.Generator().manual_seed(1))

    def step():
        opt.zero_grad(set_to_none=True)
        task.loss(model, x, y).backward()
        opt.step()

    step()
    step()
    engine = pyalloc._engine(None)
    before = engine.stats()["allocated_bytes.all.current"]
    # Above its floor (0.27), below what it trains in: out of memory in backward.
    engine.set_budget(int(0.28 * engine.stats()["reserved_bytes.all.peak"]))
    try:
        step()
    except torch.OutOfMemoryError:
        print("oom")
    opt.zero_grad(set_to_none=True)
    # Autograd leaves the failed pass's pending tasks (their gradients, the graph's saved
    # tensors) in this thread's ready queue until the thread's next backward drains them;
    # that is PyTorch's, not pyalloc's, and any backward releases it.
    torch.ones(1, requires_grad=True).sum().backward()
    gc.collect()
    pyalloc.empty_cache()
    print("held", engine.stats()["allocated_bytes.all.current"] - before)


if __name__ == "__main__":
    main()
