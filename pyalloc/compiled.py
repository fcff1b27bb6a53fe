"""torch.compile under a policy (recompute, swap, hybrid).

Code that torch.compile generates reads and writes tensors through their data pointers,
not through the dispatcher, where the registry's per-op path restores an evicted tensor
before an op reads it and pins it while the op runs. Left alone, a compiled region reads
an evicted input where its bytes no longer are (a crash, or wrong numbers), and the
storages it makes through the dispatcher (an extern matmul's output) become nodes the
engine may evict while the region's own kernels still read them.

So while a registry is active, every graph inductor compiled runs as one op would (Note
[Holding for compiled code] in registry/src/registry.h):

* its inputs (the callable's arguments and whatever dynamo lifted into the graph) are
  restored and pinned for its run, and the registry steps aside on the calling thread:
  what the graph makes is no node, never evicted, and is held by the recordings of later
  ops that read it, as any tensor made outside the registry is;
* a compiled backward graph, run by autograd, gets the same on autograd's thread.

Eager code around compiled regions, and between the graphs of one compiled callable (graph
breaks, ``torch._dynamo.disable`` functions), keeps the policy. Backends other than inductor
that do not run their graphs through the dispatcher get the same for the whole callable
instead (:func:`guard`; Note [Graph breaks keep the policy]). What a graph holds is
resident for its whole run, so the smallest budget that trains rises by its working set.
``install()`` routes ``torch.compile`` here (:func:`enable`), so compile after install, as
the model is built after it; the guard does nothing while no registry is active.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, List, Optional

import torch
from torch.utils._pytree import tree_leaves

from . import _torch_shim, registry

_original_compile: Optional[Callable[..., Any]] = None
_lock = threading.Lock()


def _tensors(values: Any) -> List[torch.Tensor]:
    out = []
    for value in tree_leaves(values):
        if isinstance(value, torch.Tensor) and value.layout == torch.strided \
                and value.device.type != "meta":
            out.append(value)
    return out


class _Aside:
    """The registry steps aside on this thread and holds ``tensors`` until exit."""

    def __init__(self, reg: "registry.Registry", tensors: List[torch.Tensor]) -> None:
        self._hold = reg.holding(tensors)
        self._was: Optional[int] = None

    def __enter__(self) -> None:
        self._hold.__enter__()
        self._was = _torch_shim.load().pyalloc_registry_thread_enable(0)

    def __exit__(self, *exc: Any) -> None:
        _torch_shim.load().pyalloc_registry_thread_enable(self._was)
        self._hold.__exit__(*exc)


def _guard_backward(reg: "registry.Registry", inputs: List[torch.Tensor], outputs: Any) -> None:
    # One pre-hook and one hook per backward node of the region's outputs: autograd runs
    # them on the same thread, right before and right after the node. The compiled
    # backward reads the gradients it gets and what the forward saved: the forward's
    # outputs and intermediates (no nodes: made with the registry aside) and its inputs,
    # held weakly here so that holding them keeps nothing alive.
    saved = [weakref.ref(t) for t in inputs]
    seen = set()
    for out in _tensors(outputs):
        node = out.grad_fn
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        asides: List[_Aside] = []

        def before(grad_outputs: Any, asides: List[_Aside] = asides) -> None:
            alive = [t for t in (ref() for ref in saved) if t is not None]
            aside = _Aside(reg, _tensors(grad_outputs) + alive)
            aside.__enter__()
            asides.append(aside)

        def after(grad_inputs: Any, grad_outputs: Any, asides: List[_Aside] = asides) -> None:
            if asides:
                asides.pop().__exit__(None, None, None)

        node.register_prehook(before)
        node.register_hook(after)


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a compiled callable) run as described in the module's doc while a registry
    is active, and as it is otherwise."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        reg = registry.active()
        if reg is None:
            return fn(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        with _Aside(reg, inputs):
            out = fn(*args, **kwargs)
        if torch.is_grad_enabled():
            _guard_backward(reg, inputs, out)
        return out

    call.__pyalloc_guarded__ = True  # type: ignore[attr-defined]
    return call


def _guard_graphs() -> bool:
    """Every graph inductor compiled, forward and backward, holds all its inputs for its run
    and runs with the registry aside. The inputs are more than the compiled callable's
    arguments: dynamo lifts into the graph what the code reads from attributes, dicts,
    closures and globals (a module's tap of an eager activation), and a graph after a graph
    break gets its inputs from eager code in between. :func:`guard` held only the
    callable's arguments and :func:`_guard_backward` only its outputs' gradients: a lifted
    activation that was evicted was read by the kernel where it was not (the evicted-memory
    error), in forward and in the compiled backward. Where this torch has no such class
    (the layout of ``torch._inductor`` is not public), the callable-level guard is all.
    Returns whether the graphs are guarded."""
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except ImportError:
        try:
            from torch._inductor.codecache import CompiledFxGraph  # torch < 2.6
        except ImportError:
            return False
    original = CompiledFxGraph.__call__
    if getattr(original, "__pyalloc_guarded__", False):
        return True

    @functools.wraps(original)
    def __call__(self: Any, inputs: Any) -> Any:
        reg = registry.active()
        if reg is None:
            return original(self, inputs)
        # Taken before the call: the generated code empties `inputs` as it goes.
        with _Aside(reg, _tensors(list(inputs))):
            return original(self, inputs)

    __call__.__pyalloc_guarded__ = True  # type: ignore[attr-defined]
    CompiledFxGraph.__call__ = __call__
    return True


# Backends whose graphs run every op through the dispatcher, where the registry's per-op
# path sees them as it sees eager code.
_DISPATCHER_BACKENDS = frozenset({"eager", "aot_eager", "aot_eager_decomp_partition"})


def _needs_callable_guard(backend: Any, graphs_guarded: bool) -> bool:
    """Whether a compiled callable must hold its arguments and keep the registry aside
    for its whole call (:func:`guard`).

    Note [Graph breaks keep the policy]: a compiled callable is more than its graphs. Code
    dynamo cannot trace (a ``torch._dynamo.disable`` function, a graph break, a frame it
    gave up on) runs eagerly between them, and the callable-level guard kept the registry
    aside for all of it: what that code made was no node and could never leave, so a
    compiled model with breaks kept every eager activation resident. Where inductor's
    graphs are guarded one by one (:func:`_guard_graphs`), the callable needs nothing more:
    the eager code between graphs keeps the policy. Other backends (TensorRT, a user's
    own) may read data pointers anywhere, and keep the callable-level guard."""
    if isinstance(backend, str) and backend in _DISPATCHER_BACKENDS:
        return False
    return not (backend == "inductor" and graphs_guarded)


def _compile(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile`` whose result runs under :func:`guard` where it needs it
    (:func:`_needs_callable_guard`)."""
    assert _original_compile is not None
    graphs_guarded = _guard_graphs()  # here, not in enable(): importing inductor takes a second
    if model is None:  # used as @torch.compile(mode=...)
        return lambda fn: _compile(fn, **kwargs)
    compiled = _original_compile(model, **kwargs)
    if not _needs_callable_guard(kwargs.get("backend", "inductor"), graphs_guarded):
        return compiled
    if isinstance(compiled, torch.nn.Module):
        # OptimizedModule: calling it runs its forward; the module stays a module.
        compiled.forward = guard(compiled.forward)
        return compiled
    return guard(compiled)


def _refuse_capture_under_a_policy(capture_begin: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(capture_begin)
    def begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
        reg = registry.active()
        if reg is not None:
            # A captured graph replays fixed addresses: a tensor the registry evicts or
            # moves afterwards would be read and written where it no longer is.
            raise RuntimeError(
                f"pyalloc: CUDA graph capture is not supported while policy={reg.policy!r} "
                f"is active (a captured graph replays fixed addresses, which eviction and "
                f"swapping change). Capture with no policy (pyalloc.install() without "
                f"policy=, or outside a pyalloc.recompute() block); with a policy, compile "
                f"with a mode that does not capture (torch.compile's default, or "
                f"\"max-autotune-no-cudagraphs\") instead of \"reduce-overhead\".")
        return capture_begin(graph, *args, **kwargs)

    begin.__pyalloc_guarded__ = True  # type: ignore[attr-defined]
    return begin


def enable() -> None:
    """Routes ``torch.compile`` through :func:`_compile`, and makes CUDA graph capture
    refuse to start under a policy (idempotent; stays for the life of the process, doing
    nothing while no registry is active)."""
    global _original_compile
    with _lock:
        if _original_compile is None:
            _original_compile = torch.compile
            torch.compile = functools.wraps(_original_compile)(_compile)
            graph = getattr(torch.cuda, "CUDAGraph", None)
            if graph is not None and hasattr(graph, "capture_begin"):
                graph.capture_begin = _refuse_capture_under_a_policy(graph.capture_begin)
