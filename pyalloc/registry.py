"""The tensor registry: lineage of activations, eviction through the engine, recompute on use.

How it fits together (docs/design.md, "Rematerialization"):

* A :class:`Registry` is a dispatch mode. Every aten op of the forward pass that produces a
  new storage from a tensor requiring grad is recorded: the op, its arguments (registered
  storages by reference, anything else as is), the generator state if the op is random,
  and a cost. The storage becomes a :class:`_Node`, marked evictable in the engine.
* In-place ops extend the lineage: a storage's contents are a *chain*, its creation
  followed by the mutations applied to it (dropout arrives as ``empty_like`` →
  ``bernoulli_`` → ``div_``). Before a storage is mutated, every recorded op that read its
  old contents is restored if evicted and then frozen: its lineage no longer holds.
* When an allocation does not fit, the engine chooses victims (evictor.cpp: ``dtr``,
  ``dte`` or ``window``) and calls :meth:`Registry.evict` outside its lock; the storage
  is freed with ``untyped_storage().resize_(0)`` and every tensor and view of it stays
  valid. Any op that reads an evicted storage (forward, or backward reading a saved
  activation) restores it first: inputs restored recursively, the chain replayed, the
  result copied in at storage level, which leaves autograd's version counters alone.
* A storage that only the registry still holds (the program dropped every tensor of it
  but recorded ops still name it as an input) is evicted at once: DTR's "eager eviction".
  Found by the storage's reference count, in a sweep every few hundred ops and whenever
  the engine asks for memory.
* Never evicted: parameters, buffers, inputs and gradients (no recorded op produces them),
  storages below ``min_bytes``, outputs of ops that are not deterministic (unless
  ``torch.use_deterministic_algorithms(True)``), storages written by an op the lineage
  cannot replay. A storage is pinned while an op or a replay uses it.

Swapping (``policy="swap"`` or ``"hybrid"``; docs/design.md, "Swap"):

* An evicted storage may instead be copied to the engine's host pool on a side stream
  (allocator/src/swap.h) before it is freed; the engine reuses the device block only once
  the copy is done. It comes back by a copy on another side stream. A storage with no
  lineage left (frozen) can still be swapped: its bytes are copied, not recomputed.
* After a swap-in the host copy stays valid until the storage is written, so evicting it
  again costs no copy.
* ``hybrid`` swaps a storage when both copies fit in the time between its last forward use
  and its first backward use, as measured in the previous iteration, and recomputes it
  otherwise (Capuchin). With no history yet, it swaps.
* Prefetch: backward uses saved activations in about the reverse order of forward. The
  order of the previous iteration is kept, and each unpack starts the swap-in of the next
  few (option ``prefetch``), never evicting for them; the use waits for the copy only then.
* If the host pool is full, a storage with lineage is recomputed instead; a failed copy
  leaves the device block (swap-out) or the host copy (swap-in) as it was.

Two ways in: ``pyalloc.install(policy=...)`` (for the whole process, on the thread that
calls it) or ``with pyalloc.recompute(policy=...):`` around the steps that need it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import _lib
from .engine import Engine
from .errors import HostPoolFullError, PyallocError, SwapCopyError

aten = torch.ops.aten
log = logging.getLogger("pyalloc")

POLICIES = ("recompute", "swap", "hybrid")

_storage_use_count = torch._C._storage_Use_Count

# Ops whose schema does not say that they write some arguments (PyTorch's batch norms
# update the running statistics in place). Replaying them must not write those again.
_UNDECLARED_WRITES: Dict[Any, Tuple[int, ...]] = {}
for _name in ("native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm",
              "miopen_batch_norm"):
    _packet = getattr(aten, _name, None)
    if _packet is not None and hasattr(_packet, "default"):
        _UNDECLARED_WRITES[_packet.default] = (3, 4)

# A chain longer than this is frozen: the replay would cost more than it saves.
_MAX_CHAIN = 8
# Under recompute with relocation, moving a storage out costs this many times its bytes'
# worth, so that the engine's strategies take anything recomputable first.
_RELOCATE_PENALTY = 64.0
# Arithmetic intensity used to weigh FLOPs against bytes in the "model" cost.
_FLOPS_PER_BYTE = 64.0


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


# Aten ops take and return flat structures: scalars, tensors, and lists or tuples of them.
# These two walk exactly that, several times faster than torch's general pytree, which
# matters because they run on every op.
_SEQ = (list, tuple)


def _leaves(value: Any) -> List[Any]:
    """The leaves of an op's arguments ``(args, kwargs)`` or of its output."""
    out: List[Any] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, _SEQ):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        else:
            out.append(v)
    return out


