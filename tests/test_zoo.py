"""The model zoo (pyalloc.bench.zoo): the shapes users bring, trained under every policy at 40%.

Each zoo task is a model the rest of the suite lacks (a torchvision-style ResNet, a
residual UNet, GRU and LSTM language models, a ViT, Hugging Face GPT-2, Llama and BERT, a
MobileNet, a temporal convolutional network, an MLP-Mixer, a DenseNet with an attention-
pooled head), at a batch where activations
dominate. The tests check, per task:

* that activations are at least three quarters of the unconstrained peak, measured in the
  unconstrained training run itself: after training, the run adds up the bytes of the
  distinct storages of what no policy can evict (parameters, buffers, gradients, SGD's
  momentum, the batch) and compares them with the peak of allocated bytes (not reserved:
  cached free bytes would flatter the share). Gradients are counted whole although part
  of them does not exist yet at the peak, so the share is a lower bound.
* that ``recompute``, ``swap`` and ``hybrid`` each train it at 40% of that run's peak
  reserved bytes, three steps, bit-identically to it (losses, parameters, buffers,
  optimizer state), under the budget, having evicted (and, under swap, swapped out).

Combinations that run out of memory at 40% today are strict xfails (KNOWN_FAILURES, with
the reason): they pass or fail loudly when placement changes.

Both tests of a task share one unconstrained run (conftest caches ``train`` per session).
The Hugging Face tasks are skipped without ``transformers`` (in the ``test`` extra).
"""
from __future__ import annotations

import importlib.util

import pytest

from conftest import printed, run_program, train
from pyalloc.bench.zoo import ZOO

STEPS = 3
POLICIES = ("recompute", "swap", "hybrid")

_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                         reason="needs Hugging Face transformers (pip install '.[test]')")
TASKS = [pytest.param(name, marks=_hf) if name.startswith("zoo_hf_") else name
         for name in ZOO]

# After the unconstrained training, train.py reports the bytes no policy can evict, each
# storage once (the GRU's and LSTM's head shares the embedding's weight), and the peak of
# allocated bytes.
STATIC = ("--report-static-bytes",)


def unconstrained(task: str) -> dict:
    return train(task, "2GiB", steps=STEPS, flags=STATIC)


def counters(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in ("record", "output")}


def test_every_zoo_task_is_a_task_and_the_zoo_imports_without_transformers():
    out = run_program("zoo_without_transformers")

    assert "error: " in out and "pip install transformers" in out


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_activations_are_three_quarters_of_the_unconstrained_peak(task):
    free = unconstrained(task)
    static, peak = printed(free, "static_bytes"), printed(free, "allocated_peak")
    assert static <= 0.25 * peak, (static, peak)
    assert "evictions" not in free   # no policy, no registry


# Out of memory at 40% once (2026-11-25), each with evictable bytes too few or too scattered
# to serve the request: issue 21, items 2 (placement that keeps what can leave together) and
# 3 (many small tensors). Strict: the day one passes, the mark must go (the GRU under swap
# and hybrid and MobileNet under recompute lost theirs to Note [What autograd saves] and
# min_evictable 16 KiB; the UNet under swap and hybrid to rung stitch_cached under
# `window` only what no segment holds; the GRU under recompute to the evict_to_compact
# rung, which moves the frozen gradient that sat among its evictable blocks: Note [Moving
# what cannot leave] in allocator/src/compactor.h; DenseNet under recompute, whose failure
# was not placement but a gradient evicted whose replay rebuilt 39 MiB of dead lineage in a
# 43 MiB budget, to Note [A restore needs its dead lineage's memory] in
# registry/src/evict.cpp). The LSTM's floor under recompute, 0.43, lies above 0.4 whatever
# the victims.
# At the edge of 0.4: they pass or fail from run to run (a clean CI run and this machine
# disagreed both ways on 2026-11-25). Under swap and hybrid what is evicted depends on
# whether a copy has finished, and hybrid's choice on host time, so the layout at the
# loss differs; non-strict until the choice is made deterministic or the margin grows.
AT_THE_EDGE = {
    ("zoo_gru_lm", "swap"): "at the edge of 0.4 of its peak: trains or runs out of memory "
                             "depending on when swap copies complete",
    ("zoo_gru_lm", "hybrid"): "at the edge of 0.4 of its peak: trains or runs out of memory "
                               "depending on when swap copies complete and on host time",
    # Since what backward makes can leave as host copies (Note [Backward nodes]): trained in
    # a clean CI run on 2026-11-26, out of memory on the dev VM the same hour.
    ("zoo_mobilenet", "swap"): "at the edge of 0.4 of its peak: trains or runs out of memory "
                                "depending on when swap copies complete",
    ("zoo_mobilenet", "hybrid"): "at the edge of 0.4 of its peak: trains or runs out of memory "
                                  "depending on when swap copies complete and on host time",
    # Out of memory once, in a CI-like run while two other jobs and a callgrind profile
    # shared the VM's two cores (2026-11-27, 2 MiB short with 4.8 MiB evictable in 13
    # blocks); trained in the seven runs after, four of them side by side.
    ("zoo_unet", "hybrid"): "at the edge of 0.4 of its peak on a loaded machine: hybrid's "
                             "choice depends on host time and on when swap copies complete",
}
_FLOOR_BOUND = ("out of memory at 0.4 of the peak: its floor (what no victim choice can "
                "free, bench_remat's floor under recompute) is 0.43")
