"""INPLACE_UPDATE mode: parameters, gradients and optimizer state in a region of their own,
updated in place (docs/design.md, "INPLACE_UPDATE mode").

Why: an optimizer step that allocates parameter-sized temporaries, and gradients that are
freed and allocated again every step (``zero_grad(set_to_none=True)``), churn the pool with
the largest long-lived blocks of the run, in between activations. MegEngine's
``MEGENGINE_INPLACE_UPDATE`` keeps them in place; this does the same for PyTorch.

With ``pyalloc.install(inplace_update=True)`` or ``PYALLOC_INPLACE_UPDATE=1``:

* Tensors the optimizer owns live in the engine's *persistent region*: segments of their
  own (pool ``persistent`` in snapshots), never shared with activations. A parameter is
  moved there the first time an optimizer step sees it (``p.data`` is replaced, so the
  ``Parameter`` object, and any tying of weights, stays the same); so is its gradient, and
  the optimizer's state is created there. Buffers are not moved.
* ``Optimizer.zero_grad()`` and ``Module.zero_grad()`` zero gradients in place (the
  ``set_to_none`` argument is ignored), so backward accumulates into the same memory.
* ``SGD`` (any momentum, dampening, Nesterov, weight decay, maximize), ``Adam`` and
  ``AdamW`` (amsgrad, weight decay, maximize) step with in-place kernels only: where
  PyTorch's step makes a temporary (``exp_avg_sq.sqrt() / c``, ``grad.add(param)``), this
  one writes into a scratch buffer allocated once per device and dtype. The arithmetic is
  PyTorch's single-tensor implementation, kernel for kernel, so training is bit-identical
  to the mode being off wherever PyTorch itself uses that implementation (the default for
  CPU tensors; on CUDA PyTorch defaults to its ``foreach`` kernels). Other optimizers and
  settings (tensor learning rates, complex parameters, ``capturable``, ``differentiable``,
  ``fused``) run PyTorch's own step inside the persistent region: their state lands there,
  and so do their temporaries (and, for other optimizers, the activations of a ``closure``
  passed to ``step``).

Steady state (from the second step): no allocation at all inside ``optimizer.step()`` for
the three optimizers above (tests/test_inplace.py counts them).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from . import _lib

_local = threading.local()
_enabled = False
_original: Dict[str, Callable[..., Any]] = {}
_hooks: List[Any] = []   # handles of the global optimizer step hooks
# Per (device, dtype): a flat buffer as large as the largest parameter, for the one
# temporary of a step. Allocated once, in the persistent region.
_scratch: Dict[Tuple[torch.device, torch.dtype], torch.Tensor] = {}
# A parameter already moved carries _HOME: (its storage, its gradient's storage or 0).
_HOME = "_pyalloc_home"


@contextlib.contextmanager
def persistent() -> Iterator[None]:
    """Allocations made by the calling thread inside the block come from the persistent
    region. Nests."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    if depth == 0:
        _lib.lib().pyalloc_set_thread_persistent(1)
    try:
        yield
    finally:
        _local.depth = depth
        if depth == 0:
            _lib.lib().pyalloc_set_thread_persistent(0)


def enabled() -> bool:
    return _enabled