def _tensors(args: Any, kwargs: Dict[str, Any]) -> List[torch.Tensor]:
    """The tensors among an op's arguments (the per-op fast path of :func:`_leaves`)."""
    out: List[torch.Tensor] = []
    for group in (args, kwargs.values()) if kwargs else (args,):
        for a in group:
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif isinstance(a, _SEQ):
                out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _map(cls: type, fn: Callable[[Any], Any], value: Any) -> Any:
    """``value`` with every leaf of type ``cls`` replaced by ``fn(leaf)``."""
    if isinstance(value, cls):
        return fn(value)
    if isinstance(value, _SEQ):
        return type(value)(_map(cls, fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _map(cls, fn, v) for k, v in value.items()}
    return value


class _Ref:
    """An argument that was a registered storage: rebuilt from the node at replay."""

    __slots__ = ("node", "version", "offset", "size", "stride", "dtype")

    def __init__(self, node: "_Node", t: torch.Tensor) -> None:
        self.node = node
        self.version = node.version
        self.offset = t.storage_offset()
        self.size = tuple(t.shape)
        self.stride = t.stride()
        self.dtype = t.dtype

    def tensor(self) -> torch.Tensor:
        out = torch.empty(0, dtype=self.dtype, device=self.node.device)
        return out.set_(self.node.storage, self.offset, self.size, self.stride)


def _refers_to(value: Any, node: Optional[_Node]) -> bool:
    return node is not None and any(isinstance(x, _Ref) and x.node is node
                                    for x in _leaves(value))


class _Step:
    """One op of a storage's chain: ``func(*args, **kwargs)``, with RNG state if random."""

    __slots__ = ("func", "args", "kwargs", "index", "rng", "generator", "cost")

    def __init__(self, func: Any, args: Any, kwargs: Any, index: int, rng: Any,
                 generator: Any, cost: float) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.index = index          # creation steps: which flattened output is the storage
        self.rng = rng              # generator state before the op, for random ops
        self.generator = generator
        self.cost = cost


class _Node:
    """A registered storage: its lineage, whether it is resident, and its pins."""

    __slots__ = ("handle", "storage", "key", "nbytes", "device", "steps", "cost", "version",
                 "readers", "aliases", "evicted", "frozen", "fixed", "pins", "marked",
                 "slot", "clean", "arriving", "prefetched", "ordinal", "last_use_ns",
                 "waited_ns", "bwd_seen", "__weakref__")

    def __init__(self, handle: int, t: torch.Tensor, steps: List[_Step], cost: float) -> None:
        self.handle = handle
        self.storage = t.untyped_storage()   # the registry's one reference to it
        self.key = self.storage._cdata
        self.nbytes = self.storage.nbytes()
        self.device = t.device
        self.steps: Optional[List[_Step]] = steps   # None once frozen
        self.cost = cost
        self.version = 0            # mutations seen
        self.readers: List[weakref.ref] = []   # nodes recorded from the current contents
        self.aliases: List[weakref.ref] = []   # tensors seen on it; their deaths are news
        self.evicted = False
        self.frozen = False         # lineage invalid: never recomputed again
        self.fixed = False          # cannot be freed at all (not resizable)
        self.pins = 0               # ops and replays using it now
        self.marked = False         # evictable in the engine right now
        # Swapping (policy swap/hybrid).
        self.slot = 0               # the engine's host slot holding a copy, or 0
        self.clean = False          # that copy equals the contents (no write since)
        self.arriving = False       # resident, but the swap-in may still be in flight
        self.prefetched = False     # brought back ahead of use, not used yet
        self.ordinal = -1           # creation index within the iteration (forward only)
        self.last_use_ns = 0        # host clock of its last forward use (hybrid)
        self.waited_ns = 0          # _stalled_ns() at that use
        self.bwd_seen = False       # backward has used it this iteration


def _flops(func: Any, args: Any, outputs: List[torch.Tensor]) -> float:
    """Multiply-adds of the compute-bound ops (x2), from shapes; 0 for the rest."""
    packet = getattr(func, "overloadpacket", None)
    if not outputs:
        return 0.0
    out = outputs[0]
    if packet in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm):
        a = args[-2] if packet in (aten.addmm, aten.baddbmm) else args[0]
        return 2.0 * out.numel() * a.shape[-1]
    if packet in (aten.convolution, aten._convolution, aten.cudnn_convolution):
        w = args[1]
        return 2.0 * out.numel() * (w.numel() // max(1, w.shape[0]))
    return 0.0


class Registry(TorchDispatchMode):
    """Records lineage and serves the engine's eviction requests; see the module doc.

    Not for code under ``torch.compile``: the registry sees eager aten ops only.

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
        How an evicted storage comes back (see the module doc). ``swap`` and ``hybrid``
        need the engine's host pool (:meth:`Engine.set_host_pool`; :func:`enable` sets it).
    prefetch : int
        swap/hybrid: how many swapped-out storages each backward use brings back ahead.
    relocate : bool
        recompute: storages that cannot be recomputed (frozen) may still be moved out of the
        way through the host pool as a last resort, to make room for a request that no
        amount of recomputation can serve (compaction through host memory). They come back,
        wherever best fit then puts them, on their next use. Needs the host pool.
    """

    def __init__(self, engine: Engine, min_bytes: int = 64 << 10, cost: str = "model",
                 policy: str = "recompute", prefetch: int = 4, relocate: bool = False) -> None:
        super().__init__()
        if cost not in ("model", "time", "bytes"):
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
        self.can_swap = policy != "recompute"
        # Storages without lineage can leave the device: swapped (swap/hybrid), or only as
        # a last resort (recompute with relocate).
        self.can_relocate = self.can_swap or relocate
        self.prefetch_depth = prefetch if self.can_swap else 0
        self.copy_bw = 0.0          # bytes/s of one swap copy (calibrate_copies)
        # What the previous iteration did, by creation ordinal (swap/hybrid): the order
        # backward first used each storage (for prefetch), and the time from its last
        # forward use to that first backward use (for hybrid's choice).
        self._ordinal = 0
        self._by_ordinal: Dict[int, _Node] = {}
        self._in_backward = False
        self._order_cur: List[int] = []
        self._order_prev: List[int] = []
        self._pos_prev: Dict[int, int] = {}
        self._gaps_cur: Dict[Tuple[int, int], int] = {}
        self._gaps_prev: Dict[Tuple[int, int], int] = {}
        self._track_times = policy == "hybrid"
        self.nodes: Dict[int, _Node] = {}      # handle -> node, in creation order
        self.by_key: Dict[int, _Node] = {}     # StorageImpl address -> node
        # Storages that are not nodes but were read by recorded ops: the readers to
        # invalidate when one of them is written (parameters, by the optimizer).
        self.leaf_readers: Dict[int, List[weakref.ref]] = {}
        self._next_handle = 1
        self._ops = 0
        self._next_sweep = 256
        self._write_args: Dict[Any, Tuple[Tuple[int, str], ...]] = {}
        self._func_info: Dict[Any, Tuple[Any, bool, bool]] = {}
        self._device_type = "cuda" if _installed_device() == "cuda" else "cpu"
        self._evict_sweep_at = -1
        self._dying: List[int] = []    # handles whose tensors died since the last op
        # Counters (stats()).
        self.evictions = 0          # by the engine's request
        self.eager_evictions = 0    # storages only the registry still held
        self.recomputes = 0
        self.recompute_ns = 0
        self.frozen = 0
        self.relocations = 0        # storages moved device to device (compaction)
        self.swap_outs = 0          # copies to the host pool
        self.swap_out_bytes = 0
        self.swap_ins = 0           # copies back (on use or prefetched)
        self.swap_in_bytes = 0
        self.swap_wait_ns = 0       # host time spent waiting for swap-ins
        self.swap_fallbacks = 0     # host pool full: dropped for recompute instead
        self.swap_failures = 0      # copies the device refused to start
        self.prefetches = 0         # swap-ins started ahead of use
        self.prefetch_hits = 0      # ... used before being evicted again
        self.prefetch_ready = 0     # ... whose copy had finished by the use
        self.chose_swap = 0         # hybrid: evictions routed to swap
        self.chose_recompute = 0    # ... and to recompute

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch wraps a mode's __torch_dispatch__ in torch._disable_dynamo unless this says
        # no; the wrapper cost 22 us per op on the dev VM (a pass-through mode: 38 -> 14 us),
        # more than everything the registry does. Eager only (see the class doc).
        return False

    # --- statistics -----------------------------------------------------------------------
    def stats(self) -> Dict[str, int]:
        resident = sum(1 for n in self.nodes.values() if not n.evicted)
        out = {
            "evictions": self.evictions,
            "eager_evictions": self.eager_evictions,
            "recomputes": self.recomputes,
            "recompute_ns": self.recompute_ns,
            "frozen": self.frozen,
            "relocations": self.relocations,
            "nodes": len(self.nodes),
            "resident_nodes": resident,
            "evicted_bytes": sum(n.nbytes for n in self.nodes.values() if n.evicted),
        }
        if self.can_relocate:
            out.update({
                "swap_outs": self.swap_outs,
                "swap_out_bytes": self.swap_out_bytes,
                "swap_ins": self.swap_ins,
                "swap_in_bytes": self.swap_in_bytes,
                "swap_wait_ns": self.swap_wait_ns,
                "swap_fallbacks": self.swap_fallbacks,
                "swap_failures": self.swap_failures,
                "prefetches": self.prefetches,
                "prefetch_hits": self.prefetch_hits,
                "prefetch_ready": self.prefetch_ready,
                "chose_swap": self.chose_swap,
                "chose_recompute": self.chose_recompute,
                "swapped_bytes": sum(n.nbytes for n in self.nodes.values()
                                     if n.evicted and n.clean),
            })
        return out

    # --- the engine's side ----------------------------------------------------------------
    def evict(self, handles: List[int]) -> int:
        """Frees the storages behind ``handles`` (the engine's choice); returns how many."""
        done = 0
        for h in handles:
            node = self.nodes.get(h)
            if node is None:
                continue
            if self._evict(node):
                done += 1
            else:
                node.marked = False   # the engine dropped it from its set; offered again later
        self.evictions += done
        if self._evict_sweep_at != self._ops:   # memory is short: unused storages go too
            self._evict_sweep_at = self._ops
            self._sweep(drop=False)
        return done

    def _route(self, node: _Node, eager: bool = False) -> Optional[str]:
        """How ``node`` would be evicted: "free" (its host copy is clean), "swap", "drop"
        (recompute later), or None (it cannot be)."""
        if node.clean:
            return "free"
        if node.steps is None:
            return "swap" if self.can_relocate else None
        if self.policy == "recompute" or eager:   # eager: a copy would likely be wasted
            return "drop"
        if self.policy == "swap":
            return "swap"
        gap = self._gaps_prev.get((node.ordinal, node.nbytes))   # hybrid
        if gap is None or 2 * node.nbytes * 1e9 <= gap * self.copy_bw:
            self.chose_swap += 1
            return "swap"
        self.chose_recompute += 1
        return "drop"

    def _evict(self, node: _Node, eager: bool = False) -> bool:
        if node.evicted or node.pins or node.fixed:
            return False
        route = self._route(node, eager)
        if route is None:
            return False
        if route == "swap" and not self._swap_out(node):
            if node.steps is None:
                return False
            route = "drop"
        try:
            node.storage.resize_(0)   # frees through the engine; tensors and views stay valid
        except RuntimeError:          # not resizable (e.g. external memory): keep it
            self._drop_copy(node)
            node.fixed = True
            self._freeze(node)
            return False
        node.evicted = True
        node.arriving = node.prefetched = False
        node.marked = False
        return True

    def _eviction_cost(self, node: _Node) -> float:
        """What evicting ``node`` costs later, in the cost model's unit: its recompute, or
        moving its bytes (out and back in, or only back in when the host copy is clean)."""
        if not self.can_relocate or (not self.can_swap and node.steps is not None):
            return node.cost
        moved = float(node.nbytes if node.clean else 2 * node.nbytes)
        if self.cost_model == "time":
            moved = moved / max(self.copy_bw, 1.0) * 1e9
        if not self.can_swap:   # recompute with relocate: chosen after anything recomputable
            return moved * _RELOCATE_PENALTY
        if node.steps is None or self.policy == "swap":
            return moved
        return min(moved, node.cost)

    def _mark(self, node: _Node) -> None:
        """Offers ``node`` to the engine as evictable if it can be (also a 'use')."""
        if node.pins or node.evicted or node.fixed or (node.steps is None and not self.can_relocate):
            return
        ptr = node.storage.data_ptr()
        if ptr:
            self.engine.set_evictable(ptr, node.handle, self._eviction_cost(node))
            node.marked = True

    def _unmark(self, node: _Node) -> None:
        if node.marked:
            node.marked = False
            ptr = node.storage.data_ptr()
            if ptr:
                self.engine.set_evictable(ptr, 0, 0.0)

    # Pinning leaves the engine's mark in place: an op's inputs are pinned and unpinned on
    # every op, and telling the engine each time was a ctypes call per input per op. A
    # pinned node the engine chooses anyway is refused (_evict) and leaves its set; unpinning
    # marks it again. Unpinning a node still marked is a use: touch, for staleness.
    def _pin(self, node: _Node) -> None:
        node.pins += 1

    def _unpin(self, node: _Node) -> None:
        node.pins -= 1
        if node.pins == 0:
            if node.marked:
                ptr = node.storage.data_ptr()
                if ptr:
                    self.engine.touch(ptr)
            else:
                self._mark(node)

    def _freeze(self, node: _Node) -> None:
        if not node.frozen:
            self._unmark(node)
            node.frozen = True
            node.steps = None   # releases its inputs
            self.frozen += 1
            self._mark(node)    # it can still be swapped

    # --- compaction (Note [Relocation] in allocator/src/engine.h) ----------------------------
    @staticmethod
    def _movable(node: _Node) -> bool:
        """Whether ``node``'s bytes may be moved now: resident, no op or copy using them."""
        return not (node.evicted or node.pins or node.fixed or node.arriving) and node.nbytes > 0

    def movable(self) -> List[int]:
        """The engine's compaction asks: the addresses of the storages that can move now."""
        return [ptr for ptr in (n.storage.data_ptr() for n in list(self.nodes.values())
                                if self._movable(n)) if ptr]

    def relocate(self, moves: List[Tuple[int, int]]) -> int:
        """Moves the storage at each ``from`` into the block the engine reserved at ``to``:
        a new tensor allocated there, the bytes copied (on the current stream), the two
        storages' memory swapped, the new tensor dropped (which frees the old block). The
        storage object stays, so every tensor and view of it follows, with the same bytes.
        Returns how many moved; the engine frees the destinations of the rest."""
        from . import _torch_shim

        shim = _torch_shim.load()
        wanted = dict(moves)
        at: Dict[int, _Node] = {}
        for node in list(self.nodes.values()):
            if self._movable(node):
                ptr = node.storage.data_ptr()
                if ptr in wanted:
                    at[ptr] = node
        moved = 0
        with _disable_current_modes():   # the copy is the registry's own, not recorded
            for source, destination in moves:
                node = at.get(source)
                if node is None:
                    continue
                try:
                    with self.engine.placement(destination):
                        fresh = torch.empty(node.nbytes, dtype=torch.uint8, device=node.device)
                except (RuntimeError, torch.OutOfMemoryError):
                    log.warning("pyalloc: compaction could not take its destination %#x", destination)
                    continue
                if fresh.data_ptr() != destination:   # not ours: leave the storage where it is
                    del fresh
                    continue
                target = fresh.untyped_storage()
                target.copy_(node.storage)
                if shim.pyalloc_shim_swap_storage_data(node.storage._cdata, target._cdata) != 0:
                    continue   # nothing changed; the destination goes back with `fresh`
                del target, fresh   # frees the old block
                moved += 1
                if node.marked:     # its evictable mark was on the old block
                    node.marked = False
                    self._mark(node)
        self.relocations += moved
        return moved

    # --- swapping -------------------------------------------------------------------------
    def _stream(self) -> int:
        """The compute stream the copies order against (the simulated device's is 0)."""
        if self._device_type == "cuda":
            return torch.cuda.current_stream().cuda_stream
        return 0

    def _swap_out(self, node: _Node) -> bool:
        """Starts copying ``node`` to the host pool; False if it cannot be (pool full, or a
        copy the device refused), with nothing changed."""
        for attempt in range(2):
            try:
                node.slot = self.engine.swap_out(node.storage.data_ptr(), node.nbytes,
                                                 self._stream())
                break
            except HostPoolFullError:
                if attempt == 0 and self._shed_copies(node.nbytes):
                    continue   # clean copies of resident storages made room
                self.swap_fallbacks += 1
                return False
            except SwapCopyError as e:
                self.swap_failures += 1
                log.warning("pyalloc: %s; the tensor stays on the device", e)
                return False
        node.clean = True
        self.swap_outs += 1
        self.swap_out_bytes += node.nbytes
        return True

    def _swap_in(self, node: _Node, wait: bool, allocated: bool = False) -> None:
        """Brings ``node`` back from its host copy (the caller pinned it or owns it); with
        ``wait``, the compute stream waits for the copy now, else at the first use.
        ``allocated``: the caller already gave the storage its memory."""
        if not allocated:
            node.storage.resize_(node.nbytes)
        try:
            self.engine.swap_in(node.slot, node.storage.data_ptr(), self._stream())
        except SwapCopyError:
            node.storage.resize_(0)   # still evicted; the host copy is intact
            self.swap_failures += 1
            raise
        node.evicted = False
        self.swap_ins += 1
        self.swap_in_bytes += node.nbytes
        node.arriving = True
        if wait:
            self._arrive(node)

    def _arrive(self, node: _Node) -> None:
        """The compute stream waits for ``node``'s swap-in (on the simulated device, the
        host does)."""
        if node.prefetched:
            node.prefetched = False
            self.prefetch_hits += 1
            if self.engine.swap_ready(node.slot):
                self.prefetch_ready += 1
        start = time.perf_counter_ns()
        self.engine.swap_wait(node.slot, self._stream())
        self.swap_wait_ns += time.perf_counter_ns() - start
        node.arriving = False

    def _drop_copy(self, node: _Node) -> None:
        """Releases ``node``'s host copy (its contents are about to change, or it is
        forgotten). Never for an evicted node that is still needed: that copy is its data."""
        if node.slot:
            self.engine.swap_release(node.slot)
            node.slot = 0
            node.clean = False

    def _shed_copies(self, needed: int) -> bool:
        """Releases clean host copies of resident storages (they only save a copy) until
        ``needed`` bytes are freed; True if any was released."""
        freed = 0
        for node in self.nodes.values():
            if node.slot and not node.evicted and not node.arriving:
                freed += node.nbytes
                self._drop_copy(node)
                self._mark(node)   # its cost went up (set_evictable overwrites the old one)
                if freed >= needed:
                    break
        return freed > 0

    def _prefetch_after(self, node: _Node) -> None:
        """Starts bringing back the storages backward is expected to use after ``node``:
        the previous iteration's order, else reverse creation order. Stops at the first one
        that does not fit without evicting."""
        if node.ordinal < 0:
            return
        pos = self._pos_prev.get(node.ordinal)
        if pos is not None:
            ahead = self._order_prev[pos + 1:pos + 1 + self.prefetch_depth]
        else:
            ahead = range(node.ordinal - 1, max(-1, node.ordinal - 1 - self.prefetch_depth), -1)
        lib = _lib.lib()
        for ordinal in ahead:
            other = self._by_ordinal.get(ordinal)
            if other is None or not other.evicted or not other.clean or other.pins:
                continue
            # Room for it and as much again: backward's next allocations (the gradient of
            # what was just unpacked, about its size) must not have to evict it again.
            if self.engine.unallocated() < other.nbytes + node.nbytes:
                return
            lib.pyalloc_set_thread_may_evict(0)
            try:
                other.storage.resize_(other.nbytes)   # fails rather than evict
            except RuntimeError:   # torch.OutOfMemoryError too: no room without evicting
                return
            finally:
                lib.pyalloc_set_thread_may_evict(1)
            try:
                self._swap_in(other, wait=False, allocated=True)
            except SwapCopyError:
                return
            other.prefetched = True
            self.prefetches += 1
            self._mark(other)   # resident and clean: cheap to evict again if needed

    def _backward_use(self, node: _Node) -> None:
        """Backward unpacked ``node``: learn the order and (hybrid) the forward-to-backward
        gap, for the next iteration."""
        if not self._in_backward:
            try:   # the end of this backward ends the iteration
                torch.autograd.Variable._execution_engine.queue_callback(self._end_iteration)
                self._in_backward = True
            except RuntimeError:
                return   # unpacked outside a backward pass: nothing to learn
        if not node.bwd_seen and node.ordinal >= 0:
            node.bwd_seen = True
            self._order_cur.append(node.ordinal)
            if node.last_use_ns:   # compute time only: waits for copies would hide nothing
                self._gaps_cur[(node.ordinal, node.nbytes)] = (
                    time.perf_counter_ns() - node.last_use_ns
                    - (self._stalled_ns() - node.waited_ns))

    def _stalled_ns(self) -> int:
        """Host time spent waiting for copies so far (the engine's blocked time covers the
        waits of swap_wait too); the rest of the wall clock is compute."""
        return self.engine.blocked_ns()

    def _end_iteration(self) -> None:
        self._in_backward = False
        if self._order_cur:
            self._order_prev, self._order_cur = self._order_cur, []
            self._pos_prev = {o: i for i, o in enumerate(self._order_prev)}
            self._gaps_prev, self._gaps_cur = self._gaps_cur, {}
        self._ordinal = 0
        self._by_ordinal = {}

    def calibrate_copies(self, nbytes: int = 8 << 20) -> float:
        """Measures one swap copy's bandwidth (bytes/s) on this device: the hybrid policy
        compares copy time with compute time."""
        nbytes = max(4096, min(nbytes, int(self.engine.stats()["host_pool_bytes"]) // 2))
        device = torch.device("cuda", torch.cuda.current_device()) \
            if self._device_type == "cuda" else torch.device("cpu")
        with _disable_current_modes():
            buf = torch.ones(nbytes, dtype=torch.uint8, device=device)
            stream = self._stream()
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
        return self.copy_bw

    # --- restoring ------------------------------------------------------------------------
    def _pin_all(self, nodes: List[_Node]) -> None:
        """Pins ``nodes`` with every one of them resident, so nothing the caller needs is
        evicted while it runs.

        Evicted ones are restored *before* the resident ones are pinned: pinning first
        would hold every resident input along a recursive recompute (each level's dropout
        mask, say) at once, which is exactly the memory that is short. A restore may evict
        a node restored just before, so this repeats; after a few rounds it pins first.
        """
        for _ in range(3):
            for node in nodes:
                if node.evicted:
                    self._restore_now(node)
            if not any(node.evicted for node in nodes):
                for node in nodes:
                    if node.arriving:
                        self._arrive(node)
                    self._pin(node)
                return
        pinned: List[_Node] = []
        try:
            for node in nodes:
                if not node.evicted:
                    self._pin(node)
                    pinned.append(node)
            for node in nodes:
                if node.evicted:
                    self._pin(node)
                    pinned.append(node)
                    self._restore(node)
            for node in nodes:
                if node.arriving:
                    self._arrive(node)
        except BaseException:
            self._unpin_all(pinned)
            raise

    def _unpin_all(self, nodes: List[_Node]) -> None:
        for node in nodes:
            self._unpin(node)

    def _materialize(self, tree: Any, target: Optional[_Node]) -> Tuple[Any, List[_Node]]:
        """``tree`` with every :class:`_Ref` rebuilt as a tensor on its (restored) storage;
        returns the pinned nodes. ``target`` is the storage a mutation step writes."""
        refs = [x for x in _leaves(tree) if isinstance(x, _Ref)]
        nodes: List[_Node] = []
        for ref in refs:
            if ref.node is not target:
                if ref.node.version != ref.version:   # _invalidate_readers prevents this
                    raise RuntimeError(
                        f"pyalloc: cannot recompute a tensor: its input was modified in place "
                        f"after it was recorded (version {ref.node.version}, recorded "
                        f"{ref.version}). This is a registry bug; please report it.")
                if ref.node not in nodes:
                    nodes.append(ref.node)
        self._pin_all(nodes)
        tree = _map(_Ref, _Ref.tensor, tree)
        return tree, nodes

    def _run_step(self, step: _Step, target: Optional[_Node]) -> Any:
        args, kwargs = step.args, step.kwargs
        written = [(i, name) for i, name in self._write_spec(step.func)
                   if not _refers_to(args[i] if i < len(args) else kwargs.get(name), target)]
        (args, kwargs), pinned = self._materialize((args, kwargs), target)
        try:
            if written:   # write only the storage being rebuilt, never (say) running stats
                args, kwargs = list(args), dict(kwargs)
                for i, name in written:
                    if i < len(args):
                        args[i] = _map(torch.Tensor, torch.clone, args[i])
                    elif name in kwargs:
                        kwargs[name] = _map(torch.Tensor, torch.clone, kwargs[name])
            if step.rng is None:
                return step.func(*args, **kwargs)
            saved = step.generator.get_state()
            step.generator.set_state(step.rng)
            try:
                return step.func(*args, **kwargs)
            finally:
                step.generator.set_state(saved)
        finally:
            self._unpin_all(pinned)

    def _restore(self, node: _Node) -> None:
        """Brings an evicted storage back from its host copy, or by replaying its chain
        (the caller pinned it)."""
        if node.clean:
            try:
                self._swap_in(node, wait=True)
                return
            except SwapCopyError as e:
                if node.steps is None:
                    raise SwapCopyError(
                        f"pyalloc: cannot bring back a swapped-out tensor ({node.nbytes} bytes) "
                        f"and it has no lineage to recompute it from: {e}") from e
                log.warning("pyalloc: %s; recomputing the tensor instead", e)
        if node.steps is None:
            raise RuntimeError("pyalloc: an evicted tensor has no lineage left to recompute it "
                               "from. This is a registry bug; please report it.")
        start = time.perf_counter_ns()
        first = node.steps[0]
        out = self._run_step(first, None)
        fresh = _leaves(out)[first.index]
        if fresh.untyped_storage().nbytes() != node.nbytes:
            raise RuntimeError(f"pyalloc: recomputing {first.func} gave "
                               f"{fresh.untyped_storage().nbytes()} bytes, expected {node.nbytes}")
        try:
            node.storage.resize_(node.nbytes)
            node.storage.copy_(fresh.untyped_storage())   # storage level: no version bump
            del out, fresh
            node.evicted = False
            for step in node.steps[1:]:   # the in-place part of the chain, on the storage itself
                self._run_step(step, node)
        except BaseException:
            node.storage.resize_(0)   # half restored is not restored
            node.evicted = True
            raise
        self.recomputes += 1
        self.recompute_ns += time.perf_counter_ns() - start

    def _restore_now(self, node: _Node) -> None:
        """Restores an evicted node for whoever needs it next (pinned only meanwhile)."""
        self._pin(node)
        try:
            self._restore(node)
        finally:
            self._unpin(node)

    def ensure(self, t: torch.Tensor) -> torch.Tensor:
        """Makes ``t``'s storage resident (restoring it if evicted); returns ``t``."""
        node = self.by_key.get(_key(t))
        if node is not None:
            if node.evicted:
                with _disable_current_modes():
                    self._restore_now(node)
            if node.arriving:
                self._arrive(node)
        return t

    # --- bookkeeping ------------------------------------------------------------------------
    def _sweep(self, drop: bool = True) -> None:
        """Evicts storages only the registry still holds; with ``drop``, forgets those no
        recorded op needs any more (freeing them if resident)."""
        for node in reversed(list(self.nodes.values())):   # readers before their inputs
            if _storage_use_count(node.key) > 1:
                continue                  # the program (or autograd) still holds it
            if drop and not self._has_readers(node):
                self._forget(node)
            elif not node.evicted and self._evict(node, eager=True):
                self.eager_evictions += 1
        if drop:
            for key in [k for k, rs in self.leaf_readers.items()
                        if not any(r() is not None for r in rs)]:
                del self.leaf_readers[key]
            self._next_sweep = self._ops + max(256, 2 * len(self.nodes))

    def _watch(self, node: _Node, t: torch.Tensor) -> None:
        """Learn when ``t`` dies: it may have been the last tensor on ``node``'s storage."""
        dying, handle = self._dying, node.handle
        node.aliases = [r for r in node.aliases if r() is not None]
        node.aliases.append(weakref.ref(t, lambda _r: dying.append(handle)))

    def _bury(self) -> None:
        """A tensor died: storages nobody else holds are evicted (recorded ops still read
        them) or forgotten (nothing does; forgetting one may free its inputs in turn)."""
        while self._dying:
            handles, self._dying[:] = list(self._dying), []
            for h in handles:
                node = self.nodes.get(h)
                if node is None or node.pins or _storage_use_count(node.key) > 1:
                    continue
                if not self._has_readers(node):
                    self._forget(node, freed=True)
                elif not node.evicted and self._evict(node, eager=True):
                    self.eager_evictions += 1

    @staticmethod
    def _has_readers(node: _Node) -> bool:
        """Whether a recorded op that may still be replayed reads ``node`` (a frozen or
        forgotten reader has dropped its lineage, so it never will)."""
        for ref in node.readers:
            reader = ref()
            if reader is not None and reader.steps is not None:
                return True
        return False

    def _forget(self, node: _Node, freed: bool = False) -> None:
        """Drops ``node``. ``freed``: only the registry holds its storage, which is freed
        with it, taking the engine's mark along — no need to clear the mark first (a
        ctypes call for every activation). Should something still hold the node, the
        engine may offer the stale handle once; evict() skips unknown handles."""
        if freed:
            node.marked = False
        else:
            self._unmark(node)
        self._drop_copy(node)
        if node.ordinal >= 0 and self._by_ordinal.get(node.ordinal) is node:
            del self._by_ordinal[node.ordinal]
        del self.nodes[node.handle]
        if self.by_key.get(node.key) is node:
            del self.by_key[node.key]
        if node.steps:   # its inputs lose a reader: look at them again
            for ref in _leaves([(s.args, s.kwargs) for s in node.steps]):
                if isinstance(ref, _Ref) and ref.node is not node:
                    self._dying.append(ref.node.handle)
        node.steps = None

    def _invalidate_readers(self, key: int) -> None:
        """The storage ``key`` is about to be written: whatever was recorded from its
        current contents is restored now (while it still can be) and frozen."""
        node = self.by_key.get(key)
        readers = node.readers if node is not None else self.leaf_readers.pop(key, None)
        if not readers:
            return
        for ref in readers:
            reader = ref()
            if reader is None or reader.frozen or self.nodes.get(reader.handle) is not reader:
                continue
            if _storage_use_count(reader.key) == 1 and not self._has_readers(reader):
                self._forget(reader)   # nothing uses it: no need to keep it recomputable
                continue
            if reader.evicted:
                self._restore_now(reader)
            self._freeze(reader)
        if node is not None:
            node.readers = []

    def _write_spec(self, func: Any) -> Tuple[Tuple[int, str], ...]:
        """(position, name) of every argument ``func`` writes."""
        spec = self._write_args.get(func)
        if spec is None:
            spec = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                         if a.alias_info is not None and a.alias_info.is_write)
            spec += tuple((i, "") for i in _UNDECLARED_WRITES.get(func, ()))
            self._write_args[func] = spec
        return spec

    def _written(self, func: Any, args: Any, kwargs: Dict[str, Any]) -> List[torch.Tensor]:
        out: List[torch.Tensor] = []
        for i, name in self._write_spec(func):
            value = args[i] if i < len(args) else kwargs.get(name)
            for leaf in _leaves(value):
                if isinstance(leaf, torch.Tensor):
                    out.append(leaf)
        return out

    def _generator(self, kwargs: Dict[str, Any], tensors: List[torch.Tensor]) -> Any:
        gen = kwargs.get("generator")
        if gen is not None:
            return gen
        device = tensors[0].device if tensors else torch.device(
            kwargs.get("device") or "cpu")
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            return torch.cuda.default_generators[index]
        return torch.default_generator

    def _cost(self, func: Any, args: Any, tensors: List[torch.Tensor],
              outputs: List[torch.Tensor], elapsed_ns: int) -> float:
        if self.cost_model == "time":
            return float(max(elapsed_ns, 1))
        out_bytes = sum(o.untyped_storage().nbytes() for o in outputs)
        if self.cost_model == "bytes":
            return float(max(out_bytes, 1))
        in_bytes = sum(t.numel() * t.element_size() for t in tensors)
        return float(max(in_bytes + out_bytes, 1)) + _flops(func, args, outputs) / _FLOPS_PER_BYTE

    # --- the dispatch mode ------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Runs on every aten op, forward and backward: keep the common path short.
        kwargs = kwargs or {}
        self._ops += 1
        if self._dying:
            self._bury()
        if self._ops >= self._next_sweep:
            self._sweep()
        info = self._func_info.get(func)
        if info is None:
            info = self._func_info[func] = (
                self._write_spec(func), torch.Tag.nondeterministic_seeded in func.tags,
                torch.Tag.nondeterministic_bitwise in func.tags)
        spec, random, nondeterministic = info
        tensors = _tensors(args, kwargs)
        keys = [_key(t) for t in tensors]
        by_key = self.by_key
        used: List[_Node] = []
        for k in keys:
            node = by_key.get(k)
            if node is not None and node not in used:
                used.append(node)
        if used:
            self._pin_all(used)      # restores what this op reads
            if self._track_times and not self._in_backward:
                now, waited = time.perf_counter_ns(), self._stalled_ns()
                for node in used:
                    node.last_use_ns, node.waited_ns = now, waited
        try:
            written = self._written(func, args, kwargs) if spec else ()
            writes_node = False
            for t in written:
                k = _key(t)
                self._invalidate_readers(k)
                writes_node = writes_node or k in by_key
            replayable = not nondeterministic or torch.are_deterministic_algorithms_enabled()
            # New storages made from tensors that require grad: activations. Not when the
            # op also writes a registered storage (replaying it would write that again).
            creates = (replayable and not writes_node and torch.is_grad_enabled()
                       and any(t.requires_grad for t in tensors))
            generator = rng = None
            if random and (creates or writes_node):
                generator = self._generator(kwargs, tensors)
                rng = generator.get_state()   # replayed bit for bit from here
            if self.cost_model == "time":
                start = time.perf_counter_ns()
                out = func(*args, **kwargs)
                elapsed = time.perf_counter_ns() - start
            else:
                out = func(*args, **kwargs)
                elapsed = 0
        finally:
            if used:
                self._unpin_all(used)
        if used:
            for o in (out if isinstance(out, _SEQ) else (out,)):   # views of known storages
                if isinstance(o, torch.Tensor):
                    node = by_key.get(_key(o))
                    if node is not None:
                        self._watch(node, o)
        if writes_node:
            self._record_mutation(func, args, kwargs, written, rng, generator,
                                  replayable, elapsed, tensors)
        if creates:
            self._record_creation(func, args, kwargs, out, set(keys), rng, generator,
                                  elapsed, tensors)
        return out

    def _lineage_args(self, args: Any, kwargs: Any) -> Tuple[Any, Any, List[_Node], List[int]]:
        """``args``/``kwargs`` with registered storages replaced by references; also the
        nodes and the other storages they read (to record the new node as their reader)."""
        nodes: List[_Node] = []
        leaves: List[int] = []

        def convert(t: torch.Tensor) -> Any:
            k = _key(t)
            node = self.by_key.get(k)
            if node is None:
                leaves.append(k)
                return t
            nodes.append(node)
            return _Ref(node, t)

        args, kwargs = _map(torch.Tensor, convert, (args, kwargs))
        return args, kwargs, nodes, leaves

    def _add_reader(self, reader: _Node, nodes: List[_Node], leaves: List[int]) -> None:
        ref = weakref.ref(reader)
        for node in nodes:
            if node is not reader:
                node.readers.append(ref)
        for k in leaves:
            self.leaf_readers.setdefault(k, []).append(ref)

    def _record_creation(self, func, args, kwargs, out, read_keys, rng, generator,
                         elapsed, tensors) -> None:
        flat = _leaves(out)
        fresh = []
        for i, o in enumerate(flat):
            if not isinstance(o, torch.Tensor) or o.device.type != self._device_type:
                continue
            k = _key(o)
            if k in read_keys or k in self.by_key:
                continue   # a view of an input (watched already), or a known storage
            if o.untyped_storage().nbytes() < self.min_bytes:
                continue
            fresh.append((i, o))
        if not fresh:
            return
        outputs = [o for o in flat if isinstance(o, torch.Tensor)]
        cost = self._cost(func, args, tensors, outputs, elapsed)
        largs, lkwargs, nodes, leaves = self._lineage_args(args, kwargs)
        for i, o in fresh:
            step = _Step(func, largs, lkwargs, i, rng, generator, cost)
            node = _Node(self._next_handle, o, [step], cost)
            self._next_handle += 1
            self.nodes[node.handle] = node
            self.by_key[node.key] = node
            if self.can_swap and not self._in_backward:
                node.ordinal = self._ordinal
                self._ordinal += 1
                self._by_ordinal[node.ordinal] = node
                if self._track_times:
                    node.last_use_ns, node.waited_ns = time.perf_counter_ns(), self._stalled_ns()
            self._add_reader(node, nodes, leaves)
            self._watch(node, o)
            self._mark(node)

    def _record_mutation(self, func, args, kwargs, written, rng, generator,
                         replayable, elapsed, tensors) -> None:
        targets = []
        for t in written:
            node = self.by_key.get(_key(t))
            if node is not None and node not in targets:
                targets.append(node)
        if not targets:
            return
        for node in targets:   # their host copies are stale now
            if node.slot:
                self._drop_copy(node)
        target = targets[0]
        if (len(targets) > 1 or not replayable or target.frozen or target.steps is None
                or len(target.steps) >= _MAX_CHAIN):
            for node in targets:
                node.version += 1
                self._freeze(node)
            return
        cost = self._cost(func, args, tensors, [], elapsed)
        largs, lkwargs, nodes, leaves = self._lineage_args(args, kwargs)
        target.steps.append(_Step(func, largs, lkwargs, 0, rng, generator, cost))
        target.version += 1
        target.cost += cost
        self._add_reader(target, nodes, leaves)
        self._unmark(target)
        self._mark(target)   # new cost

    # --- saved-tensor hooks: backward's access to saved activations --------------------------
    def pack(self, t: torch.Tensor) -> Tuple[torch.Tensor, int]:
        # A detached alias: returning ``t`` itself would make an output and its grad_fn a
        # reference cycle that the garbage collector cannot see. The alias shares ``t``'s
        # version counter, and autograd skips its own in-place check for hooked tensors,
        # so the check is made here, at unpack.
        return t.detach(), t._version

    def unpack(self, packed: Tuple[torch.Tensor, int]) -> torch.Tensor:
        t, version = packed
        if t._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by "
                f"an inplace operation: [{t.dtype}, {list(t.shape)}] is at version "
                f"{t._version}; expected version {version} instead (found by pyalloc's "
                "registry, which checks saved tensors in place of autograd)")
        if not self.can_swap:
            return self.ensure(t)
        node = self.by_key.get(_key(t))
        if node is None:
            return t
        self._backward_use(node)
        self.ensure(t)
        if self.prefetch_depth:
            with _disable_current_modes():
                self._prefetch_after(node)
        return t

    # --- leaving --------------------------------------------------------------------------------
    def restore_all(self) -> None:
        """Restores every evicted storage the program still holds (oldest first, so each
        chain is rebuilt front to back) and forgets the rest."""
        with _disable_current_modes():
            for node in list(self.nodes.values()):
                if node.evicted and _storage_use_count(node.key) > 1:
                    self._restore_now(node)
                if node.arriving:
                    self._arrive(node)


def _installed_device() -> Optional[str]:
    from .install import installed_device

    return installed_device()


_active: Optional[Registry] = None   # the process-wide registry of install(policy=...)


def active() -> Optional[Registry]:
    """The registry of ``install(policy="recompute" | "swap" | "hybrid")``, or None."""
    return _active


def host_pool_size(engine: Engine, requested: int = 0) -> int:
    """The host pool to allocate: ``requested``, or (0) as much as the device has, at most
    a quarter of the host's RAM (pinned memory is taken from everything else)."""
    if requested:
        return requested
    device_total = int(engine.stats()["device_total_bytes"])
    try:
        host_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):   # not exposed: assume it is no smaller than the device
        host_ram = 4 * device_total
    return max(1 << 20, min(device_total, host_ram // 4))


def _start(engine: Engine, min_bytes: int, cost: str, policy: str = "recompute",
           prefetch: int = 4, host_pool: int = 0) -> Registry:
    # Under recompute a host pool is allocated only when asked for (host_pool > 0): it
    # lets storages with no lineage be relocated through it as a last resort.
    registry = Registry(engine, min_bytes, cost, policy, prefetch,
                        relocate=policy == "recompute" and host_pool > 0)
    if registry.can_relocate:
        engine.set_host_pool(host_pool_size(engine, host_pool))
        registry.calibrate_copies()
    engine.set_evict_callback(registry.evict)
    engine.set_compact_callbacks(registry.movable, registry.relocate)
    registry.__enter__()
    registry._hooks = torch.autograd.graph.saved_tensors_hooks(registry.pack, registry.unpack)
    registry._hooks.__enter__()
    return registry


def _stop(registry: Registry) -> None:
    try:
        registry.restore_all()
    finally:
        registry.engine.set_evict_callback(None)
        registry.engine.set_compact_callbacks(None, None)
        registry._hooks.__exit__(None, None, None)
        registry.__exit__(None, None, None)
        for node in list(registry.nodes.values()):
            registry._forget(node)


def _settings(engine: Engine, **given: Any) -> Dict[str, Any]:
    """``given`` with every None filled in from the engine's options."""
    from .options import parse_conf

    chosen = parse_conf(engine.options_string)
    defaults = {"min_bytes": int(chosen["min_evictable"]), "cost": chosen["remat_cost"],
                "policy": chosen["policy"] if chosen["policy"] in POLICIES else "recompute",
                "prefetch": int(chosen["prefetch"]), "host_pool": int(chosen["host_pool"])}
    return {k: defaults[k] if v is None else v for k, v in given.items()}


def enable(engine: Optional[Engine] = None, min_bytes: Optional[int] = None,
           cost: Optional[str] = None, policy: Optional[str] = None,
           prefetch: Optional[int] = None, host_pool: Optional[int] = None) -> Registry:
    """Turns eviction on for the calling thread until :func:`disable`
    (``install(policy=...)`` calls this). Arguments left None come from the engine's
    options (``min_evictable``, ``remat_cost``, ``policy``, ``prefetch``, ``host_pool``)."""
    global _active
    if _active is not None:
        raise RuntimeError("pyalloc: eviction is already on (install(policy=...) or "
                           "pyalloc.registry.enable() was called before)")
    if engine is None:
        from . import _engine

        engine = _engine(None)
    _active = _start(engine, **_settings(engine, min_bytes=min_bytes, cost=cost, policy=policy,
                                         prefetch=prefetch, host_pool=host_pool))
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
              prefetch: Optional[int] = None,
              host_pool: Optional[int] = None) -> Iterator[Registry]:
    """Within the block, activations may be evicted, and recomputed or swapped back on use.

    Run the forward *and* ``backward()`` inside it; on leaving, every evicted tensor the
    program still holds is restored. ``engine``: the installed engine of the current
    device by default. ``policy``: "recompute", "swap" or "hybrid". Arguments left None
    come from the engine's options (``min_evictable``, ``remat_cost``, ``policy`` when it
    is one of those three, else "recompute", ``prefetch``, ``host_pool``). Inside
    ``install(policy=...)`` it is a no-op that yields the process-wide registry.
    """
    if _active is not None:
        yield _active
        return
    if engine is None:
        from . import _engine

        engine = _engine(None)
    registry = _start(engine, **_settings(engine, min_bytes=min_bytes, cost=cost, policy=policy,
                                          prefetch=prefetch, host_pool=host_pool))
    try:
        yield registry
    finally:
        _stop(registry)
