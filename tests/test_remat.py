"""Rematerialization (pyalloc.registry): evict activations, recompute them, change nothing.

The training tests run each model twice in fresh processes: unconstrained under pyalloc,
then with ``policy="recompute"`` under a budget of 35% of the first run's peak reserved
bytes, which the model can only meet by evicting and recomputing (the counters say it
did). Losses, parameters, buffers (BatchNorm's running statistics) and optimizer state
must be equal bit for bit. Dropout is on in every model, so every step replays random
ops; the CNN has in-place ReLU and addition; the transformer has views and transposes.
"""
from __future__ import annotations

import pytest

from conftest import run_program, run_python, run_unit, train


@pytest.mark.slow
@pytest.mark.parametrize("task", ["mlp", "cnn", "transformer"])
def test_trains_bit_identically_at_35_percent_of_peak(task):
    free = train(task, "2GiB")
    budget = int(0.35 * free["peak"])
    tight = train(task, budget, policy="recompute", evict_strategy="window")
    assert len(tight["record"]) == 21
    assert tight["record"] == free["record"]
    assert tight["peak"] <= budget
    # The budget forced the policy to work, every step (20 steps).
    assert tight["evictions"] >= 20 and tight["recomputes"] >= 20, tight
    assert "evictions" not in free   # no policy, no registry


@pytest.mark.slow
def test_each_strategy_trains_bit_identically():
    free = train("cnn", "2GiB", steps=4)
    for strategy in ("dtr", "dte"):
        tight = train("cnn", int(0.4 * free["peak"]), policy="recompute", steps=4,
                      evict_strategy=strategy)
        assert tight["record"] == free["record"], strategy
        assert tight["recomputes"] > 0, strategy


@pytest.mark.slow
def test_scoped_form_restores_what_the_program_keeps():
    free = run_program("scoped_recompute", "--budget", "2GiB")
    tight = run_program("scoped_recompute", "--budget", "40MiB")
    assert [l.split()[1] for l in tight.splitlines()] == [l.split()[1] for l in free.splitlines()]
    assert all(int(l.split()[3]) > 0 for l in tight.splitlines())


@pytest.mark.slow
def test_budget_below_the_minimum_fails_cleanly_and_keeps_training_state():
    out = run_program("remat_oom_recovery")
    assert "oom: pyalloc: out of memory" in out
    assert "recovered True" in out
    assert "snapshot has remat counters True" in out   # so pyalloc-stats report shows them


@pytest.mark.slow
def test_random_ops_replay_bit_for_bit():
    run_unit("remat_units", "random_ops_replay_bit_for_bit")


@pytest.mark.slow
def test_readers_of_an_earlier_version_stay_recomputable():
    run_unit("remat_units", "readers_of_an_earlier_version_stay_recomputable")


def test_a_batch_norm_applied_twice_keeps_both_outputs_recomputable():
    # A siamese encoder's passes through one batch norm: only inference mode reads the
    # running statistics. See Note [Running statistics are read only in inference].
    run_unit("remat_units", "a_batch_norm_applied_twice_keeps_both_outputs_recomputable")


def test_what_autograd_saves_of_an_in_place_op_is_a_node_and_comes_back_bit_for_bit():
    # a.mul_(w) needs the old a for w's gradient: autograd's kernel clones it, inside the op.
    # See Note [What autograd saves] in registry/src/dispatch.cpp.
    run_unit("remat_units",
             "what_autograd_saves_of_an_in_place_op_is_a_node_and_comes_back_bit_for_bit")


@pytest.mark.slow
def test_what_no_grad_derives_from_an_activation_is_a_node_and_comes_back_bit_for_bit():
    # A custom autograd.Function's forward runs with grad mode off; what it saves is an
    # activation all the same. See Note [What no_grad derives] in registry/src/dispatch.cpp.
    run_unit("remat_units",
             "what_no_grad_derives_from_an_activation_is_a_node_and_comes_back_bit_for_bit")


def test_what_a_pass_that_builds_a_graph_keeps_stays_evictable_and_comes_back_bit_for_bit():
    # create_graph=True: the result and what the new graph saved stay nodes with lineage.
    # See Note [Passes that build a graph] in registry/src/backward.cpp.
    run_unit("remat_units",
             "what_a_pass_that_builds_a_graph_keeps_stays_evictable_and_comes_back_bit_for_bit")


