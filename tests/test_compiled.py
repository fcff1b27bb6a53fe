"""torch.compile under a policy (pyalloc/compiled.py): compiled regions hold their tensors,
so training with compiled blocks is bit-identical to no policy, and a compiled function
called on an evicted tensor reads it back (before, that read freed memory: a crash)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = Path(__file__).parent / "programs" / "compiled_policy.py"


def run(policy: str, budget: str) -> dict:
    proc = subprocess.run([sys.executable, str(PROGRAM), policy, budget], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_compiled_regions_train_bit_identically_under_recompute_and_swap():
    # 64 MiB is 0.94 of the unconstrained peak (68 MiB): what the compiled regions read and
    # make stays resident for their run, so they bound how far below it a budget can go.
    plain = run("none", "2GiB")
    assert plain["same"] and plain["evictions"] == 0
    for policy in ("recompute", "swap"):
        got = run(policy, "64MiB")
        assert got["made_evicted"], policy   # the compiled call read an evicted tensor
        assert got["same"], policy
        assert got["evictions"] > 0, policy
        assert got["losses"] == plain["losses"], policy
        assert got["digest"] == plain["digest"], policy
        assert "CUDA graph capture is not supported while policy=" in got["capture"], policy


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["recompute", "swap"])
def test_a_compiled_region_holds_the_activations_dynamo_lifts_into_its_graph(policy):
    # Found by tools/user_programs/compiled_model.py: a compiled head reading an eager
    # block's output from a dict it shares with the model (pyalloc/compiled.py, _guard_graphs).
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "programs" /
                                               "compiled_lifted_input.py"), policy],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert proc.stdout.strip().endswith("ok")
