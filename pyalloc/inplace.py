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
  one writes into a scratch buffer allocated once per device and dtype. Each mirrors,
  operation for operation, the implementation PyTorch would have chosen for the group:
  the single-tensor one (its default for CPU tensors) or the ``foreach`` one (its default
  on CUDA, where the two round differently), so training is bit-identical to the mode
  being off. Other optimizers and
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


def _scratch_flat(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The flat scratch buffer of ``device`` and ``dtype``, at least ``numel`` elements
    (contents undefined). Grows, rarely."""
    key = (device, dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        with persistent():
            buf = torch.empty(numel, dtype=dtype, device=device)
        _scratch[key] = buf
    return buf


def _scratch_for(t: torch.Tensor) -> torch.Tensor:
    """A scratch tensor shaped like ``t`` (contents undefined)."""
    buf = _scratch_flat(t.device, t.dtype, t.numel())
    # Valid for any dense layout (_supported checks it): the strides cover numel() elements.
    return buf[:t.numel()].as_strided(t.shape, t.stride())


def _dense(t: torch.Tensor) -> bool:
    """Strides that cover exactly numel() elements (any permutation of a contiguous
    layout), so a scratch region of numel() elements can take them."""
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)


# --- the in-place steps, without temporaries -------------------------------------------------
# PyTorch has two implementations of each step that round differently on CUDA: the
# single-tensor one (kernel per tensor; its default for CPU tensors) and the foreach one
# (one multi-tensor kernel per operation; its default for CUDA tensors). Each in-place step
# below mirrors the one PyTorch would have run, operation for operation, writing what
# PyTorch allocates into the scratch buffer instead. The foreach mirrors run the same
# multi-tensor kernels over lists of scratch views, a chunk of parameters at a time so the
# scratch stays one parameter large: each element's arithmetic is the same whatever list
# it is in, so the results are too.
def _init_adam_state(group: Dict[str, Any], state: Dict[str, Any], p: torch.Tensor) -> None:
    """As Adam._init_group does, in the persistent region."""
    with persistent():
        # PyTorch's _get_scalar_dtype(): float64 only under a float64 default dtype.
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        state["step"] = torch.tensor(0.0, dtype=scalar)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _uses_foreach(group: Dict[str, Any], params: List[torch.Tensor]) -> bool:
    """Whether PyTorch's step would take its foreach implementation for these parameters
    (the choice ``torch.optim.adam.adam`` and ``sgd.sgd`` make)."""
    if group.get("foreach") is not None:
        return bool(group["foreach"])
    from torch.optim.optimizer import _default_to_fused_or_foreach

    return _default_to_fused_or_foreach(params, False, use_fused=False)[1]


def _chunks(params: List[torch.Tensor]) -> Iterator[Tuple[List[torch.Tensor], List[torch.Tensor]]]:
    """``params`` grouped by device and dtype (as PyTorch's foreach steps group them), in
    runs that fit one scratch buffer together: (the run, a scratch view shaped like each)."""
    groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((p.device, p.dtype), []).append(p)
    for members in groups.values():
        buf = _scratch_flat(members[0].device, members[0].dtype, max(p.numel() for p in members))
        run: List[torch.Tensor] = []
        views: List[torch.Tensor] = []
        used = 0
        for p in members:
            if used + p.numel() > buf.numel():
                yield run, views
                run, views, used = [], [], 0
            run.append(p)
            views.append(buf[used:used + p.numel()].as_strided(p.shape, p.stride()))
            used += p.numel()
        if run:
            yield run, views


def _foreach_grads(run: List[torch.Tensor], scratch: List[torch.Tensor], maximize: bool,
                   weight_decay: float) -> List[torch.Tensor]:
    """The gradients a foreach step works on: ``p.grad``, or negated and/or plus weight
    decay in ``scratch`` where PyTorch's ``_foreach_neg``/``_foreach_add`` make new ones."""
    grads = [p.grad for p in run]
    if maximize or weight_decay != 0:
        torch._foreach_copy_(scratch, grads)
        grads = scratch
        if maximize:
            torch._foreach_neg_(grads)
        if weight_decay != 0:
            torch._foreach_add_(grads, run, alpha=weight_decay)
    return grads


def _grad_of(p: torch.Tensor, group: Dict[str, Any], scratch: torch.Tensor) -> torch.Tensor:
    """``grad`` (negated for maximize), in ``scratch`` when it must differ from ``p.grad``."""
    grad = p.grad
    if group.get("maximize", False):
        grad = torch.neg(grad, out=scratch)
    return grad


def _sgd_step(opt: torch.optim.Optimizer, group: Dict[str, Any], params: List[torch.Tensor]) -> None:
    """PyTorch's ``_single_tensor_sgd``, in place."""
    lr, wd = group["lr"], group["weight_decay"]
    momentum, dampening, nesterov = group["momentum"], group["dampening"], group["nesterov"]
    for p in params:
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


def _sgd_step_foreach(opt: torch.optim.Optimizer, group: Dict[str, Any],
                      params: List[torch.Tensor]) -> None:
    """PyTorch's ``_multi_tensor_sgd``, in place (including its in-place Nesterov update
    of ``p.grad``)."""
    lr, wd = group["lr"], group["weight_decay"]
    momentum, dampening, nesterov = group["momentum"], group["dampening"], group["nesterov"]
    # PyTorch decides per device and dtype whether every buffer exists; a chunk is a part
    # of one such group, so decide on the whole group first.
    all_buffers = {(p.device, p.dtype): True for p in params}
    for p in params:
        if opt.state[p].get("momentum_buffer") is None:
            all_buffers[(p.device, p.dtype)] = False
    for run, scratch in _chunks(params):
        grads = _foreach_grads(run, scratch, group.get("maximize", False), wd)
        if momentum != 0:
            if all_buffers[(run[0].device, run[0].dtype)]:
                bufs = [opt.state[p]["momentum_buffer"] for p in run]
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, grads, alpha=1 - dampening)
            else:
                bufs = []
                for p, grad in zip(run, grads):
                    buf = opt.state[p].get("momentum_buffer")
                    if buf is None:
                        with persistent():
                            buf = opt.state[p]["momentum_buffer"] = grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                    bufs.append(buf)
            if nesterov:
                torch._foreach_add_(grads, bufs, alpha=momentum)
            else:
                grads = bufs
        torch._foreach_add_(run, grads, alpha=-lr)


def _adam_step(opt: torch.optim.Optimizer, group: Dict[str, Any], params: List[torch.Tensor]) -> None:
    """PyTorch's ``_single_tensor_adam``, in place."""
    lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    decoupled = group.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW))
    for p in params:
        state = opt.state[p]
        if not state:
            _init_adam_state(group, state, p)
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


