"""INPLACE_UPDATE mode (pyalloc/inplace.py): parameters, gradients and optimizer state in the
persistent region, updated in place.

Each case trains a model twice in fresh processes, mode off and mode on, with the same
seeds: losses, parameters, buffers and optimizer state must be equal bit for bit. With the
mode on, every allocation inside ``optimizer.step()`` after the first step is recorded (the
engine's trace): none may be larger than the smallest block (512 bytes: the CPU scalars
PyTorch wraps Python numbers in, which on the simulated device go through the engine too).
Parameters, gradients and state must sit in ``persistent`` segments, at the same addresses
every step.
"""
from __future__ import annotations

import pytest

from conftest import run_program, training_record


def run(task: str, optimizer: str, mode: bool, batch: int) -> str:
    """tests/programs/inplace_update_training.py's output; ``optimizer`` names one of its
    OPTIMIZERS."""
    return run_program("inplace_update_training", "--task", task, "--batch", batch,
                       "--optimizer", optimizer, "--inplace-update", str(mode).lower())


@pytest.mark.slow
@pytest.mark.parametrize("task,batch,optimizer", [
    ("cnn", 32, "sgd"), ("cnn", 32, "adam"), ("transformer", 16, "adamw"),
    ("mlp", 512, "sgd-plain"), ("mlp", 512, "adam-maximize"),
    ("cnn", 32, "sgd-foreach"), ("cnn", 32, "adam-foreach"), ("transformer", 16, "adamw-foreach"),
    ("cnn", 32, "adam-foreach-channels-last"),
])
def test_inplace_update_trains_identically_with_no_parameter_sized_allocation(
        task, batch, optimizer):
    off = run(task, optimizer, False, batch)
    on = run(task, optimizer, True, batch)
    assert training_record(on) == training_record(off)
    assert len(training_record(on)) == 7
    largest = eval(on.split("largest allocation in step")[1].splitlines()[0])
    assert all(size <= 512 for size in largest[1:]), largest   # steady state
    assert "same addresses True" in on
    assert "in persistent True" in on
    assert "persistent segments hold no activation True" in on
    # Without the mode PyTorch's step allocates parameter-sized temporaries (Adam's
    # denominators, SGD's weight-decayed gradient): the count above is not vacuous.
    if optimizer not in ("sgd-plain", "adam-maximize"):
        off_largest = eval(off.split("largest allocation in step")[1].splitlines()[0])
        assert max(off_largest[1:]) > 512, off_largest


@pytest.mark.slow
def test_other_optimizers_run_pytorchs_step_in_the_persistent_region():
    out = run_program("inplace_other_optimizers")
    assert "state persistent True" in out and "grad kept True" in out


def test_persistent_region_is_apart_from_activations():
    out = run_program("inplace_persistent_region")
    assert "'a': 'small'" in out and "'b': 'small'" in out
    assert "'p': 'persistent'" in out and "'q': 'persistent'" in out
