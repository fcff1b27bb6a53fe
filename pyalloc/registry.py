"""The tensor registry: lineage of activations, eviction through the engine, recompute on use.

The work happens in C++ (registry/src/, built with the torch shim; docs/design.md,
"Rematerialization"): a boxed fallback on a dispatch key that the policy's threads include
sees every aten op, forward and backward, with no Python on the way.

* An op that makes a new storage from a tensor that requires grad, with grad mode on, is
  recorded: the op, its arguments (registered storages by reference, anything else as it
  is), the generator state if the op is random, and a cost. The storage becomes a node,
  offered to the engine as evictable. Composite ops (``linear``, ``dropout``) are seen
  through to their pieces, so dropout's mask and autocast's casts are nodes too.
* In-place ops extend the lineage: a storage's contents are a *chain*, its creation
  followed by the mutations applied to it. What was recorded from an earlier version
  stays recomputable (replay rebuilds that version from the chain's first steps). A
  write the chain cannot follow (one op writing several storages, a non-replayable op)
  first settles what was recorded from the old contents: restored if evicted, then
  frozen.
* When an allocation does not fit, the engine chooses victims (evictor.cpp: ``dtr``,
  ``dte`` or ``window``) and calls the registry outside its lock; a victim's storage gives
  its memory back and every tensor and view of it stays valid. Any op that reads an
  evicted storage (forward, or backward reading a saved activation) restores it first:
  inputs restored recursively, the chain replayed, the result moved into the same
  storage, which leaves autograd's version counters alone.
* The registry holds storages weakly: when the program drops the last tensor of one that
  recorded ops still read, its memory goes at once and the node lives on as lineage (DTR's
  "eager eviction").
* Never evicted: parameters, buffers, inputs and gradients (no recorded op produces them),
  storages below ``min_bytes``, outputs of non-deterministic kernels (unless
  ``torch.use_deterministic_algorithms(True)``), storages written by an op the lineage
  cannot replay. A storage is pinned while an op or a replay uses it.

Swapping (``policy="swap"`` or ``"hybrid"``; docs/design.md, "Swap"): an evicted storage
may instead be copied to the engine's host pool on a side stream first, and comes back by a
copy on another; backward brings swapped storages back ahead of use in the order the
previous iteration used them; ``hybrid`` swaps what the copies can hide behind compute and
recomputes the rest (Capuchin).

This module starts and stops the C++ registry, passes its options, and reports: two ways
in, ``pyalloc.install(policy=...)`` (for the whole process, on the thread that calls it)
or ``with pyalloc.recompute(policy=...):`` around the steps that need it.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch.utils._pytree import tree_leaves

from . import _torch_shim, state
from .options import parse_conf
from .engine import Engine

POLICIES = ("recompute", "swap", "hybrid")
_COSTS = ("model", "time", "bytes")
# Registry.stats()'s counters (docs/stats.md, "remat.*"), also readable as attributes.
_COUNTERS = ("ops", "evictions", "eager_evictions", "recomputes", "recompute_ns", "frozen",
             "leaf_copies", "leaf_copy_bytes",
             "relocations", "backward_threads", "swap_outs", "swap_out_bytes", "swap_ins",
             "swap_in_bytes", "swap_wait_ns", "swap_fallbacks", "swap_failures", "prefetches",
             "prefetch_hits", "prefetch_ready", "chose_swap", "chose_recompute")


class _NodeInfo(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_uint64), ("key", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("pins", ctypes.c_int32), ("chain", ctypes.c_int32), ("readers", ctypes.c_int32),
                ("evicted", ctypes.c_uint8), ("dead", ctypes.c_uint8), ("frozen", ctypes.c_uint8),
                ("fixed", ctypes.c_uint8), ("clean", ctypes.c_uint8), ("marked", ctypes.c_uint8),
                ("last_resort", ctypes.c_uint8), ("op", ctypes.c_char * 64), ("data", ctypes.c_uint64),
                ("cost", ctypes.c_double), ("dead_bytes", ctypes.c_double)]


class Node:
    """A live view of one registered storage, for tests and tools.

    Every attribute is read from the registry when asked for. ``key`` is the storage's
    address (``tensor.untyped_storage()._cdata``), 0 once the program dropped it; ``chain``
    the length of its lineage (0: frozen); ``op`` the op that made it (``"aten::mm."``);
    ``clean``: a host copy equal to its contents exists; ``dead``: the program's storage is
    gone and the node lives on as lineage; ``last_resort``: under recompute it is evicted
    only where nothing else can go (its replay is too dear, or it may become a ``.grad``);
    ``cost``: the price of bringing it back in the cost model's unit, with the dead lineage
    its replay rebuilds; ``dead_bytes``: the bytes of that lineage.
    """

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def _info(self) -> _NodeInfo:
        info = _NodeInfo()
        if not _torch_shim.load().pyalloc_registry_node_info(self.handle, ctypes.byref(info)):
            raise KeyError(f"pyalloc: node {self.handle} is no longer registered")
        return info

    def __getattr__(self, name: str) -> Any:
        if name in ("key", "nbytes", "pins", "chain", "readers", "data", "cost", "dead_bytes"):
            return getattr(self._info(), name)
        if name == "op":
            return self._info().op.decode()
        if name in ("evicted", "dead", "frozen", "fixed", "clean", "marked", "last_resort"):
            return bool(getattr(self._info(), name))
        raise AttributeError(name)

    def __repr__(self) -> str:
        i = self._info()
        state = "evicted" if i.evicted else "resident"
        return f"Node({self.handle}, {i.nbytes} bytes, {state}, chain {i.chain})"


class _WhilePolicyRuns:
    """Something the process does while at least one policy runs: the first ``include()``
    turns it on (``_turn_on``), the last ``leave_out()`` off (``_turn_off``), both under
    ``_lock``; ``_users`` counts the policies running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0

    def include(self) -> None:
        with self._lock:
            self._users += 1
            if self._users == 1:
                self._turn_on()

    def leave_out(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._turn_off()

    def _turn_on(self) -> None:
        raise NotImplementedError

    def _turn_off(self) -> None:
        raise NotImplementedError


# Note [Threads the program starts]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The registry's dispatch key is thread-local: included on the thread that starts the policy,
# and inherited by autograd's worker threads from the graph task's state. A thread the program
# starts itself (threading.Thread, a ThreadPoolExecutor's workers: a metrics logger, an
# evaluation run beside training) ran its ops without it, so an op there that read an evicted
# storage read memory that was not there: a segmentation fault. So while a policy runs, every
# thread started through `threading` includes the key as well. threading installs its profile
# hook in each thread it starts; ours, at the thread's first Python call, includes the key and
# hands the thread to the hook that was there before (a profiler's), if any. Threads already
# running when the policy started are not reached: start them after install(). A thread keeps
# the key after the policy stops; the fallback then only passes its ops on.
class _ThreadsStarted(_WhilePolicyRuns):
    def __init__(self) -> None:
        super().__init__()
        self._previous: Optional[Callable[..., Any]] = None

    def _hook(self, frame: Any, event: str, arg: Any) -> Any:
        previous = self._previous
        sys.setprofile(previous)          # this thread's hook from now on: the one before ours
        _torch_shim.load().pyalloc_registry_thread_enable(1)
        return previous(frame, event, arg) if previous is not None else None

    def _turn_on(self) -> None:
        get = getattr(threading, "getprofile", lambda: getattr(threading, "_profile_hook", None))
        self._previous = get()
        threading.setprofile(self._hook)

    def _turn_off(self) -> None:
        current = getattr(threading, "_profile_hook", None)
        if current == self._hook:     # not replaced since (by a profiler started later)
            threading.setprofile(self._previous)
        self._previous = None


_threads_started = _ThreadsStarted()


# Note [Storage access around the dispatcher]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An evicted storage comes back for any op that reads it, and a write through an op
# settles what was recorded from the old contents; but some of the tensor API touches
# storages with no op.
# * Reads: copy.deepcopy and pickle (torch.save) take `untyped_storage()`, whose nbytes() is
#   0 while evicted (deepcopy made an empty storage and failed in set_(); pickle would have
#   written an empty one), and `tolist()` reads the data pointer. A module that keeps a
#   detached activation (an attribute, a buffer, a memory bank) met this on every deepcopy
#   or checkpoint. So while a policy runs, `__deepcopy__`, `__reduce_ex__` and `tolist` of
#   torch.Tensor hold the tensor resident while they run (deepcopy's new storage must not
#   evict the one it copies), and `numpy()`, `__dlpack__` and `__cuda_array_interface__`,
#   which hand the memory itself to another library, bring it back and pin it there for
#   good (Note [Storages the program reads itself] in registry/src/restore.cpp).
# * Writes: `UntypedStorage.resize_` frees or reallocates a storage's memory, its contents
#   lost; FSDP does it to every gathered parameter after use. It settles what was recorded
#   from the storage first, as an op's write would (Note [Storages resized outside the
#   dispatcher] there): before, the next write of the parameter settled its readers from
#   memory just reallocated, and activations came back from garbage.
# * Subclasses: a `__torch_dispatch__` subclass (torchao's float8 and scaled tensors, a
#   user's wrapper) keeps plain tensors inside, and its handler runs ops on them below every
#   key above Python's, the registry's included, so those ops never restore them. A float8
#   cast of an activation is a node, evicted like any, and the subclass's next op read it
#   where it was not. So while a policy runs, the `__torch_dispatch__` of every subclass
#   (those defined before and, through `__init_subclass__`, after) holds the plain tensors
#   inside its tensor arguments (`__tensor_flatten__`'s, else the instance's attributes)
#   for the call. PyTorch's own (FakeTensor, FunctionalTensor: no real storage) are left.
# `untyped_storage()` itself is left alone: code that sums storage sizes (a memory report)
# would otherwise bring back everything it looks at, and an evicted storage's nbytes() of 0
# is the truth about where its memory is. Reads through `data_ptr()` (a Triton or CUDA
# extension kernel) are not covered either: those get the evicted-memory error, whose
# message says how to hold the tensors; writes through it are not seen at all.
class _StorageAccess(_WhilePolicyRuns):
    _HOLD = ("__deepcopy__", "__reduce_ex__", "tolist")
    _EXPORT = ("numpy", "__dlpack__")

    def __init__(self) -> None:
        super().__init__()
        # (class, attribute, what the class itself held before: None when it inherited it)
        self._saved: List[Any] = []

    @staticmethod
    def _plain(t: Any) -> bool:
        # A subclass keeps its data its own way (its inner tensors are plain ones).
        return (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and \
            torch._C._has_storage(t)

    @classmethod
    def _export(cls, t: torch.Tensor) -> None:
        # (numpy() of a tensor that requires grad raises: nothing is exported.)
        if cls._plain(t) and not t.requires_grad and _torch_shim.load().pyalloc_registry_expose(
                t.untyped_storage()._cdata, 1) != 0:
            raise _torch_shim.last_exception()

    @staticmethod
    def _inner_plain(values: Any, out: List[torch.Tensor], depth: int = 0) -> None:
        """The plain tensors inside the subclass instances among ``values``."""
        for value in tree_leaves(values):
            if not isinstance(value, torch.Tensor) or _StorageAccess._plain(value) or depth > 4:
                continue
            flatten = getattr(value, "__tensor_flatten__", None)
            try:
                inner = [getattr(value, n) for n in flatten()[0]] if flatten else \
                    list(vars(value).values())
            except Exception:  # a subclass's own business; holding is best effort
                continue
            for t in inner:
                if isinstance(t, torch.Tensor):
                    if _StorageAccess._plain(t):
                        out.append(t)
                    else:
                        _StorageAccess._inner_plain(t, out, depth + 1)

    @staticmethod
    def _adopt_results(out: Any, held: List[torch.Tensor]) -> None:
        """Under swap and hybrid, the new plain tensors inside a subclass op's results become
        nodes without lineage, which can leave as host copies (Note [What a subclass's results
        keep inside] in registry/src/registry.cpp). What its arguments held (an in-place op
        returns them) is left as it is."""
        made: List[torch.Tensor] = []
        _StorageAccess._inner_plain(out, made)
        if not made:
            return
        old = {t.untyped_storage()._cdata for t in held}
        keys = [k for k in (t.untyped_storage()._cdata for t in made) if k not in old]
        if keys and _torch_shim.load().pyalloc_registry_adopt(
                (ctypes.c_void_p * len(keys))(*keys), len(keys)) == ctypes.c_size_t(-1).value:
            raise _torch_shim.last_exception()

    def _wrap_dispatch(self, cls: Any) -> None:
        """Holds what `cls`'s instances keep inside, for its ``__torch_dispatch__``."""
        original = cls.__dict__.get("__torch_dispatch__")
        if not isinstance(original, classmethod) or \
                getattr(original.__func__, "__pyalloc_holds__", False) or \
                (cls.__module__ or "").startswith(("torch._subclasses", "torch._functorch")):
            return
        fn = original.__func__

        def __torch_dispatch__(klass: Any, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            registry = _current
            if registry is None:
                return fn(klass, func, types, args, kwargs)
            inner: List[torch.Tensor] = []
            _StorageAccess._inner_plain((args, kwargs), inner)
            if inner:
                with registry.holding(inner):
                    out = fn(klass, func, types, args, kwargs)
            else:
                out = fn(klass, func, types, args, kwargs)
            if registry.policy != "recompute" or registry.relocate:
                _StorageAccess._adopt_results(out, inner)
            return out

        functools.update_wrapper(__torch_dispatch__, fn)
        __torch_dispatch__.__pyalloc_holds__ = True  # type: ignore[attr-defined]
        self._saved.append((cls, "__torch_dispatch__", original))
        setattr(cls, "__torch_dispatch__", classmethod(__torch_dispatch__))

    def _wrap_subclasses(self) -> None:
        seen, todo = set(), list(torch.Tensor.__subclasses__())
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            todo.extend(cls.__subclasses__())
            self._wrap_dispatch(cls)

    def _wrap(self, name: str, original: Any) -> Any:
        plain, export = self._plain, self._export
        if name in self._EXPORT:
            def method(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                export(t)
                return original(t, *args, **kwargs)
        else:
            def method(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                registry = _current
                if registry is None or not plain(t):
                    return original(t, *args, **kwargs)
                with registry.holding([t]):
                    return original(t, *args, **kwargs)
        method.__name__ = name
        method.__qualname__ = "Tensor." + name
        method.__doc__ = getattr(original, "__doc__", None)
        return method

    @staticmethod
    def _wrap_resize(original: Any) -> Any:
        def resize_(storage: Any, size: Any) -> Any:
            if _torch_shim.load().pyalloc_registry_before_resize(storage._cdata) != 0:
                raise _torch_shim.last_exception()
            return original(storage, size)

        resize_.__doc__ = getattr(original, "__doc__", None)
        return resize_

    def _turn_on(self) -> None:
        def replace(cls: Any, name: str, value: Any) -> None:
            self._saved.append((cls, name, cls.__dict__.get(name)))
            setattr(cls, name, value)

        for name in self._HOLD + self._EXPORT:
            replace(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        self._wrap_subclasses()
        access = self

        def __init_subclass__(cls: Any, **kwargs: Any) -> None:
            super(torch.Tensor, cls).__init_subclass__(**kwargs)
            with access._lock:
                if access._users > 0:
                    access._wrap_dispatch(cls)

        replace(torch.Tensor, "__init_subclass__", classmethod(__init_subclass__))
        replace(torch.UntypedStorage, "resize_",
                self._wrap_resize(torch.UntypedStorage.resize_))
        prop = torch.Tensor.__dict__.get("__cuda_array_interface__")
        if isinstance(prop, property) and prop.fget is not None:
            fget, export = prop.fget, self._export
            replace(torch.Tensor, "__cuda_array_interface__",
                    property(lambda t: (export(t), fget(t))[1], doc=prop.__doc__))

    def _turn_off(self) -> None:
        for cls, name, saved in reversed(self._saved):
            if saved is None:
                delattr(cls, name)            # back to the base class's own
            else:
                setattr(cls, name, saved)
        self._saved.clear()


_storage_access = _StorageAccess()


# Note [TorchScript fusion under a policy]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# TorchScript's profiling executor fuses elementwise ops into groups (prim::TensorExprGroup,
# NNC; on by default for CUDA tensors, and on the CPU once a program calls
# torch._C._jit_override_can_fuse_on_cpu(True)) whose generated kernel reads its inputs by
# data pointer: no aten op runs, so the registry cannot restore an evicted input first or
# pin it while the kernel runs. Inside a differentiable graph the inputs reach the group
# through `detach`es the registry sees (each restores its source), but not pinned: an op of
# the same graph that allocates may evict one before the group reads it; and a scripted
# function called on tensors that do not require grad (under no_grad, or on detached
# activations) hands its inputs to the group as they are. Seen on the simulated device with
# the CPU fuser on: a scripted cell called under no_grad on a detached activation, evicted
# in between, stopped with the evicted-memory error. So while a policy runs, TorchScript's
# fusers are off (the CPU, GPU, NNC and oneDNN Graph switches, as `torch.jit.fuser("none")`
# sets them) and its groups' ops run one by one through the dispatcher, where the registry
# sees them; the switches come back as they were when the policy stops. The cost is the
# fusion's speed for scripted code. Graphs optimized before the policy started keep their
# groups: install() comes before the model is built. nvFuser left TorchScript in torch 2.2:
# its switch is a no-op whose getter prints a deprecation warning, which reading it put on
# every user's stderr at install(), so it is not touched.
class _ScriptFusion(_WhilePolicyRuns):
    _SWITCHES = (("_jit_can_fuse_on_cpu", "_jit_override_can_fuse_on_cpu"),
                 ("_jit_can_fuse_on_gpu", "_jit_override_can_fuse_on_gpu"),
                 ("_jit_texpr_fuser_enabled", "_jit_set_texpr_fuser_enabled"),
                 ("_jit_llga_enabled", "_jit_set_llga_enabled"))

    def __init__(self) -> None:
        super().__init__()
        self._turned_off: List[Callable[[bool], Any]] = []   # the setters of switches that were on

    def _turn_on(self) -> None:
        for get, set_ in self._SWITCHES:
            getter, setter = getattr(torch._C, get, None), getattr(torch._C, set_, None)
            if getter is None or setter is None:
                continue          # a torch without that fuser
            try:
                if getter():
                    setter(False)
                    self._turned_off.append(setter)
            except RuntimeError:
                pass              # a build that refuses the switch has no such fuser

    def _turn_off(self) -> None:
        for setter in reversed(self._turned_off):
            setter(True)
        self._turned_off.clear()


_script_fusion = _ScriptFusion()


class Registry:
    """The handle of the running C++ registry; see the module doc.

    The registry sees eager ops only: compiled kernels read storages without passing
    through the dispatcher. So under a policy a ``torch.compile`` region holds the tensors
    it reads and makes for its run (pyalloc/compiled.py), and CUDA graph capture is
    refused with an error.

    Parameters
    ----------
    engine : Engine
        The engine that allocates the tensors (the installed one for the device).
    min_bytes : int
        Storages smaller than this are never evicted (DTR and MegEngine ignore small
        tensors too: they free little and cost a search and a replay each).
    cost : {"model", "time", "bytes"}
        The cost of bringing a storage back: ``"model"`` (default) estimates it from the
        op's bytes and FLOPs, deterministic and meaningful on an asynchronous GPU;
        ``"time"`` measures the op on the host clock (meaningful only where ops are
        synchronous, the simulated device); ``"bytes"`` is the output's size.
    policy : {"recompute", "swap", "hybrid"}
        How an evicted storage comes back. ``swap`` and ``hybrid`` need the engine's host
        pool (:meth:`Engine.set_host_pool`; :func:`enable` sets it).
    prefetch : int
        swap/hybrid: how many swapped-out storages each backward use brings back ahead.
    relocate : bool
        recompute: what cannot be recomputed within the budget (storages with no lineage,
        replays that would rebuild too much dead lineage) may leave through the host pool
        instead, and storages may be moved out of the way through it to make room for a
        request that no amount of recomputation can serve (option ``spill``). They come
        back on their next use.
    """

    def __init__(self, engine: Engine, min_bytes: int = 1 << 10, cost: str = "model",
                 policy: str = "recompute", prefetch: int = 4, relocate: bool = False) -> None:
        if cost not in _COSTS:
            raise ValueError(f'cost must be "model", "time" or "bytes", not {cost!r}')
        if not isinstance(min_bytes, int) or isinstance(min_bytes, bool) or min_bytes < 0:
            raise ValueError(f"min_bytes must be a non-negative int, got {min_bytes!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"prefetch must be a non-negative int, got {prefetch!r}")
        self.engine = engine
        self.min_bytes = min_bytes
        self.cost_model = cost
        self.policy = policy
        self.prefetch_depth = prefetch if policy != "recompute" else 0
        self.relocate = relocate
        self.copy_bw = 0.0
        self._running = False
        self._was_enabled = False

    # --- life -----------------------------------------------------------------------------
    def _start(self) -> None:
        shim = _torch_shim.load()
        claim_dispatch_key()
        device = torch.cuda.current_device() if state.installed_device() == "cuda" else -1
        place = parse_conf(self.engine.options_string)["evictable_placement"] == "true"
        if shim.pyalloc_registry_start(
                self.engine.handle, POLICIES.index(self.policy), _COSTS.index(self.cost_model),
                self.min_bytes, self.prefetch_depth, int(self.relocate), device, int(place)) != 0:
            raise _torch_shim.last_exception()
        self._running = True
        self._was_enabled = bool(shim.pyalloc_registry_thread_enable(1))
        _threads_started.include()
        _storage_access.include()
        _script_fusion.include()      # Note [TorchScript fusion under a policy]

    def _stop(self) -> None:
        if not self._running:
            return
        shim = _torch_shim.load()
        _threads_started.leave_out()
        _storage_access.leave_out()
        _script_fusion.leave_out()
        shim.pyalloc_registry_thread_enable(int(self._was_enabled))
        self._running = False
        if shim.pyalloc_registry_stop() != 0:
            raise RuntimeError(_torch_shim.last_error())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Within the block the calling thread's ops bypass the registry (benchmarks compare
        with and without it in one process). Nothing is recorded or brought back there: an op
        that reads a tensor the registry evicted raises the evicted-memory error. Read such
        tensors inside ``holding([...])`` as well, or outside the block."""
        shim = _torch_shim.load()
        was = shim.pyalloc_registry_thread_enable(0)
        try:
            yield
        finally:
            shim.pyalloc_registry_thread_enable(was)

    @contextlib.contextmanager
    def holding(self, tensors: List[torch.Tensor]) -> Iterator[None]:
        """Within the block the storages of ``tensors`` that are nodes are resident and
        pinned: neither evicted nor moved (Note [Holding for compiled code] in
        registry/src/registry.h)."""
        keys = [t.untyped_storage()._cdata for t in tensors]
        # Not the tensors themselves: a compiled graph frees its inputs as it goes (it
        # empties the list it is given), and a reference here would keep them to the end.
        del tensors
        if not keys:
            yield
            return
        shim = _torch_shim.load()
        handles = (ctypes.c_uint64 * len(keys))()
        held = shim.pyalloc_registry_hold((ctypes.c_void_p * len(keys))(*keys), len(keys),
                                          handles)
        if held == ctypes.c_size_t(-1).value:
            raise _torch_shim.last_exception()
        try:
            yield
        finally:
            shim.pyalloc_registry_release(handles, held)

    # --- statistics -----------------------------------------------------------------------
    def stats(self) -> Dict[str, int]:
        """Counters (docs/stats.md, the ``remat.*`` keys) and the nodes' state now."""
        return json.loads(_torch_shim.take_string(_torch_shim.load().pyalloc_registry_stats_json()))

    def replays_by_op(self) -> Dict[str, int]:
        """How many times each op was replayed since the policy started (``"aten::mm"``:
        12, ...): creations, in-place steps and nested replays alike. What recompute spends
        its time on — and so which of the model's tensors it chose to drop."""
        return json.loads(_torch_shim.take_string(_torch_shim.load().pyalloc_registry_replays_json()))

    def __getattr__(self, name: str) -> Any:
        # The counters read as attributes: reg.evictions, reg.recomputes, reg.swap_outs, ...
        # (the swap counters are 0 under a policy that never swaps).
        if name in _COUNTERS:
            return self.stats().get(name, 0)
        raise AttributeError(name)

    # --- nodes ----------------------------------------------------------------------------
    @property
    def nodes(self) -> Dict[int, Node]:
        """Every node, by handle, in creation order (live views)."""
        shim = _torch_shim.load()
        n = shim.pyalloc_registry_handles(None, 0)
        buf = (ctypes.c_uint64 * max(n, 1))()
        n = min(n, shim.pyalloc_registry_handles(buf, n))
        return {buf[i]: Node(buf[i]) for i in range(n)}

    def node_of(self, t: torch.Tensor) -> Optional[Node]:
        """The node of ``t``'s storage, or None if it is not registered."""
        handle = _torch_shim.load().pyalloc_registry_handle_of(t.untyped_storage()._cdata)
        return Node(handle) if handle else None

    def evict(self, handles: List[int]) -> int:
        """Evicts the nodes behind ``handles`` now, as the engine would; returns how many."""
        arr = (ctypes.c_uint64 * max(len(handles), 1))(*handles)
        return int(_torch_shim.load().pyalloc_registry_evict(arr, len(handles)))

    def interrupt(self, on: bool = True) -> None:
        """Makes the next op or recomputation, on any thread, raise a ``RuntimeError``
        starting "pyalloc: interrupted" (once; ``on=False`` withdraws one not delivered
        yet). For watchdogs: a Python signal handler cannot stop an op that recomputes for
        too long, since backward runs in C++ without returning to Python. What the
        program holds is left as an out-of-memory error leaves it."""
        _torch_shim.load().pyalloc_registry_interrupt(1 if on else 0)

    def restore_all(self) -> None:
        """Restores every evicted storage the program still holds (oldest first)."""
        if _torch_shim.load().pyalloc_registry_restore_all() != 0:
            raise _torch_shim.last_exception()

    def collect(self) -> None:
        """Forgets now what the program no longer holds (the nodes of a step that ended by
        an exception, storages only lineage needed), freeing their memory; pyalloc's
        ``empty_cache()`` calls it. Call between steps, on the program's thread."""
        _torch_shim.load().pyalloc_registry_collect()

    def check_invariants(self) -> None:
        """Raises RuntimeError naming the first broken invariant of the registry's nodes."""
        if _torch_shim.load().pyalloc_registry_check_invariants() != 0:
            raise RuntimeError(_torch_shim.last_error())

    # --- swapping -------------------------------------------------------------------------
    def calibrate_copies(self, nbytes: int = 8 << 20) -> float:
        """Measures one swap copy's bandwidth (bytes/s) on this device: the hybrid policy
        compares copy time with compute time."""
        nbytes = max(4096, min(nbytes, int(self.engine.stats()["host_pool_bytes"]) // 2))
        cuda = state.installed_device() == "cuda"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        stream = torch.cuda.current_stream().cuda_stream if cuda else 0
        with self.paused():
            # empty, not ones: what the bytes hold does not matter to a copy, and on the
            # simulated device a fill of this size is an OpenMP region, after which the
            # process's first MKL sgemm can round its calling thread's rows differently from
            # every later call of the same product (docs/design.md, "The first sgemm after a
            # parallel region"): a recompute of that op could not match its bits.
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            best = float("inf")
            for _ in range(3):   # the first round also faults the host pages in
                self.engine.synchronize()
                start = time.perf_counter_ns()
                slot = self.engine.swap_out(buf.data_ptr(), nbytes, stream)
                self.engine.synchronize()
                mid = time.perf_counter_ns()
                self.engine.swap_in(slot, buf.data_ptr(), stream)
                self.engine.synchronize()
                end = time.perf_counter_ns()
                self.engine.swap_release(slot)
                best = min(best, max(mid - start, end - mid))
            del buf
        self.copy_bw = nbytes / max(best, 1) * 1e9
        _torch_shim.load().pyalloc_registry_set_copy_bandwidth(self.copy_bw)
        return self.copy_bw

    @contextlib.contextmanager
    def _replay_limits(self, in_order: int, give_up: int) -> Iterator[None]:
        """For tests: within the block, a restore nested more than ``in_order`` replays deep
        on a thread brings back its evicted lineage in order, and one nested more than
        ``give_up`` deep raises an out-of-memory error (Note [Deep replays] in
        registry/src/restore.cpp; the defaults are 32 and 256). An in-order restore runs one
        level deeper than the restore that started it, so ``give_up`` just one above
        ``in_order`` would make every in-order restore give up: refused."""
        if give_up == in_order + 1:
            raise ValueError(f"give_up={give_up} is in_order + 1: every in-order restore would "
                             f"give up; use at least in_order + 2, or at most in_order")
        shim = _torch_shim.load()
        was = (ctypes.c_int * 2)()
        shim.pyalloc_registry_set_replay_limits(in_order, give_up, was)
        try:
            yield
        finally:
            shim.pyalloc_registry_set_replay_limits(was[0], was[1], (ctypes.c_int * 2)())

    # --- the floor probe (tools/bench_remat.py) --------------------------------------------
    @contextlib.contextmanager
    def floor_probe(self) -> Iterator[Dict[str, Any]]:
        """Within the block, each op measures allocated bytes at its peak less the bytes of
        recomputable resident storages it does not read; the dict it yields holds the
        worst op's figures (``bytes``, ``allocated``, ``droppable``, ``op``) on exit."""
        shim = _torch_shim.load()
        found: Dict[str, Any] = {}
        shim.pyalloc_registry_set_floor_probe(1)
        try:
            yield found
        finally:
            found.update(json.loads(_torch_shim.take_string(shim.pyalloc_registry_floor_json())))
            shim.pyalloc_registry_set_floor_probe(0)


def claim_dispatch_key() -> None:
    """Registers the registry's per-op path on its dispatch key (once per process).

    Raises
    ------
    RuntimeError
        Another library already holds the key (torchdistx's ``deferred_init`` does); the
        message names where it was registered and what to do. Nothing is changed.
    """
    shim = _torch_shim.load()
    if shim.pyalloc_registry_register() != 0:
        raise RuntimeError(_torch_shim.last_error())


_active: Optional[Registry] = None    # the process-wide registry of install(policy=...)
_current: Optional[Registry] = None   # the running one: _active, or a recompute() block's


def active() -> Optional[Registry]:
    """The running registry (of ``install(policy=...)`` or of a ``recompute()`` block), or
    None."""
    return _current


def host_pool_size(engine: Engine, requested: int = 0, policy: str = "swap") -> int:
    """The host pool to allocate: ``requested``, or (0) under swap and hybrid as much as
    the device has, at most a quarter of the host's RAM (pinned memory is taken from
    everything else); under recompute, where it only takes what is spilled, as much as
    the budget, at most a sixteenth of the host's RAM (Note [How large a spill pool] in
    registry/src/evict.cpp)."""
    if requested:
        return requested
    stats = engine.stats()
    device_total = int(stats["device_total_bytes"])
    try:
        host_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):   # not exposed: assume it is no smaller than the device
        host_ram = 4 * device_total
    if policy == "recompute":
        budget = int(stats["budget_bytes"]) or device_total
        return max(1 << 20, min(budget, host_ram // 16))
    return max(1 << 20, min(device_total, host_ram // 4))


def check_spill(policy: str, spill: bool, host_pool: int) -> None:
    """A host pool under recompute is only for spilling: with spill off it is a mistake
    (the pool would never be used), so it is refused rather than ignored."""
    if policy == "recompute" and not spill and host_pool:
        raise ValueError(
            f"pyalloc: host_pool is {host_pool} bytes but spill is false: under policy "
            "recompute the host pool only holds what is spilled. Leave spill on (the "
            "default) to use the pool, or leave host_pool unset for no host memory at all")


def _start(engine: Engine, min_bytes: int, cost: str, policy: str = "recompute",
           prefetch: int = 4, host_pool: int = 0, spill: bool = True) -> Registry:
    global _current
    check_spill(policy, spill, host_pool)
    # Under recompute the host pool takes only what is spilled (option spill), which most
    # programs never meet: it is allocated at the first spill (Note [A host pool made at
    # first use] in allocator/src/swap.cpp). Copy bandwidth matters there only to the
    # cost model "time", which measures it now, and so needs the pool now.
    pooled = policy != "recompute" or spill
    deferred = policy == "recompute" and cost != "time"
    registry = Registry(engine, min_bytes, cost, policy, prefetch,
                        relocate=policy == "recompute" and spill)
    if pooled:
        engine.set_host_pool(host_pool_size(engine, host_pool, policy), at_first_use=deferred)
    registry._start()
    _current = registry
    if pooled and not deferred:
        registry.calibrate_copies()
    return registry


def _stop(registry: Registry) -> None:
    global _current
    try:
        registry._stop()
    finally:
        _current = None


def _settings(engine: Engine, **given: Any) -> Dict[str, Any]:
    """``given`` with every None filled in from the engine's options."""
    chosen = parse_conf(engine.options_string)
    defaults = {"min_bytes": int(chosen["min_evictable"]), "cost": chosen["remat_cost"],
                "policy": chosen["policy"] if chosen["policy"] in POLICIES else "recompute",
                "prefetch": int(chosen["prefetch"]), "host_pool": int(chosen["host_pool"]),
                "spill": chosen["spill"] == "true"}
    return {k: defaults[k] if v is None else v for k, v in given.items()}


def enable(engine: Optional[Engine] = None, min_bytes: Optional[int] = None,
           cost: Optional[str] = None, policy: Optional[str] = None,
           prefetch: Optional[int] = None, host_pool: Optional[int] = None,
           spill: Optional[bool] = None) -> Registry:
    """Turns eviction on for the calling thread until :func:`disable`
    (``install(policy=...)`` calls this). Arguments left None come from the engine's
    options (``min_evictable``, ``remat_cost``, ``policy``, ``prefetch``, ``host_pool``,
    ``spill``)."""
    global _active
    if _current is not None:
        raise RuntimeError("pyalloc: eviction is already on (install(policy=...) or "
                           "pyalloc.registry.enable() was called before)")
    if engine is None:
        engine = state.engine(None)
    _active = _start(engine, **_settings(engine, min_bytes=min_bytes, cost=cost, policy=policy,
                                         prefetch=prefetch, host_pool=host_pool, spill=spill))
    return _active


def disable() -> None:
    """Turns process-wide eviction off, restoring every evicted tensor still held."""
    global _active
    if _active is not None:
        registry, _active = _active, None
        _stop(registry)


@contextlib.contextmanager
def recompute(engine: Optional[Engine] = None, min_bytes: Optional[int] = None,
              cost: Optional[str] = None, policy: Optional[str] = None,
              prefetch: Optional[int] = None, host_pool: Optional[int] = None,
              spill: Optional[bool] = None) -> Iterator[Registry]:
    """Within the block, activations may be evicted, and recomputed or swapped back on use.

    Run the forward *and* ``backward()`` inside it; on leaving, every evicted tensor the
    program still holds is restored. ``engine``: the installed engine of the current
    device by default. ``policy``: "recompute", "swap" or "hybrid". Arguments left None
    come from the engine's options (``min_evictable``, ``remat_cost``, ``policy`` when it
    is one of those three, else "recompute", ``prefetch``, ``host_pool``, ``spill``). Inside
    ``install(policy=...)`` or another ``recompute()`` block it yields the running registry.
    """
    if _current is not None:
        yield _current
        return
    if engine is None:
        engine = state.engine(None)
    registry = _start(engine, **_settings(engine, min_bytes=min_bytes, cost=cost, policy=policy,
                                          prefetch=prefetch, host_pool=host_pool, spill=spill))
    try:
        yield registry
    finally:
        _stop(registry)
