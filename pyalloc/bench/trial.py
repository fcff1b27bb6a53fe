"""The lab's training loop, written once: steps of a model, timed, and a trial that survives
running out of memory.

Every benchmark of the lab trains the same way: zero the gradients (``set_to_none``, so
that they are freed, not kept), forward and loss, backward, the optimizer's step. Two
layers do it:

* :func:`run_steps` runs ``steps`` steps of a :class:`Training` and times each; what a
  step raises, it raises. The programs that must not go on after an out-of-memory error
  (recording a trace, inplace's measurements, the registry profile) use it directly.
* :func:`run_trial` runs :func:`run_steps` as a trial under a budget, the way a search
  for the least budget or the largest batch needs it: the setup inside, an optional time
  limit (:func:`time_limit`), out-of-memory errors and thrashing caught and reported in
  the :class:`TrialResult`, the loss checked, and the gradients freed afterwards, so the
  model trains again in the next trial.

What a caller measures around a trial (the engine's counters before and after, the
peaks) stays with the caller: each benchmark resets and reads its own figures, in its
own order. Inside the loop it gets ``on_warm`` (the warm-up steps are done: steady-state
counters start here), ``after_step`` (each step's loss) and ``around_optimizer_step``
(what the optimizer's step allocates).

Note [What a step keeps alive]: every choice below that decides when a tensor dies
(``keep_loss``, where the batch and the optimizer are dropped, ``clear_after``) changes
the pool's layout, so the figures of every benchmark (peaks, evictions, least budgets,
recorded traces). They are options, not fixed, because the benchmarks differ in them and
their figures were measured so; they keep the order of the loops they replaced.
"""
from __future__ import annotations

import contextlib
import gc
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator, List, Optional, Tuple, Union

import torch

if TYPE_CHECKING:
    from pyalloc.bench.tasks import Task

# Why a trial did not train (TrialResult.failure).
OUT_OF_MEMORY = "out of memory"
THRASH_LIMIT = "thrash limit"
NON_FINITE_LOSS = "non-finite loss"


class HostSnapshot:
    """A module's parameters and buffers as they are now, kept where no budget under test
    counts them, to reset the module in place before each trial (:meth:`restore`).

    A harness that builds the model once and resets it per trial needs a copy of the
    initial state; a copy on the device sits in the budget being measured, beside the
    model, as memory a user's program would not have. On the simulated device it filled
    the long-lived segment the parameters share with the optimizer's state, so the
    momentum buffers spilled into the segments activations use and kept them from freeing
    whole (the zoo's ResNet under recompute). So the bytes are copied into numpy-owned host
    memory: not the simulated device's (every torch CPU tensor is), and not a GPU's.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._saved = {}
        for name, t in module.state_dict().items():
            flat = t.detach().contiguous().reshape(-1)
            raw = flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
            # .copy(): numpy's own memory (on the simulated device .numpy() shares the
            # tensor's, which the pool counts).
            self._saved[name] = (raw.cpu().numpy().copy(), t.dtype, tuple(t.shape))

    def restore(self, module: torch.nn.Module) -> None:
        """Copies the saved state back into ``module``'s own tensors (load_state_dict)."""
        state = {name: torch.from_numpy(raw).view(dtype).reshape(shape)
                 for name, (raw, dtype, shape) in self._saved.items()}
        module.load_state_dict(state)


@dataclass
class Training:
    """What a step trains: ``loss(model, *inputs)``, backward, ``optimizer.step()``."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    inputs: Tuple[torch.Tensor, ...]
    loss: Callable[..., torch.Tensor]


def task_training(task: "Task", model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  batch: int, device: str) -> Training:
    """``task``'s seeded batch of ``batch`` samples on ``device``, trained with ``model``
    and ``optimizer`` under the task's loss. The batch is made on the host with seed 1 and
    moved, so every benchmark trains on the same data whatever the device."""
    x, y = task.batch(batch, torch.Generator().manual_seed(1))
    return Training(model, optimizer, (x.to(device), y.to(device)), task.loss)


def no_wait() -> None:
    """The simulated device's :func:`device_sync`: its ops are done when they return."""


def device_sync(device: str) -> Callable[[], None]:
    """What waits for ``device``'s queued work before a clock is read."""
    return torch.cuda.synchronize if device == "cuda" else no_wait


@dataclass
class Steps:
    """What :func:`run_steps` measured: every step's wall time in seconds, in order, the
    first ``warmup`` of them warm-up."""

    seconds: List[float] = field(default_factory=list)
    warmup: int = 0
    # From the first timed step's start to the last one's end, synchronized at both ends
    # (with sync_every_step=False, the only synchronizations).
    total_s: float = 0.0

    @property
    def steps(self) -> int:
        """Steps completed."""
        return len(self.seconds)

    @property
    def timed(self) -> List[float]:
        """The steps after the warm-up (all of them where the warm-up took every step)."""
        return self.seconds[self.warmup:] or self.seconds

    @property
    def step_s(self) -> float:
        """The median of the timed steps."""
        return statistics.median(self.timed)

    @property
    def mean_s(self) -> float:
        """``total_s`` over the timed steps: with ``sync_every_step=False``, the one
        per-step time that is not cut up by synchronizations."""
        return self.total_s / len(self.timed)