def test_what_a_reentrant_checkpoint_hands_back_stays_a_node_and_comes_back_bit_for_bit():
    # torch.utils.checkpoint(use_reentrant=True) runs a backward pass inside backward: what
    # survives the inner pass (the gradient it hands back) stays a node of the outer pass.
    # See Note [Passes inside a pass] in registry/src/backward.cpp.
    run_unit("remat_units",
             "what_a_reentrant_checkpoint_hands_back_stays_a_node_and_comes_back_bit_for_bit")


def test_settling_a_pass_without_room_is_no_oom_of_the_programs():
    # The end of a backward pass cannot restore an evicted gradient to settle it (the budget
    # is full): it stays evicted, no on_oom callback runs and num_ooms does not move (the
    # registry's tentative allocations), and it comes back bit for bit when read.
    run_unit("remat_units", "settling_a_pass_without_room_is_no_oom_of_the_programs")


def test_a_survivor_left_swapped_out_at_the_end_of_a_pass_comes_back():
    # Note [Survivors that stay evicted] in registry/src/backward.cpp: the same under swap,
    # where the gradient is a node without lineage and only its host copy holds it.
    run_unit("remat_units", "a_survivor_left_swapped_out_at_the_end_of_a_pass_comes_back")


def test_an_out_of_memory_report_names_gradients_backward_froze():
    # Frozen gradients a backward pass made get their own line in an out-of-memory report,
    # not the frozen-activations line whose remedies (drop held outputs, FSDP) do not apply.
    run_unit("remat_units", "an_out_of_memory_report_names_gradients_backward_froze")


# The hints about tensors below min_evictable suggest 1 KiB, the default: they are for a
# program that set it higher, as these do.
MIN_EVICTABLE_16K = {"PYALLOC_MIN_EVICTABLE": "16KiB"}


def test_an_out_of_memory_report_names_tensors_too_small_to_evict():
    # Where tensors below min_evictable fill the budget, the hint says so and names the option.
    run_unit("remat_units", "an_out_of_memory_report_names_tensors_too_small_to_evict",
             env=MIN_EVICTABLE_16K)


def test_an_out_of_memory_report_names_segments_kept_by_tensors_too_small_to_evict():
    # Where such tensors sit among evictable ones, one in each segment keeps it from being
    # emptied; the hint counts those segments and names the option.
    run_unit("remat_units", "an_out_of_memory_report_names_segments_kept_by_tensors_too_small_to_evict",
             env=MIN_EVICTABLE_16K)


def test_small_nodes_do_not_change_which_large_activations_are_evicted():
    # min_evictable 1 KiB and 16 KiB evict and replay the same large activations on the
    # demo's model: small nodes' marks leave the engine's staleness clock alone.
    run_unit("remat_units", "small_nodes_do_not_change_which_large_activations_are_evicted")


def test_an_op_that_updates_state_it_reads_replays_from_the_state_it_read():
    # Quantization-aware training's fused observer: See Note [What a recorded op writes] in
    # registry/src/dispatch.cpp.
    run_unit("remat_units", "an_op_that_updates_state_it_reads_replays_from_the_state_it_read")


def test_a_gradient_backward_builds_from_a_fill_is_a_node_and_comes_back_bit_for_bit():
    # max(dim)'s gradient is zeros scattered with the incoming gradient, inside backward:
    # See Note [Fills in backward] in registry/src/dispatch.cpp.
    run_unit("remat_units",
             "a_gradient_backward_builds_from_a_fill_is_a_node_and_comes_back_bit_for_bit")


def test_what_the_program_keeps_comes_back_before_a_write_to_what_made_it():
    # See Note [Evicted dependents come back first] in registry/src/writes.cpp.
    run_unit("remat_units", "what_the_program_keeps_comes_back_before_a_write_to_what_made_it")


def test_rebinding_what_an_activation_was_made_from_keeps_the_activation_as_made():
    # `x.data = other` swaps x's storage with no op that writes it: See Note [Rebinding a
    # tensor's data] in registry/src/dispatch.cpp.
    run_unit("remat_units", "rebinding_what_an_activation_was_made_from_keeps_the_activation_as_made")


def test_a_parameter_freed_and_gathered_again_keeps_what_was_made_from_it():
    # FSDP frees gathered parameters with storage.resize_(0), no op: See Note [Storages
    # resized outside the dispatcher] in registry/src/restore.cpp.
    run_unit("remat_units", "a_parameter_freed_and_gathered_again_keeps_what_was_made_from_it")


