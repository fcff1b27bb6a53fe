"""The tensor registry: lineage of forward activations, eviction by the engine, recompute.

A first vertical slice of issue 4 (not yet the full policy): inside ``recompute()``, every
storage produced by a deterministic, out-of-place forward op (grad mode on) is recorded
with the op and its inputs, and marked evictable in the engine with the op's measured
cost. When an allocation does not fit, the engine picks victims (evictor.cpp) and calls
:meth:`Registry.evict`, which frees their storages with ``untyped_storage().resize_(0)``;
the tensor objects stay valid. Any op that later reads an evicted storage (forward, or a
backward op reading a saved activation) first restores it: inputs restored recursively,
the op replayed, the result copied into the same storage (a storage-level copy, so the
version counter autograd checks does not move).

Deliberately unevictable in this slice: outputs of random ops (no generator replay yet),
storages any op mutates in place (no mutation-chain replay yet), backward outputs
(gradients), and anything created outside the block. A storage whose every known alias
has died is forgotten; if it was evicted at that moment it could no longer be restored,
so eviction only picks storages with a live alias, and forgetting happens on death.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .engine import Engine


class _Node:
    __slots__ = ("handle", "func", "args", "kwargs", "index", "nbytes", "cost", "aliases",
                 "evicted", "frozen", "__weakref__")

    def __init__(self, handle: int, func: Any, args: Any, kwargs: Any, index: int,
                 nbytes: int, cost: float) -> None:
        self.handle = handle
        self.func = func
        self.args = args          # inputs held strongly: needed to recompute this storage
        self.kwargs = kwargs
        self.index = index        # which flattened output of func
        self.nbytes = nbytes
        self.cost = cost          # ns measured, or bytes (cost="bytes")
        self.aliases: List[weakref.ref] = []
        self.evicted = False
        self.frozen = False       # mutated in place: the lineage no longer describes it

    def tensor(self) -> Optional[torch.Tensor]:
        for ref in self.aliases:
            t = ref()
            if t is not None:
                return t
        return None


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class Registry(TorchDispatchMode):
    """Records lineage and serves the engine's eviction requests; see the module doc."""

    def __init__(self, engine: Engine, min_bytes: int = 1 << 16, cost: str = "time") -> None:
        super().__init__()
        if cost not in ("time", "bytes"):
            raise ValueError(f'cost must be "time" (measured) or "bytes" (deterministic), not {cost!r}')
        self.engine = engine
        self.min_bytes = min_bytes
        self.cost_model = cost
        self.nodes: Dict[int, _Node] = {}        # handle -> node
        self.by_storage: Dict[int, _Node] = {}   # StorageImpl address -> node
        self._next = 1
        self.evictions = 0
        self.recomputes = 0

    # --- engine side ------------------------------------------------------------------
    def evict(self, handles: List[int]) -> int:
        done = 0
        for h in handles:
            node = self.nodes.get(h)
            if node is None or node.evicted or node.frozen:
                continue
            t = node.tensor()
            if t is None or t.untyped_storage().nbytes() == 0:
                continue
            t.untyped_storage().resize_(0)   # frees through the engine; views stay valid
            node.evicted = True
            done += 1
        self.evictions += done
        return done

    def _mark(self, node: _Node, evictable: bool) -> None:
        t = node.tensor()
        if t is None or node.evicted:
            return
        ptr = t.untyped_storage().data_ptr()
        if ptr:
            self.engine.set_evictable(ptr, node.handle if evictable and not node.frozen else 0,
                                      node.cost)

    # --- restoring ----------------------------------------------------------------------
    def _pin_inputs(self, tree: Any) -> List[_Node]:
        """Pins every registered storage ``tree`` reads (restoring evicted ones), so that
        nothing this op or replay needs can be evicted by the allocations it makes."""
        nodes: List[_Node] = []
        seen = set()
        for leaf in pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                node = self.by_storage.get(_storage_key(leaf))
                if node is not None and id(node) not in seen:
                    seen.add(id(node))
                    nodes.append(node)
        for node in nodes:            # resident ones first, before any restore allocates
            if not node.evicted:
                self._mark(node, False)
        for node in nodes:
            if node.evicted:
                self._restore(node)   # leaves it pinned
        return nodes

    def _unpin(self, nodes: List[_Node]) -> None:
        for node in nodes:
            self._mark(node, True)

    def _restore(self, node: _Node) -> None:
        t = node.tensor()
        if t is None:
            raise RuntimeError("pyalloc: an evicted storage lost every alias; it cannot be "
                               "restored (this is a registry bug)")
        pinned = self._pin_inputs((node.args, node.kwargs))
        try:
            out = node.func(*node.args, **node.kwargs)
        finally:
            self._unpin(pinned)
        fresh = pytree.tree_leaves(out)[node.index]
        if fresh.untyped_storage().nbytes() != node.nbytes:
            raise RuntimeError(f"pyalloc: recomputing {node.func} gave "
                               f"{fresh.untyped_storage().nbytes()} bytes, expected {node.nbytes}")
        storage = t.untyped_storage()
        storage.resize_(node.nbytes)
        storage.copy_(fresh.untyped_storage())
        node.evicted = False
        self.recomputes += 1
        self._mark(node, False)       # pinned for the caller, who unpins it

    # --- recording ------------------------------------------------------------------------
    def _forget(self, handle: int, key: int) -> None:
        node = self.nodes.get(handle)
        if node is None or any(ref() is not None for ref in node.aliases):
            return
        del self.nodes[handle]
        if self.by_storage.get(key) is node:
            del self.by_storage[key]

    def _alias(self, node: _Node, t: torch.Tensor, key: int) -> None:
        handle = node.handle
        node.aliases.append(weakref.ref(t, lambda _r: self._forget(handle, key)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        used = self._pin_inputs((args, kwargs))
        start = time.perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        finally:
            if func._schema.is_mutable:
                for n in used:        # it may have been written in place: lineage is stale
                    n.frozen = True
            self._unpin(used)         # unpinned, and touched
        cost = float(time.perf_counter_ns() - start)
        outputs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        if self.cost_model == "bytes":   # deterministic: runs (and tests) repeat exactly
            cost = float(sum(o.untyped_storage().nbytes() for o in outputs))
        if torch.is_grad_enabled() and torch.Tag.nondeterministic_seeded not in func.tags:
            # Storages this op read -> their node (None when unregistered).
            read = {_storage_key(x): None for x in pytree.tree_leaves((args, kwargs))
                    if isinstance(x, torch.Tensor)}
            read = {key: self.by_storage.get(key) for key in read}
            for i, o in enumerate(pytree.tree_leaves(out)):
                if not isinstance(o, torch.Tensor) or o.device.type not in ("cpu", "cuda"):
                    continue
                key = _storage_key(o)
                if key in read:               # a view of an input: one more alias
                    if read[key] is not None:
                        self._alias(read[key], o, key)
                    continue
                nbytes = o.untyped_storage().nbytes()
                if nbytes < self.min_bytes or func._schema.is_mutable:
                    continue
                node = _Node(self._next, func, args, kwargs, i, nbytes, cost)
                self._next += 1
                self.nodes[node.handle] = node
                self.by_storage[key] = node
                self._alias(node, o, key)
                self._mark(node, True)
        return out


@contextlib.contextmanager
def recompute(engine: Optional[Engine] = None, min_bytes: int = 1 << 16,
              cost: str = "time") -> Iterator[Registry]:
    """Within the block, forward activations may be evicted and recomputed on demand.

    Run the forward *and* ``backward()`` inside it. ``engine``: the installed engine of the
    current device by default.
    """
    if engine is None:
        from . import _engine

        engine = _engine(None)
    registry = Registry(engine, min_bytes, cost)
    engine.set_evict_callback(registry.evict)
    try:
        with registry:
            yield registry
    finally:
        # Leave no reachable tensor without its data, restoring in creation order so each
        # chain is recomputed front to back (an ancestor, once used, may be evicted again)
        # rather than all at once. Eviction stays on until the last restore is done.
        try:
            for handle in sorted(registry.nodes):
                node = registry.nodes.get(handle)
                if node is not None and node.evicted and node.tensor() is not None:
                    registry._restore(node)
                    registry._mark(node, True)
        finally:
            engine.set_evict_callback(None)
            for node in list(registry.nodes.values()):
                registry._mark(node, False)