@dataclass
class TrialResult(Steps):
    """What :func:`run_trial` found: the steps that ran, and why it stopped, if it did."""

    failure: Optional[str] = None   # OUT_OF_MEMORY, THRASH_LIMIT, NON_FINITE_LOSS or None
    error: str = ""                 # the error's text (pyalloc's report of an out-of-memory)

    @property
    def trained(self) -> bool:
        return self.failure is None


def run_steps(training: Training, steps: int, *, warmup: int = 0,
              sync: Callable[[], None] = no_wait, sync_every_step: bool = True,
              keep_loss: bool = False, on_warm: Optional[Callable[[], None]] = None,
              after_step: Optional[Callable[[int, Optional[torch.Tensor]], None]] = None,
              around_optimizer_step: Optional[Callable[[], ContextManager]] = None) -> Steps:
    """Trains ``steps`` steps of ``training`` and times each.

    A step: ``optimizer.zero_grad(set_to_none=True)``, ``loss(model, *inputs)``,
    ``backward()``, ``optimizer.step()``. Errors propagate; :func:`run_trial` catches them.

    Parameters
    ----------
    training : Training
        The model, optimizer, batch and loss.
    steps : int
        Steps to run, the warm-up included.
    warmup : int
        The first ``warmup`` steps are run and timed but left out of ``Steps.timed``.
    sync : callable
        Waits for the device (:func:`device_sync`); by default nothing is waited for.
    sync_every_step : bool
        True: synchronize before and after every step, so each step's time is its own.
        False: only before the first timed step and after the last (``Steps.mean_s``):
        no wait between steps, as a training loop runs.
    keep_loss : bool
        True: each step's loss lives until the next step's forward has made its own (a
        loop's ``loss = ...``), and ``after_step`` gets it. False: it dies right after
        backward (``loss_fn(...).backward()``). See Note [What a step keeps alive].
    on_warm : callable, optional
        Called once the warm-up steps are done, before the first timed step and outside
        its time: where steady-state counters start.
    after_step : callable, optional
        ``after_step(index, loss)`` after each step, outside its time (``loss`` is None
        unless ``keep_loss``).
    around_optimizer_step : callable, optional
        Returns a context manager the optimizer's step runs inside, within the step's
        time (to record what the step allocates).
    """
    out = Steps(warmup=warmup)
    _loop(training, steps, out, sync=sync, sync_every_step=sync_every_step,
          keep_loss=keep_loss, on_warm=on_warm, after_step=after_step,
          around_optimizer_step=around_optimizer_step)
    return out


def _loop(training: Training, steps: int, out: Steps, *, sync: Callable[[], None],
          sync_every_step: bool, keep_loss: bool, on_warm: Optional[Callable[[], None]],
          after_step: Optional[Callable[[int, Optional[torch.Tensor]], None]],
          around_optimizer_step: Optional[Callable[[], ContextManager]]
          ) -> Optional[torch.Tensor]:
    """:func:`run_steps`' loop, filling ``out`` as it goes (a trial that fails half-way
    keeps the steps it ran); returns the last loss where ``keep_loss``."""
    model, optimizer, inputs, loss_fn = (training.model, training.optimizer, training.inputs,
                                         training.loss)
    warmup = out.warmup
    loss = None
    first = 0.0
    for index in range(steps):
        timed = index >= warmup
        if index == warmup and on_warm is not None:
            on_warm()
        if sync_every_step or index == warmup:
            sync()
        start = time.perf_counter()
        if index == warmup:
            first = start
        optimizer.zero_grad(set_to_none=True)
        if keep_loss:
            loss = loss_fn(model, *inputs)
            loss.backward()
        else:
            loss_fn(model, *inputs).backward()
        if around_optimizer_step is None:
            optimizer.step()
        else:
            with around_optimizer_step():
                optimizer.step()
        if sync_every_step or (timed and index == steps - 1):
            sync()
        end = time.perf_counter()
        out.seconds.append(end - start)
        if timed:
            out.total_s = end - first
        if after_step is not None:
            after_step(index, loss)
    if warmup >= steps:   # no timed step: the warm-up stands in, as in Steps.timed
        out.total_s = sum(out.seconds)
    return loss