def test_a_storage_frozen_while_read_is_let_go_once_nothing_reads_it():
    # Before: numpy() of an activation a recorded op read, and a reversible Function resizing
    # its inputs in backward, each left 4 MiB a step allocated that nothing held.
    run_unit("remat_units", "a_storage_frozen_while_read_is_let_go_once_nothing_reads_it")


def test_a_conjugate_view_replays_conjugated():
    # Before: the replay of `c.conj() * w` read c unconjugated (wrong values, no error).
    run_unit("remat_units", "a_conjugate_view_replays_conjugated")


def test_a_mask_made_from_the_batch_is_let_go_when_its_layer_returns():
    # See Note [What plain inputs derive] in registry/src/dispatch.cpp. Before: the four
    # layers' masks were held until the end of backward.
    run_unit("remat_units", "a_mask_made_from_the_batch_is_let_go_when_its_layer_returns")


def test_a_copy_kept_across_iterations_keeps_no_earlier_iteration_behind_it():
    # See Note [Lineage that outlives its iteration] in registry/src/backward.cpp.
    run_unit("remat_units", "a_copy_kept_across_iterations_keeps_no_earlier_iteration_behind_it")


def test_a_reversible_network_keeps_no_lineage_heavier_than_what_it_frees():
    # See Note [Lineage that holds more than it can free] in registry/src/backward.cpp.
    run_unit("remat_units", "a_reversible_network_keeps_no_lineage_heavier_than_what_it_frees")


def test_what_a_dead_nodes_recording_kept_goes_with_its_death():
    # See Note [Deaths worth a drain] in registry/src/liveness.cpp.
    run_unit("remat_units", "what_a_dead_nodes_recording_kept_goes_with_its_death")


def test_what_a_subclass_keeps_inside_comes_back_before_its_ops_read_it():
    # Found by tools/user_programs/subclass_float8_linear.py (a torchao-style float8 linear):
    # Note [Storage access around the dispatcher] in pyalloc/registry.py.
    run_unit("remat_units", "what_a_subclass_keeps_inside_comes_back_before_its_ops_read_it")


def test_a_tangent_forward_mode_ad_makes_leaves_as_a_host_copy():
    # Found by tools/user_programs/forward_ad_jvp_reg.py (a JVP regulariser by forward_ad):
    # Note [Tangents forward-mode AD makes] in registry/src/dispatch.cpp.
    run_unit("remat_units", "a_tangent_forward_mode_ad_makes_leaves_as_a_host_copy")


def test_an_efficient_zero_tensor_is_no_node():
    # Found by tools/user_programs/forward_ad_jvp_reg.py (JVP=func: torch.func.jvp): Note
    # [Efficient zero tensors] in registry/src/node.h.
    run_unit("remat_units", "an_efficient_zero_tensor_is_no_node")


def test_a_composite_op_on_a_vmap_wrapper_makes_no_node_inside():
    # Found by tools/user_programs/cummax_gradbatch.py (an is_grads_batched penalty): Note
    # [Composite ops on wrappers] in registry/src/dispatch.cpp.
    run_unit("remat_units", "a_composite_op_on_a_vmap_wrapper_makes_no_node_inside")


def test_an_out_of_memory_report_names_what_recompute_can_no_longer_rebuild():
    # Found by tools/user_programs/fsdp2_world1.py under recompute: Note [What the registry
    # adds to a report] in registry/src/inspect.cpp.
    run_unit("remat_units", "an_out_of_memory_report_names_what_recompute_can_no_longer_rebuild")


def test_what_a_scripted_differentiable_graph_saves_is_a_node_and_comes_back_bit_for_bit():
    # Found by tools/user_programs/scripted_cells.py (TorchScript LSTM cells): Note [A
    # detached parameter is still a parameter] in registry/src/registry.cpp.
    run_unit("remat_units", "what_a_scripted_differentiable_graph_saves_is_a_node_and_comes_back_bit_for_bit")


def test_torchscript_fuses_nothing_while_a_policy_runs():
    # TorchScript's fusion groups read their inputs by data pointer; found on an H100 (the
    # scripted check made no node but the mm) and reproduced with the CPU fuser: Note
    # [TorchScript fusion under a policy] in pyalloc/registry.py.
    run_unit("remat_units", "torchscript_fuses_nothing_while_a_policy_runs")