def _moved(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in the persistent region (same shape, strides and contents)."""
    with persistent():
        out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _settle(p: torch.Tensor) -> None:
    """Moves ``p`` and its gradient to the persistent region, unless they are there."""
    home = getattr(p, _HOME, None)
    storage = p.untyped_storage()._cdata
    grad = p.grad.untyped_storage()._cdata if p.grad is not None else 0
    if home is not None and home[0] == storage and (grad == 0 or home[1] == grad):
        return
    if home is None or home[0] != storage:
        p.data = _moved(p.data)
    if p.grad is not None and (home is None or home[1] != grad):
        p.grad = _moved(p.grad)
    setattr(p, _HOME, (p.untyped_storage()._cdata,
                       p.grad.untyped_storage()._cdata if p.grad is not None else 0))


def _scratch_for(t: torch.Tensor) -> torch.Tensor:
    """A scratch tensor shaped like ``t`` (contents undefined). Grows, rarely."""
    key = (t.device, t.dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < t.numel():
        with persistent():
            buf = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
        _scratch[key] = buf
    # Valid for any dense layout (_supported checks it): the strides cover numel() elements.
    return buf[:t.numel()].as_strided(t.shape, t.stride())


def _dense(t: torch.Tensor) -> bool:
    """Strides that cover exactly numel() elements (any permutation of a contiguous
    layout), so a scratch region of numel() elements can take them."""
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)


# --- the in-place steps: PyTorch's single-tensor arithmetic, without temporaries --------------
def _grad_of(p: torch.Tensor, group: Dict[str, Any], scratch: torch.Tensor) -> torch.Tensor:
    """``grad`` (negated for maximize, plus weight decay unless decoupled), in ``scratch``
    when it must differ from ``p.grad``."""
    grad = p.grad
    if group.get("maximize", False):
        grad = torch.neg(grad, out=scratch)
    return grad


def _sgd_step(opt: torch.optim.Optimizer, group: Dict[str, Any], p: torch.Tensor) -> None:
    lr, wd = group["lr"], group["weight_decay"]
    momentum, dampening, nesterov = group["momentum"], group["dampening"], group["nesterov"]
    scratch = _scratch_for(p)
    grad = _grad_of(p, group, scratch)
    if wd != 0:
        grad = torch.add(grad, p, alpha=wd, out=scratch)
    if momentum != 0:
        state = opt.state[p]
        buf = state.get("momentum_buffer")
        if buf is None:
            with persistent():
                buf = grad.detach().clone()
            state["momentum_buffer"] = buf
        else:
            buf.mul_(momentum).add_(grad, alpha=1 - dampening)
        if nesterov:
            grad = torch.add(grad, buf, alpha=momentum, out=scratch)
        else:
            grad = buf
    p.add_(grad, alpha=-lr)


def _adam_step(opt: torch.optim.Optimizer, group: Dict[str, Any], p: torch.Tensor) -> None:
    lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    decoupled = group.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW))
    state = opt.state[p]
    if not state:   # as Adam._init_group does, in the persistent region
        with persistent():
            # PyTorch's _get_scalar_dtype(): float64 only under a float64 default dtype.
            scalar = torch.float64 if torch.get_default_dtype() == torch.float64 \
                else torch.float32
            state["step"] = torch.tensor(0.0, dtype=scalar)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    scratch = _scratch_for(p)
    grad = _grad_of(p, group, scratch)
    exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
    step_t += 1
    if wd != 0:
        if decoupled:
            p.mul_(1 - lr * wd)
        else:
            grad = torch.add(grad, p, alpha=wd, out=scratch)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step = step_t.item()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    second = exp_avg_sq
    if group["amsgrad"]:
        torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
        second = state["max_exp_avg_sq"]
    denom = torch.sqrt(second, out=scratch)   # grad is dead by now: the scratch is free
    denom.div_(bias_correction2_sqrt).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-step_size)


def _supported(opt: torch.optim.Optimizer) -> Optional[Callable[..., None]]:
    """The in-place step for ``opt``, or None where PyTorch's own must run."""
    if type(opt) is torch.optim.SGD:
        step = _sgd_step
    elif type(opt) in (torch.optim.Adam, torch.optim.AdamW):
        step = _adam_step
    else:
        return None
    for group in opt.param_groups:
        if any(group.get(flag) for flag in ("capturable", "differentiable", "fused")):
            return None
        if any(isinstance(group.get(k), torch.Tensor) for k in ("lr", "weight_decay")):
            return None
        if isinstance(group.get("betas", (0, 0))[0], torch.Tensor):
            return None
        for p in group["params"]:
            if p.grad is not None and (p.is_complex() or p.grad.is_sparse or not _dense(p)):
                return None
    return step


def _inplace_step(original: Callable[..., Any]) -> Callable[..., Any]:
    def step(self: torch.optim.Optimizer, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        _settle(p)
            one = _supported(self)
            if one is None:   # PyTorch's step, with its state (and temporaries) persistent
                with persistent():
                    result = original(self)
                return loss if closure is not None else result
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        one(self, group, p)
        return loss

    step.__wrapped__ = original  # type: ignore[attr-defined]
    return step


def _zero_in_place(params: Iterator[torch.Tensor]) -> None:
    for p in params:
        if p.grad is None:
            continue
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()


def _optimizer_zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    _zero_in_place(p for group in self.param_groups for p in group["params"])


def _module_zero_grad(self: torch.nn.Module, set_to_none: bool = True) -> None:
    _zero_in_place(self.parameters())


_INPLACE_CLASSES = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def _pre_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Any other optimizer: its step runs in the persistent region (PyTorch's global step
    hooks; the three in-place steps above replace ``step`` and do not call them)."""
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _settle(p)
    region = persistent()
    region.__enter__()
    _local.__dict__.setdefault("regions", []).append(region)


def _post_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    regions = getattr(_local, "regions", None)
    if regions:
        regions.pop().__exit__(None, None, None)


def enable() -> None:
    """Turns INPLACE_UPDATE on for the process (``install(inplace_update=True)`` calls it)."""
    global _enabled
    if _enabled:
        return
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    _hooks.extend([register_optimizer_step_pre_hook(_pre_step),
                   register_optimizer_step_post_hook(_post_step)])
    _original["Optimizer.zero_grad"] = torch.optim.Optimizer.zero_grad
    _original["Module.zero_grad"] = torch.nn.Module.zero_grad
    torch.optim.Optimizer.zero_grad = _optimizer_zero_grad
    torch.nn.Module.zero_grad = _module_zero_grad
    for cls in _INPLACE_CLASSES:
        _original[cls.__name__ + ".step"] = cls.step
        cls.step = _inplace_step(cls.step)
    _enabled = True


def disable() -> None:
    """Restores PyTorch's methods (what was moved stays where it is)."""
    global _enabled
    if not _enabled:
        return
    torch.optim.Optimizer.zero_grad = _original.pop("Optimizer.zero_grad")
    torch.nn.Module.zero_grad = _original.pop("Module.zero_grad")
    for cls in _INPLACE_CLASSES:
        cls.step = _original.pop(cls.__name__ + ".step")
    while _hooks:
        _hooks.pop().remove()
    _enabled = False