KNOWN_FAILURES = {("zoo_lstm_lm", policy): _FLOOR_BOUND for policy in POLICIES}


def _combinations():
    for task in TASKS:
        name = task if isinstance(task, str) else task.values[0]
        marks = [] if isinstance(task, str) else list(task.marks)
        for policy in POLICIES:
            reason = KNOWN_FAILURES.get((name, policy))
            extra = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            if (name, policy) in AT_THE_EDGE:
                extra = [pytest.mark.xfail(reason=AT_THE_EDGE[name, policy], strict=False)]
            yield pytest.param(name, policy, marks=marks + extra, id=f"{name}-{policy}")


@pytest.mark.slow
@pytest.mark.parametrize(("task", "policy"), list(_combinations()))
def test_trains_bit_identically_at_40_percent_of_peak(task, policy):
    free = unconstrained(task)
    budget = int(0.4 * free["peak"])
    tight = train(task, budget, steps=STEPS, policy=policy)
    assert len(tight["record"]) == STEPS + 1
    assert tight["record"] == free["record"]
    assert tight["peak"] <= budget
    assert tight["evictions"] > 0, counters(tight)
    if policy == "recompute":
        assert tight["recomputes"] > 0, counters(tight)
    if policy == "swap":
        assert tight["swap_outs"] > 0, counters(tight)


@pytest.mark.slow
def test_the_resnet_trains_at_30_percent_where_a_deep_replay_ran_out_of_memory():
    # Under recompute at 0.3 of its peak the ResNet evicted a residual stream's gradient
    # whose replay had 6.9 MiB of dead lineage to rebuild in a 12.6 MiB budget, and ran out
    # of memory 24 replays deep. Such a node is a victim of last resort from 0.3 of the
    # budget's worth of dead lineage (Note [A restore needs its dead lineage's memory] in
    # registry/src/evict.cpp); with the whole budget as the bound its least budget was 0.35.
    free = unconstrained("zoo_resnet")
    budget = int(0.3 * free["peak"])
    tight = train("zoo_resnet", budget, steps=STEPS, policy="recompute")
    assert tight["record"] == free["record"]
    assert tight["peak"] <= budget
    assert tight["recomputes"] > 0, counters(tight)


@pytest.mark.slow
def test_below_its_least_budget_the_mixer_fails_with_a_clean_out_of_memory_error():
    # At 0.2 of its peak the ninth in-place write to a residual stream's gradient buffer
    # cannot extend its chain; settling the buffer's readers once froze the buffer midway
    # (a cycle through readers of earlier versions), and the next restore failed as "a
    # registry bug". See Note [A written node keeps its chain while its readers settle].
    free = unconstrained("zoo_mixer")
    try:
        tight = train("zoo_mixer", int(0.2 * free["peak"]), steps=6, policy="recompute")
    except pytest.fail.Exception as failure:
        message = str(failure)
        assert "OutOfMemoryError" in message and "registry bug" not in message, message[-3000:]
    else:  # trains: then bit for bit
        assert tight["record"] == train("zoo_mixer", "2GiB", steps=6)["record"]