def test_an_out_of_memory_error_inside_a_replay_says_what_the_replay_pins():
    # Found by tools/user_programs/hf_wav2vec2_ctc.py under recompute at 0.4: Note [What the
    # registry adds to a report] in registry/src/inspect.cpp.
    run_unit("remat_units", "an_out_of_memory_error_inside_a_replay_says_what_the_replay_pins")


def test_what_a_subclass_op_returns_inside_leaves_under_swap_and_comes_back():
    # Found by tools/user_programs/njt_jagged_attention.py (jagged nested tensors): Note [What
    # a subclass's results keep inside] in registry/src/registry.cpp.
    run_unit("remat_units", "what_a_subclass_op_returns_inside_leaves_under_swap_and_comes_back")


def test_a_step_of_several_backward_passes_holds_none_of_its_own_activations():
    # See Note [Lineage that outlives its iteration] in registry/src/backward.cpp.
    run_unit("remat_units", "a_step_of_several_backward_passes_holds_none_of_its_own_activations")


def test_a_buffer_assembled_step_by_step_in_forward_stays_recomputable():
    # See Note [How long a chain may grow] in registry/src/registry.cpp.
    run_unit("remat_units", "a_buffer_assembled_step_by_step_in_forward_stays_recomputable")


def test_a_fill_of_a_parameters_shape_is_remembered_not_a_node():
    # Adagrad's full_like state made in its constructor was a node that froze; under
    # recompute a *_like fill of a parameter is a node only once an activation-making op reads
    # or writes it (Note [Fills of a parameter's shape] in dispatch.cpp), and Adagrad trains
    # bit for bit; under swap and hybrid it stays a node, which can leave as a host copy.
    run_unit("remat_units", "a_fill_of_a_parameters_shape_is_remembered_not_a_node")


def test_what_an_op_returns_beside_a_write_is_a_node_and_comes_back_bit_for_bit():
    # RReLU's activation, returned by the op that writes its noise buffer (a node), was no
    # node and stayed resident; now it is recorded from the same op and replays bit for bit
    # under all three policies (Note [Fresh results beside a write] in dispatch.cpp).
    run_unit("remat_units", "what_an_op_returns_beside_a_write_is_a_node_and_comes_back_bit_for_bit")


def test_a_graph_held_across_an_optimizer_step_stays_evictable_and_comes_back_bit_for_bit():
    # Activations the program holds across opt.step() (a retained graph, the last step's
    # features read by the next loss) were restored and frozen at the first write to their
    # weights; now their recordings read a copy of the weights, and they leave and come
    # back bit for bit under all three policies. A reader lighter than twice the weight is
    # frozen as before (Note [A written leaf's readers keep a copy] in writes.cpp).
    run_unit("remat_units", "a_graph_held_across_an_optimizer_step_stays_evictable_and_comes_back_bit_for_bit")

def test_a_fill_written_with_activations_is_a_node_and_comes_back_bit_for_bit():
    # out = torch.zeros(...); out[:, :k] = h: the buffer becomes a node (zeros, then the
    # write); parameters and statistics made by fills stay plain. See Note [Fills a write
    # makes activations] in registry/src/dispatch.cpp.
    run_unit("remat_units", "a_fill_written_with_activations_is_a_node_and_comes_back_bit_for_bit")


def test_gradients_summed_in_place_replay_bit_for_bit_and_leave_nothing_behind():
    # Autograd sums a skip connection's two gradients in place, into the one that came
    # down the skip, after the branch read it: a cycle of readers through an earlier
    # version (Note [Readers of an earlier version]), evicted here in the middle of
    # backward and replayed, then gone when the pass ends.
    run_unit("remat_units", "gradients_summed_in_place_replay_bit_for_bit_and_leave_nothing_behind")


@pytest.mark.slow
def test_parameters_inputs_and_gradients_are_never_evicted():
    run_unit("remat_units", "parameters_inputs_and_gradients_are_never_evicted")


def test_a_gradient_bound_for_a_grad_is_a_victim_of_last_resort():
    # Note [Gradients bound for .grad] in registry/src/backward.cpp.
    run_unit("remat_units", "a_gradient_bound_for_a_grad_is_a_victim_of_last_resort")