def run_trial(setup: Union[Training, Callable[[], Training]], steps: int, *, warmup: int = 0,
              sync: Callable[[], None] = no_wait, limit_s: Optional[float] = None,
              check_finite: bool = True, clear_after: bool = True,
              on_warm: Optional[Callable[[], None]] = None,
              after_step: Optional[Callable[[int, Optional[torch.Tensor]], None]] = None
              ) -> TrialResult:
    """Trains ``steps`` steps as one trial: whether it trained, and how fast.

    The trial fails, and says why in ``TrialResult.failure``, when it runs out of memory
    (``torch.OutOfMemoryError``, pyalloc's among them, or a ``RuntimeError`` that wraps
    one: ``load_state_dict`` does, see docs/design.md, "After an out-of-memory error"),
    when it takes longer than ``limit_s`` (thrashing is not a usable setting), or when
    ``check_finite`` and the last loss is not finite. Each step keeps its loss until the
    next makes its own (``keep_loss``), and every step is synchronized.

    Parameters
    ----------
    setup : Training or callable
        The training, or what makes it: called inside the trial (its time limit and its
        error handling), so that building or resetting the model under the budget can
        fail the trial as a step can.
    steps, warmup, sync, on_warm, after_step
        As :func:`run_steps`. The result holds no tensor: a caller that wants the last
        loss takes it in ``after_step`` (reading it inside the trial would be one more op
        through the registry, counted in its figures).
    limit_s : float, optional
        Seconds before the trial counts as thrashing (:func:`time_limit`); None: none.
    check_finite : bool
        Whether a non-finite last loss fails the trial (``torch.isfinite`` on the device).
    clear_after : bool
        Whether to free the gradients and collect garbage after a trial that trained too.
        After one that failed it is always done: a step stopped half-way leaves gradients
        (and, until the error is dropped, its activations), which the next trial must not
        inherit.
    """
    result = TrialResult(warmup=warmup)
    training: Optional[Training] = None
    loss: Optional[torch.Tensor] = None
    try:
        with time_limit(limit_s) if limit_s is not None else contextlib.nullcontext():
            training = setup() if callable(setup) else setup
            loss = _loop(training, steps, result, sync=sync, sync_every_step=True,
                         keep_loss=True, on_warm=on_warm, after_step=after_step,
                         around_optimizer_step=None)
            if check_finite and loss is not None and not bool(torch.isfinite(loss).item()):
                result.failure = NON_FINITE_LOSS
    except torch.OutOfMemoryError as e:
        result.failure, result.error = OUT_OF_MEMORY, str(e)
    except TooSlow as e:
        result.failure, result.error = THRASH_LIMIT, str(e) or f"past its limit of {limit_s} s"
    except RuntimeError as e:
        if OUT_OF_MEMORY not in str(e):
            raise
        result.failure, result.error = OUT_OF_MEMORY, str(e)
    finally:
        # In the order the loops this replaced freed them (Note [What a step keeps alive]):
        # the optimizer and its state, the batch, the last loss; then the gradients.
        model = training.model if training is not None else None
        del training, loss
        if clear_after or not result.trained:
            if model is not None:
                model.zero_grad(set_to_none=True)
            gc.collect()
        if not result.trained:
            drain_failed_backward()
    return result


def drain_failed_backward() -> None:
    """Lets go of what a backward pass that raised left queued on this thread.

    Note [What a failed backward leaves queued]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Autograd runs a backward pass's CPU work on the calling thread, from a ready queue that
    belongs to the thread and outlives the pass. When a function of the pass raises (an
    out-of-memory error in a gradient, or in a replay the registry runs for one), the
    tasks still queued stay there, each holding its autograd function and so the saved
    tensors of the graph behind it, until the thread's next backward pass pops them and
    drops them unrun. Plain PyTorch does the same (a tensor saved by a branch still
    queued lives on after the failed ``backward()`` and dies with the next one). On the
    simulated device every function is CPU work, so a trial that ran out of memory in
    backward handed the next trial up to half its budget of the failed one's activations:
    BERT's 0.43–0.49 of its peak "failed" right after a bisection's failures, and each
    trained on its own. A GPU's work runs on autograd's device threads instead, which
    keep popping and so drain their queues by themselves. One backward pass through a
    one-element tensor drains the calling thread's queue.
    """
    with torch.enable_grad():
        torch.ones((), requires_grad=True).backward()


# --- the time limit ------------------------------------------------------------------------------
class TooSlow(Exception):
    """A trial thrashed past its time limit: counted as not training at that setting."""


def _too_slow(signum, frame):
    raise TooSlow()


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raises :class:`TooSlow` in the block once ``seconds`` have passed. Python code is
    stopped by SIGALRM, repeated each second (one raised inside pyalloc's eviction callback
    is contained there: nothing may cross into C++). An op that recomputes in C++ (backward
    does not return to Python, so no signal handler runs) is stopped by the registry's
    :meth:`~pyalloc.registry.Registry.interrupt`, sent by a watchdog thread each second
    from then on; the error it raises becomes TooSlow. The main thread only (signals)."""
    from pyalloc import registry

    done = threading.Event()

    def watchdog() -> None:
        if done.wait(seconds):
            return
        while not done.is_set():
            reg = registry.active()
            if reg is not None:
                reg.interrupt()
            done.wait(1.0)

    thread = threading.Thread(target=watchdog, name="pyalloc-time-limit", daemon=True)
    signal.signal(signal.SIGALRM, _too_slow)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    thread.start()
    try:
        yield
    except RuntimeError as e:
        if "pyalloc: interrupted" in str(e):
            raise TooSlow() from e
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        done.set()
        thread.join()
        reg = registry.active()
        if reg is not None:
            reg.interrupt(False)   # one the block ended before taking
