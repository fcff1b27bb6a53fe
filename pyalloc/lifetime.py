"""Telling the engine which tensors will live long, so small blocks are placed by lifetime.

Why: best fit places a block by size alone. In training, the model and the optimizer's
state are made while other, short-lived tensors hold parts of the small pool's 2 MiB
segments (in the first step: the gradients), so long-lived blocks land in their holes and
keep those segments busy for the rest of the run, where a few segments of their own would
do (Note [Lifetime classes] in allocator/src/pool.h; docs/design.md).

What marks a phase long-lived, once :func:`arm` has run (``install()`` calls it):

* from ``install()`` to the first forward of any ``nn.Module`` (the model's construction);
* every ``optimizer.step()`` of a ``torch.optim`` optimizer (its state is made in the
  first one);
* the body of :func:`long_lived`, for what a program knows it keeps (an EMA copy of the
  model, a cache).

Everything else (forward, backward, evaluation) is short-lived. A wrong guess costs
placement, never correctness: a block's class only decides which free memory it may take
(a model that runs a forward inside its constructor, to infer a shape, makes the rest of
its parameters short-lived). The hooks cost a call into the library per optimizer step;
the forward hook removes itself after the first forward.
"""
from __future__ import annotations

import warnings

import contextlib
import threading
from typing import Any, Iterator, List, Optional

from . import _lib

_lock = threading.Lock()
_long_lived = False
_depth = 0                            # long_lived() blocks open now
_forward_hook: Optional[Any] = None   # removed by the first forward
_step_hooks: List[Any] = []


def _set(long_lived: bool) -> None:
    """Sets the phase of every installed engine."""
    global _long_lived
    with _lock:
        if long_lived != _long_lived:
            _long_lived = long_lived
            _lib.lib().pyalloc_set_long_lived(int(long_lived))


def _outside_steps() -> bool:
    """The phase between optimizer steps: long-lived inside a long_lived() block or before
    the model's first forward, short-lived otherwise."""
    return _depth > 0 or _forward_hook is not None


def is_long_lived() -> bool:
    """Whether allocations are now treated as long-lived."""
    return _long_lived


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """Allocations inside the block are expected to live long: the installed engines place
    small ones apart from short-lived blocks (option ``lifetime_classes``). The phase is the
    engines', not the thread's (backward runs on autograd's threads). Nests; a standalone
    :class:`~pyalloc.Engine` takes ``Engine.set_long_lived`` instead.

    >>> with pyalloc.long_lived():
    ...     ema = copy.deepcopy(model)   # kept for the whole run
    """
    global _depth
    with _lock:
        _depth += 1
    _set(True)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
        _set(_outside_steps())


def _first_forward(module: Any, args: Any) -> None:
    # The model is built: what follows is training or evaluation. Once is enough.
    global _forward_hook
    if _forward_hook is not None:
        _forward_hook.remove()
        _forward_hook = None
        _set(_outside_steps())


def _step_begins(optimizer: Any, args: Any, kwargs: Any) -> None:
    _set(True)


def _step_ends(optimizer: Any, args: Any, kwargs: Any) -> None:
    # Not "the phase before the step": a step that raised never got here, and its phase
    # would then outlive it.
    _set(_outside_steps())


def arm() -> None:
    """Marks what follows as long-lived until the first forward, and every optimizer step
    (``install()`` calls it; idempotent)."""
    import torch
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    global _forward_hook
    if _step_hooks:
        return
    _forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(_first_forward)
    # torch.compile(module) warns that global hooks fire once more for the compiled
    # module; this one removes itself at the first forward, so an extra call is harmless.
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there "
                            r"are global hooks", category=UserWarning)
    _step_hooks.extend([register_optimizer_step_pre_hook(_step_begins),
                        register_optimizer_step_post_hook(_step_ends)])
    _set(True)