@pytest.mark.parametrize("unit", ["a_victim_too_dear_to_replay_spills",
                                  "a_victim_too_dear_to_replay_that_the_pool_refuses_stays"])
def test_a_victim_too_dear_to_replay_spills_unless_the_pool_has_no_room(unit):
    # Note [Spilling under recompute] in registry/src/evict.cpp.
    run_unit("remat_units", unit)


def test_deaths_in_separate_batches_charge_what_one_walk_would():
    # Note [Charging a batch of deaths] in registry/src/liveness.cpp: frontiers outlive
    # their batch.
    run_unit("remat_units", "deaths_in_separate_batches_charge_what_one_walk_would")


def test_a_charge_reaching_an_unnoticed_death_still_charges_the_rest():
    # Note [Deaths found by a charge] in registry/src/liveness.cpp.
    run_unit("remat_units", "a_charge_reaching_an_unnoticed_death_still_charges_the_rest")


def test_a_replay_thousands_deep_fits_a_small_thread_stack():
    # Note [Deep replays] in registry/src/restore.cpp: before, the recursion overflowed
    # the stack (a segmentation fault).
    run_unit("remat_units", "a_replay_thousands_deep_fits_a_small_thread_stack")


def test_a_replay_past_the_nesting_limit_gives_up_and_leaves_the_step_intact():
    run_unit("remat_units", "a_replay_past_the_nesting_limit_gives_up_and_leaves_the_step_intact")


@pytest.mark.slow
def test_what_backward_creates_is_evicted_and_recomputed_bit_for_bit():
    run_unit("remat_units", "what_backward_creates_is_evicted_and_recomputed_bit_for_bit")


@pytest.mark.slow
def test_a_backward_that_raises_leaves_no_backward_nodes_behind():
    run_unit("remat_units", "a_backward_that_raises_leaves_no_backward_nodes_behind")


@pytest.mark.slow
def test_autograd_grad_results_are_the_programs():
    run_unit("remat_units", "autograd_grad_results_are_the_programs")


@pytest.mark.slow
def test_views_follow_their_storage():
    run_unit("remat_units", "views_follow_their_storage")


@pytest.mark.slow
@pytest.mark.parametrize("boxed", [False, True], ids=["unboxed_views", "boxed_views"])
def test_every_view_of_an_evicted_tensor_restores_it_first(boxed):
    # Both paths of a view: its own kernel (Note [Views without boxing] in
    # registry/src/dispatch.cpp) and the fallback, which PYALLOC_BOXED_VIEWS=1 keeps.
    env = {"PYALLOC_BOXED_VIEWS": "1"} if boxed else None
    run_unit("remat_units", "every_view_of_an_evicted_tensor_restores_it_first", env=env)


@pytest.mark.slow
def test_what_only_dead_lineage_reads_is_let_go_before_out_of_memory():
    run_unit("remat_units", "what_only_dead_lineage_reads_is_let_go_before_out_of_memory")


@pytest.mark.slow
def test_what_a_sparse_tensor_wraps_comes_back_before_a_sparse_kernel_reads_it():
    run_unit("remat_units", "what_a_sparse_tensor_wraps_comes_back_before_a_sparse_kernel_reads_it")


def test_a_sparse_product_of_an_activation_is_a_node_its_reader_does_not_hold():
    # See Note [Sparse arguments] in registry/src/node.h. Before: an op that took a sparse
    # tensor was never recorded, and the op after sparse.mm held its product to the end of
    # backward (a GCN under recompute: +20.8 MiB at its peak over no policy).
    run_unit("remat_units", "a_sparse_product_of_an_activation_is_a_node_its_reader_does_not_hold")


@pytest.mark.slow
def test_a_random_op_replays_inside_a_batched_backward():
    run_unit("remat_units", "a_random_op_replays_inside_a_batched_backward")


@pytest.mark.slow
def test_bad_arguments_name_the_problem():
    run_unit("remat_units", "bad_recompute_arguments_name_the_problem")
    out = run_program("install_bad_options", '{"policy": "swapp"}')
    assert "policy" in out and "none, recompute" in out


@pytest.mark.slow
def test_modifying_a_saved_tensor_in_place_is_still_an_error():
    # Autograd skips its version check for tensors behind saved-tensor hooks; the registry
    # makes it instead, so a user's in-place bug is not silently turned into wrong gradients.
    run_unit("remat_units", "modifying_a_saved_tensor_in_place_is_still_an_error")


