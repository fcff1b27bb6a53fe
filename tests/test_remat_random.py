"""Randomized programs under the registry: evict anything at any time, read back the same bits.

Hypothesis generates short programs of the ops that trip rematerialization — views and
strided views, in-place ops on fresh and on recorded storages and on their views, buffers
assembled by writes, random ops, indices made from activations, casts and complex views,
no_grad derivations, custom Functions, checkpointing, results the program lets go of —
with "evict everything the registry holds" steps sprinkled between them, and runs each as
two training iterations. Each program runs twice in one process on the simulated device:
plainly, and under ``pyalloc.recompute(min_bytes=0)`` with the evictions; every tensor it
produced must be equal bit for bit, and so must the gradients and the parameters after
each iteration. The generator is reseeded before each run, so random ops draw the same
numbers unless a replay disturbs them.

Under ``policy="swap"`` and ``"hybrid"`` the same programs evict by copying to the host
pool on the simulated device's copy stream (a thread of its own), so a tensor may be
read, written in place or evicted again while its copy is in flight.

The programs are generated and checked by tests/programs/remat_random_programs.py, in a
fresh interpreter (install() is one-way); its docstring lists the vocabulary. Run it by hand
with more examples and another seed when the registry changes, e.g.
``python tests/programs/remat_random_programs.py --policy hybrid --examples 3000 --seed 9
--size 160 --budgets 1,2,3,4,6``.
"""
from __future__ import annotations

import pytest

from conftest import run_program


@pytest.mark.slow
@pytest.mark.parametrize("policy, examples", [("recompute", 300), ("swap", 120), ("hybrid", 120)])
def test_random_programs_read_back_the_same_bits_after_any_eviction(policy, examples):
    out = run_program("remat_random_programs", "--policy", policy, "--examples", examples,
                      timeout=900)
    assert out.strip().endswith("ok")


@pytest.mark.slow
@pytest.mark.parametrize("policy, examples", [("recompute", 200), ("swap", 100), ("hybrid", 100)])
def test_random_programs_under_a_budget_train_the_same_or_run_out_of_memory_cleanly(
        policy, examples):
    # Larger results (100 KiB) under budgets of 2-6 MiB: the engine evicts by itself, at
    # any op, forward or backward. A run that ends in torch.OutOfMemoryError is allowed;
    # any other error, or other bits, is not. (It found a swap-in with no lineage raising a
    # RuntimeError where it was out of memory.)
    out = run_program("remat_random_programs", "--policy", policy, "--examples", examples,
                      "--size", 160, "--budgets", "2,3,4,6", timeout=900)
    assert out.strip().endswith("ok")
