"""The registry's per-op path (registry/src/dispatch.cpp): a boxed fallback on a dispatch
key, what it sees, and what happens when it cannot have its key.

The training equivalence of the policies is tested in test_remat.py, test_swap.py,
test_remat_random.py and test_unet.py; this file tests the mechanism under them.
"""
from __future__ import annotations

import pytest

from conftest import run_program, run_unit, train


def test_a_dispatch_key_another_library_holds_is_a_clear_error_and_changes_nothing():
    # Another library takes the registry's dispatch key first, as torchdistx's deferred_init
    # would.
    out = run_program("dispatch_key_taken")
    assert "installed after False" in out, out   # the failed install left nothing behind
    refusal = next(line for line in out.splitlines() if line.startswith("refused:"))
    assert "DeferredInit" in refusal and "torchdistx" in refusal
    assert "previous registration" in refusal   # where the other one was registered
    assert 'policy="none"' in refusal           # and what to do
    assert "trained True" in out and "scoped refused too: True" in out


def test_composite_ops_are_seen_through_to_their_pieces():
    # dropout and linear are CompositeImplicitAutograd: what they save for backward (the
    # mask, the matmul's output) is made by the ops they call, which must be nodes.
    run_unit("dispatch_units", "composite_ops_are_seen_through_to_their_pieces")


def test_autocast_casts_are_nodes():
    run_unit("dispatch_units", "autocast_casts_are_nodes")


@pytest.mark.slow
def test_backward_ops_pass_through_the_registry_and_restore_what_they_read():
    run_unit("dispatch_units",
             "backward_ops_pass_through_the_registry_and_restore_what_they_read")


@pytest.mark.slow
def test_python_numbers_replay_as_numbers():
    # PyTorch wraps a Python scalar as a 0-dim tensor marked as a number, which changes type
    # promotion (half * 2.5 stays half); the lineage keeps the number, and replay must wrap
    # it the same way.
    run_unit("dispatch_units", "python_numbers_replay_as_numbers")


@pytest.mark.slow
def test_a_python_dispatch_mode_of_the_program_works_beside_the_registry():
    # The registry sits above the Python key: a mode the program pushes (here pyalloc's own
    # op tagging for traces) sees every op of the program, not the registry's replays (Note
    # [The registry's own ops]), and training stays bit-identical.
    free = train("transformer", "2GiB", steps=3)
    budget = int(0.4 * free["peak"])
    tight = train("transformer", budget, steps=3, policy="recompute",
                  flags=("--record-op-trace",))
    assert tight["record"] == free["record"]
    assert tight["evictions"] > 0 and tight["recomputes"] > 0, tight


@pytest.mark.slow
def test_the_registry_keeps_its_invariants_through_training_and_lets_go_of_what_dies():
    free = train("cnn", "2GiB", steps=3)
    tight = train("cnn", int(0.4 * free["peak"]), steps=3, policy="recompute",
                  flags=("--report-registry",))
    assert tight["record"] == free["record"]
    # After the step, activations are dead: their lineage was forgotten, not kept.
    nodes_after = int(tight["output"].split("nodes after ")[1].split()[0])
    assert nodes_after <= 2, tight["output"]


@pytest.mark.slow
def test_every_activation_of_a_forward_pass_is_a_node():
    # matmul and linear have a kernel on the Autograd alias key as well as a math kernel, but
    # the math kernel is what runs for dense tensors: their pieces (the clones a reshape of
    # q, k and v makes inside matmul, bmm, addmm) are what autograd saves, and each must be
    # a node, or it stays on the device through backward.
    run_unit("dispatch_units", "every_activation_of_a_forward_pass_is_a_node")


def test_an_interrupt_stops_a_recomputation_in_backward_and_keeps_training_state():
    # A watchdog's way out of an op that recomputes for too long: backward runs in C++ and
    # never returns to Python, so no signal handler could run there.
    run_unit("dispatch_units",
             "an_interrupt_stops_a_recomputation_in_backward_and_keeps_training_state")


@pytest.mark.slow
def test_a_benchmark_time_limit_stops_a_backward_running_in_cpp():
    # Backward runs in C++ on this thread: SIGALRM's handler waits for it to return, so
    # the limit's watchdog interrupts the registry, and the error it raises becomes
    # TooSlow (the exception chain tells the two ways apart).
    run_unit("dispatch_units", "a_benchmark_time_limit_stops_a_backward_running_in_cpp")


def test_threads_the_program_starts_read_evicted_tensors_as_they_were():
    # Before Note [Threads the program starts], a read on such a thread was a segfault.
    run_unit("dispatch_units", "threads_the_program_starts_read_evicted_tensors_as_they_were")


def test_training_in_a_thread_the_program_starts_evicts_and_trains_the_same():
    run_unit("dispatch_units", "training_in_a_thread_the_program_starts_evicts_and_trains_the_same")


def test_a_read_of_evicted_memory_outside_the_registry_is_a_clear_error():
    # Before Note [Reads of evicted memory] (registry/src/node.h): a segfault.
    run_unit("dispatch_units", "a_read_of_evicted_memory_outside_the_registry_is_a_clear_error")


def test_copies_pickles_and_lists_of_an_evicted_tensor_read_what_it_holds():
    # Before Note [Storage access around the dispatcher] (pyalloc/registry.py):
    # deepcopy, torch.save and tolist() of an evicted tensor raised the evicted-memory error.
    run_unit("dispatch_units", "copies_pickles_and_lists_of_an_evicted_tensor_read_what_it_holds")


def test_a_tensor_that_finds_no_memory_to_come_back_raises_out_of_memory():
    # Before: a swap-in with no lineage to fall back on, restore_all() and the storage
    # accesses raised a RuntimeError, which `except torch.OutOfMemoryError` let through.
    run_unit("dispatch_units", "a_tensor_that_finds_no_memory_to_come_back_raises_out_of_memory")


def test_selective_activation_checkpointing_trains_the_same_under_recompute():
    # Note [The registry's own ops]: replays are hidden from the program's Python modes. Before,
    # a replay inside the region's recompute was answered with a saved tensor of another size
    # (at half the peak) or made PyTorch's own invocation check fail (0.6).
    want = run_program("selective_checkpoint", "none", 4 << 30).splitlines()[0]
    for budget in (32 << 20, int(38.4 * (1 << 20))):
        out = run_program("selective_checkpoint", "recompute", budget).splitlines()
        assert out[0] == want, (budget, out)
        assert int(out[1].split()[1]) > 0, out