@pytest.mark.slow
def test_a_replay_runs_in_the_grad_mode_its_op_ran_in():
    """An LSTM on the CPU (mkldnn_rnn_layer) returns its workspace only with grad mode on.
    With every storage recorded (min_evictable 0), backward restores the layer's small
    outputs by replaying it with grad mode off, where it made one result fewer than
    recorded and the restore failed; replayed in the forward's mode, training is
    bit-identical."""
    import pyalloc.bench.zoo  # noqa: F401  (adds the zoo_* tasks)

    free = train("zoo_lstm_lm", "2GiB", steps=3)
    tight = train("zoo_lstm_lm", int(0.5 * free["peak"]), steps=3, policy="recompute",
                  min_evictable="0")
    assert tight["record"] == free["record"]
    assert tight["recomputes"] > 0 and tight["peak"] <= 0.5 * free["peak"], tight


@pytest.mark.slow
def test_empty_cache_after_an_oom_in_backward_frees_what_the_failed_step_left():
    """An out-of-memory error in backward leaves the step's nodes behind, dead (the
    program dropped their tensors) but waiting for the registry's next periodic sweep, with
    the storages rebuilt for their readers. empty_cache() collects them first, so a retry
    (a smaller batch, the next trial of a benchmark) starts from what the model holds."""
    out = run_program("oom_in_backward_empty_cache")
    assert "oom" in out
    held = int(out.split("held ")[1].split()[0])
    assert held <= 64 << 10, out


def test_starting_a_policy_prints_no_warning_of_torch():
    # Reading TorchScript's nvFuser switch (a deprecated no-op since torch 2.2) printed a
    # C++ warning at every install() with a policy: Note [TorchScript fusion under a
    # policy] in pyalloc/registry.py. torch's C++ warnings go to fd 2, sent to stdout here.
    out = run_python("-c", (
        "import os, sys; os.dup2(sys.stdout.fileno(), sys.stderr.fileno())\n"
        "import torch, pyalloc\n"
        "pyalloc.install(budget='256MiB', device='cpu', policy='recompute')\n"
        "x = torch.randn(64, 64, requires_grad=True)\n"
        "(x * 2).sum().backward()\n"
        "print('trained')\n"))
    assert "trained" in out
    assert "nvfuser" not in out.lower() and "deprecated" not in out.lower(), out


_SINE_CHAIN = (
    "import os, sys; os.dup2(sys.stdout.fileno(), sys.stderr.fileno())\n"
    "import torch, pyalloc\n"
    "pyalloc.install(budget=sys.argv[1], device='cpu', policy='recompute')\n"
    "x = torch.randn(1 << 18, requires_grad=True)\n"      # 1 MiB; sin saves its input
    "for step in range(2):\n"
    "    y = x\n"
    "    for _ in range(48):\n"
    "        y = torch.sin(y)\n"
    "    y.sum().backward()\n"
    "print('trained')\n")


def test_an_iteration_that_replays_more_tensors_than_it_runs_ops_is_reported_once():
    # Note [Replays that dominate an iteration] in registry/src/restore.cpp: 48 sines of
    # 1 MiB in 8 MiB replay ~350 tensors an iteration for 149 ops; both iterations do, the
    # warning comes once. With memory to spare, or at 24 MiB (79 replays), none.
    tight = run_python("-c", _SINE_CHAIN, "8MiB")
    assert "trained" in tight
    assert tight.count("pyalloc: warning: the last training iteration recomputed") == 1, tight
    assert "Raise the budget" in tight and 'policy="swap"' in tight
    assert "at this budget (8.0 MiB)" in tight, tight
    for budget in ("1GiB", "24MiB"):
        roomy = run_python("-c", _SINE_CHAIN, budget)
        assert "trained" in roomy and "warning" not in roomy, roomy


def test_a_thread_that_keeps_the_gil_while_it_makes_tensors_does_not_deadlock_backward():
    # Found by tools/user_programs/two_threads.py under hybrid: Note [Python's references
    # under the registry's mutex] in registry/src/backward.cpp. A race: a hang shows as
    # "hung" or the timeout; without the fix a run of this length hangs often, not always.
    assert run_program("threads_gil_and_registry", "16", timeout=240).strip().endswith("finished")
