"""The lab's training harness (pyalloc.bench.trial): steps counted, the warm-up kept out of
the timed steps, hooks called where they say, out-of-memory errors and thrashing caught
and reported with the model left trainable, and when each step's loss dies.

The clock is faked where durations are checked, so nothing here depends on how fast the
machine is; the one run under pyalloc (a real out-of-memory error) is in a subprocess,
as install() is once per process."""
from __future__ import annotations

import types
import weakref

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from conftest import run_python
from pyalloc.bench import trial
from pyalloc.bench.trial import (NON_FINITE_LOSS, OUT_OF_MEMORY, THRASH_LIMIT, Training,
                                 run_steps, run_trial)


def mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def training(loss=mse, optimizer=None) -> Training:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = (optimizer or torch.optim.SGD)(model.parameters(), lr=0.1)
    return Training(model, opt, (torch.randn(8, 4), torch.randn(8, 2)), loss)


@pytest.fixture
def clock(monkeypatch):
    """The harness's clock, moved only by ``clock.advance(seconds)``."""
    now = [0.0]
    fake = types.SimpleNamespace(perf_counter=lambda: now[0],
                                 advance=lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(trial, "time", fake)
    return fake


def test_every_step_is_counted_and_timed_and_the_warm_up_is_left_out_of_the_timed_ones(clock):
    calls = []

    def slow_then_fast(model, x, y):
        calls.append(None)
        clock.advance(10.0 if len(calls) <= 2 else 1.0)   # the warm-up steps are slow
        return mse(model, x, y)

    steps = run_steps(training(slow_then_fast), 5, warmup=2)
    assert steps.steps == len(calls) == 5
    assert steps.seconds == [10.0, 10.0, 1.0, 1.0, 1.0]
    assert steps.timed == [1.0, 1.0, 1.0]
    assert steps.step_s == 1.0 and steps.total_s == 3.0 and steps.mean_s == 1.0


def test_a_warm_up_of_every_step_leaves_them_all_timed(clock):
    def one_second(model, x, y):
        clock.advance(1.0)
        return mse(model, x, y)

    steps = run_steps(training(one_second), 2, warmup=5)
    assert steps.timed == steps.seconds == [1.0, 1.0] and steps.total_s == 2.0


def test_on_warm_runs_once_between_the_warm_up_and_the_first_timed_step():
    events = []
    run_steps(training(), 4, warmup=2, on_warm=lambda: events.append("warm"),
              after_step=lambda index, loss: events.append(index))
    assert events == [0, 1, "warm", 2, 3]
    events.clear()
    run_steps(training(), 2, warmup=0, on_warm=lambda: events.append("warm"),
              after_step=lambda index, loss: events.append(index))
    assert events == ["warm", 0, 1]


@pytest.mark.parametrize("every,warmup,expected", [(True, 0, 6), (True, 1, 6), (False, 0, 2),
                                                   (False, 1, 2)])
def test_synchronizations_around_every_step_or_around_the_timed_ones(every, warmup, expected):
    syncs = []
    run_steps(training(), 3, warmup=warmup, sync=lambda: syncs.append(None),
              sync_every_step=every)
    assert len(syncs) == expected


@pytest.mark.parametrize("keep_loss", [False, True])
def test_the_loss_dies_after_backward_unless_kept_until_the_next_forward(keep_loss):
    losses = []

    def tracked(model, x, y):
        loss = mse(model, x, y)
        losses.append(weakref.ref(loss))
        return loss

    alive_at_update = []

    class Watch:
        def __enter__(self):
            # At the optimizer's step: this step's loss, and the one before.
            alive_at_update.append([ref() is not None for ref in losses[-2:]])

        def __exit__(self, *exc):
            return False

    run_steps(training(tracked), 3, keep_loss=keep_loss, around_optimizer_step=Watch)
    if keep_loss:   # the previous loss died when the new one replaced it
        assert alive_at_update == [[True], [False, True], [False, True]]
    else:
        assert alive_at_update == [[False], [False, False], [False, False]]


def test_after_step_gets_the_loss_only_where_it_is_kept():
    seen = []
    run_steps(training(), 2, after_step=lambda index, loss: seen.append(loss))
    assert seen == [None, None]
    run_steps(training(), 2, keep_loss=True, after_step=lambda index, loss: seen.append(loss))
    assert all(isinstance(loss, torch.Tensor) for loss in seen[2:])


class FailingSGD(torch.optim.SGD):
    """SGD whose ``fail_at``-th step raises ``error``: after backward, so the gradients
    are there when it fails, as in a step that runs out of memory half-way."""

    fail_at, error = 3, torch.OutOfMemoryError("pyalloc: out of memory (a test's)")

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.calls = 0

    def step(self, closure=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error
        return super().step(closure)


def test_run_steps_lets_an_out_of_memory_error_through():
    with pytest.raises(torch.OutOfMemoryError):
        run_steps(training(optimizer=FailingSGD), 5)


def test_an_out_of_memory_error_fails_the_trial_and_leaves_the_model_trainable():
    t = training(optimizer=FailingSGD)
    result = run_trial(t, 5)
    assert not result.trained and result.failure == OUT_OF_MEMORY
    assert "a test's" in result.error
    assert result.steps == 2                                     # the third failed
    assert all(p.grad is None for p in t.model.parameters())    # its gradients freed
    before = [p.detach().clone() for p in t.model.parameters()]
    again = run_trial(t, 2)                                      # the optimizer steps again
    assert again.trained and again.steps == 2
    assert all(not torch.equal(a, p) for a, p in zip(before, t.model.parameters()))


class _OutOfMemoryInBackward(torch.autograd.Function):
    """Raises an out-of-memory error when its gradient is computed."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("a test's out-of-memory error in backward")


def test_what_a_failed_backward_left_queued_is_let_go_before_the_next_trial():
    # The loss adds two branches: the one made last runs first in backward and fails
    # while the other's task waits in the thread's ready queue, holding the tensor its
    # product saved (Note [What a failed backward leaves queued]). Plain PyTorch keeps it
    # until the thread's next backward; the trial must not hand it to the next one.
    saved = []

    def loss(model, x, y):
        w = torch.randn(1000)
        saved.append(weakref.ref(w))
        waiting = (model(x).sum() * w).sum()      # saves w; made first, so run last
        return waiting + _OutOfMemoryInBackward.apply(model(x)).sum()

    result = run_trial(training(loss), 1)
    assert result.failure == OUT_OF_MEMORY and "in backward" in result.error
    assert saved and saved[0]() is None


def test_a_runtime_error_that_wraps_an_out_of_memory_error_fails_the_trial(monkeypatch):
    monkeypatch.setattr(FailingSGD, "error",
                        RuntimeError("Error(s) in loading state_dict: CUDA out of memory"))
    assert run_trial(training(optimizer=FailingSGD), 5).failure == OUT_OF_MEMORY
    monkeypatch.setattr(FailingSGD, "error", RuntimeError("a bug, not memory"))
    with pytest.raises(RuntimeError, match="a bug"):
        run_trial(training(optimizer=FailingSGD), 5)


def test_a_setup_that_runs_out_of_memory_fails_the_trial_before_any_step():
    def setup():
        raise torch.OutOfMemoryError("out of memory building the model")

    result = run_trial(setup, 3)
    assert result.failure == OUT_OF_MEMORY and result.steps == 0


def test_a_setup_is_called_once_inside_the_trial_and_the_gradients_are_freed_after():
    made = []

    def setup():
        made.append(training())
        return made[-1]

    result = run_trial(setup, 2)
    assert result.trained and result.steps == 2 and len(made) == 1
    assert all(p.grad is None for p in made[0].model.parameters())   # clear_after


def test_clear_after_false_keeps_the_gradients_of_a_trial_that_trained():
    t = training()
    assert run_trial(t, 2, clear_after=False).trained
    assert all(p.grad is not None for p in t.model.parameters())


def test_a_non_finite_loss_fails_the_trial_unless_not_checked():
    def nan(model, x, y):
        return mse(model, x, y) * float("nan")

    assert run_trial(training(nan), 2).failure == NON_FINITE_LOSS
    assert run_trial(training(nan), 2, check_finite=False).trained


def test_a_trial_past_its_time_limit_is_thrashing():
    import time

    def stuck(model, x, y):
        time.sleep(30)   # SIGALRM's handler raises TooSlow inside the sleep
        return mse(model, x, y)

    result = run_trial(training(stuck), 2, limit_s=0.1)
    assert result.failure == THRASH_LIMIT and result.steps == 0


def pyalloc_runs_out_of_memory() -> None:
    """The body of the next test, in a process of its own (install() is once per process)."""
    import pyalloc

    pyalloc.install(device="cpu", budget="1GiB")
    from pyalloc.bench.models import TASKS
    from pyalloc.bench.trial import task_training

    task = TASKS["mlp_small"]
    torch.manual_seed(0)
    model = task.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    t = task_training(task, model, opt, 4096, "cpu")
    engine = pyalloc._engine(None)
    # What the parameters and the batch hold: no room for a step's activations.
    engine.set_budget(pyalloc.memory_stats()["reserved_bytes.all.current"])
    failed = run_trial(t, 3)
    assert failed.failure == OUT_OF_MEMORY, failed
    assert "pyalloc: out of memory" in failed.error, failed.error
    assert all(p.grad is None for p in model.parameters())
    engine.set_budget(1 << 30)
    trained = run_trial(t, 3)
    assert trained.trained and trained.steps == 3, trained
    pyalloc.check_invariants()
    print("ok")


@pytest.mark.slow
def test_pyalloc_running_out_of_memory_fails_the_trial_and_the_model_trains_after():
    out = run_python("-c", "import test_trial; test_trial.pyalloc_runs_out_of_memory()")
    assert out.strip().endswith("ok")


class Mixed(nn.Module):
    """Parameters of two dtypes, a 0-d integer buffer and a tied weight: what a snapshot of
    a state dict must bring back exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight
        self.half = nn.Linear(4, 3).to(torch.bfloat16)
        self.norm = nn.BatchNorm1d(4)   # running stats and num_batches_tracked (int64, 0-d)


def test_a_host_snapshot_brings_back_every_tensor_of_the_state_bit_for_bit():
    torch.manual_seed(0)
    model = Mixed()
    model.norm(torch.randn(5, 4))   # the running statistics and the counter move
    before = {k: v.clone() for k, v in model.state_dict().items()}
    snapshot = trial.HostSnapshot(model)
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.add_(3)
    snapshot.restore(model)
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert after[k].dtype == v.dtype and after[k].shape == v.shape, k
        assert torch.equal(after[k].view(-1).view(torch.uint8), v.view(-1).view(torch.uint8)), k
    assert model.head.weight is model.emb.weight   # restored in place: still tied


def snapshot_holds_no_pool_memory():
    import pyalloc
    pyalloc.install(device="cpu", budget="64MiB")
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))
    held = pyalloc.memory_stats()["allocated_bytes.all.current"]
    snapshot = trial.HostSnapshot(model)
    assert pyalloc.memory_stats()["allocated_bytes.all.current"] == held
    weight = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.zero_()
    snapshot.restore(model)
    assert torch.equal(model[0].weight, weight)
    print("ok")


def test_a_host_snapshot_keeps_its_copy_out_of_the_budget_under_test():
    """The copy is the harness's, not the program's: on the simulated device it must not sit
    in the pool (it had filled the segment the optimizer's state shares with the model)."""
    out = run_python("-c", "import test_trial; test_trial.snapshot_holds_no_pool_memory()")
    assert out.strip().endswith("ok")
