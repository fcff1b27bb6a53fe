"""Randomized programs under the registry: evict anything at any time, read back the same bits.

Hypothesis generates short programs of the ops that trip rematerialization — views and
transposes, in-place ops on fresh and on recorded storages, dropout and other random ops,
matmuls, reductions — with "evict everything the registry holds" steps sprinkled between
them. Each program runs twice in one process on the simulated device: plainly, and under
``pyalloc.recompute(min_bytes=0)`` with the evictions; every tensor it produced must be
equal bit for bit, and so must the gradients of a final backward. The generator is reseeded
before each run, so random ops draw the same numbers unless a replay disturbs them.

Under ``policy="swap"`` and ``"hybrid"`` the same programs evict by copying to the host
pool on the simulated device's copy stream (a thread of its own), so a tensor may be
read, written in place or evicted again while its copy is in flight.

The programs are generated and checked by tests/programs/remat_random_programs.py, in a
fresh interpreter (install() is one-way).
"""
from __future__ import annotations

import pytest

from conftest import run_program


@pytest.mark.slow
@pytest.mark.parametrize("policy, examples", [("recompute", 150), ("swap", 60), ("hybrid", 60)])
def test_random_programs_read_back_the_same_bits_after_any_eviction(policy, examples):
    out = run_program("remat_random_programs", "--policy", policy, "--examples", examples,
                      timeout=900)
    assert out.strip().endswith("ok")