def _adam_step_foreach(opt: torch.optim.Optimizer, group: Dict[str, Any],
                       params: List[torch.Tensor]) -> None:
    """PyTorch's ``_multi_tensor_adam`` (capturable off), in place."""
    lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    decoupled = group.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW))
    for p in params:
        if not opt.state[p]:
            _init_adam_state(group, opt.state[p], p)
    for run, scratch in _chunks(params):
        states = [opt.state[p] for p in run]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, torch.tensor(1.0), alpha=1.0)   # CPU steps, as PyTorch
        if wd != 0 and decoupled:
            torch._foreach_mul_(run, 1 - lr * wd)
        grads = _foreach_grads(run, scratch, group.get("maximize", False),
                               0.0 if decoupled else wd)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        del grads   # the scratch is free again
        bias_correction1 = [1 - beta1 ** s.item() for s in steps]
        bias_correction2 = [1 - beta2 ** s.item() for s in steps]
        step_size = [(lr / bc) * -1 for bc in bias_correction1]
        bias_correction2_sqrt = [bc ** 0.5 for bc in bias_correction2]
        second = exp_avg_sqs
        if group["amsgrad"]:
            second = [s["max_exp_avg_sq"] for s in states]
            torch._foreach_maximum_(second, exp_avg_sqs)
        torch._foreach_copy_(scratch, second)
        torch._foreach_sqrt_(scratch)
        torch._foreach_div_(scratch, bias_correction2_sqrt)
        torch._foreach_add_(scratch, eps)
        torch._foreach_addcdiv_(run, exp_avgs, scratch, step_size)


def _supported(opt: torch.optim.Optimizer
               ) -> Optional[Callable[[torch.optim.Optimizer, Dict[str, Any], List[torch.Tensor]], None]]:
    """The in-place step for ``opt``'s groups, or None where PyTorch's own must run."""
    if type(opt) is torch.optim.SGD:
        single, multi = _sgd_step, _sgd_step_foreach
    elif type(opt) in (torch.optim.Adam, torch.optim.AdamW):
        single, multi = _adam_step, _adam_step_foreach
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

    def step(opt: torch.optim.Optimizer, group: Dict[str, Any], params: List[torch.Tensor]) -> None:
        (multi if _uses_foreach(group, params) else single)(opt, group, params)
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
                with_grad = [p for p in group["params"] if p.grad is not None]
                if with_grad:
                    one(self, group, with_grad)
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
