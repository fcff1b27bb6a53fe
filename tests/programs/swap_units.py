"""Unit checks of the swap policy (allocator/src/swap.cpp, pyalloc.registry) under PyTorch.

tests/test_swap.py runs each in a fresh interpreter, as
``python tests/programs/swap_units.py CHECK`` (see unit_harness.py: pyalloc installed on
the simulated device, ``ok`` printed at the end); the test of the same name says why.
"""
from __future__ import annotations

import pytest
import torch

import pyalloc
from unit_harness import main


def a_tensor_without_lineage_is_swapped_and_a_failed_swap_in_loses_nothing() -> None:
    engine = pyalloc._engine(None)
    x = torch.randn(512, 512, requires_grad=True)
    with pyalloc.recompute(min_bytes=0, policy="swap", prefetch=0) as reg:
        a = x * 2
        for _ in range(257):  # past a forward chain's 256 steps; a chain too long to replay: no lineage, swap only
            a.add_(1)
        node = reg.node_of(a)
        assert node.frozen
        want = a.detach().clone()
        assert reg.evict([node.handle]) == 1 and node.evicted and node.clean
        # A refused copy is tried again (the host copy is intact): two refusals, and the
        # third try brings it back.
        engine.fail_copies(2)
        assert torch.equal(a + 0, want) and not node.evicted
        assert reg.evict([node.handle]) == 1 and node.evicted and node.clean
        engine.fail_copies(3)
        # Three refusals: raised inside an op, through the dispatcher, a RuntimeError naming
        # the cause.
        with pytest.raises(RuntimeError, match="no lineage to recompute it from"):
            a + 0
        assert node.evicted       # still out, and its host copy still there
        assert torch.equal(a, want)
        # With lineage, a refused swap-in recomputes instead.
        b = x.exp()
        want_b = b.detach().clone()
        node_b = reg.node_of(b)
        assert reg.evict([node_b.handle]) == 1 and node_b.clean
        engine.fail_copies(1)
        assert torch.equal(b, want_b) and reg.recomputes == 1


def _a_gradient_made_in_backward_leaves_as_a_host_copy(loss_of) -> None:
    """Under swap and hybrid the gradient with respect to h, made inside backward
    (``loss_of(h, w2)`` builds what follows h), is a node without lineage that can be
    swapped out from a hook on h and comes back bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    w1 = torch.randn(256, 256, requires_grad=True)
    w2 = torch.randn(256, 256, requires_grad=True)

    def step(policy, evict):
        w1.grad = w2.grad = None
        with pyalloc.recompute(policy=policy, prefetch=0) as reg:
            h = torch.tanh(x @ w1)
            seen = []

            def hook(grad):
                # Runs inside backward, after the ops that made the gradient.
                node = reg.node_of(grad)
                seen.append(node is not None and node.frozen and node.chain == 0)
                if evict and node is not None:
                    assert reg.evict([node.handle]) == 1 and node.evicted
                return grad * 1.5                 # read: copied back in
            h.register_hook(hook)
            loss_of(h, w2).backward()
            stats = reg.stats()
        return seen, [w1.grad.clone(), w2.grad.clone()], stats

    for policy in ("swap", "hybrid"):
        seen, want, _ = step(policy, evict=False)
        assert seen == [True], (policy, seen)
        _, got, stats = step(policy, evict=True)
        assert stats["swap_outs"] >= 1 and stats["swap_ins"] >= 1, (policy, stats)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), policy


def what_backward_makes_leaves_as_a_host_copy_and_comes_back_bit_for_bit() -> None:
    _a_gradient_made_in_backward_leaves_as_a_host_copy(lambda h, w2: ((h @ w2) ** 2).sum())


def what_a_reentrant_checkpoint_hands_back_leaves_as_a_host_copy_and_comes_back_bit_for_bit() -> None:
    # Made by the checkpoint's inner pass, which has ended when the hook runs: still a node
    # (of the outer pass). See Note [Passes inside a pass].
    from torch.utils.checkpoint import checkpoint

    def loss_of(h, w2):
        y = checkpoint(lambda t: torch.tanh(t @ w2) * 2, h, use_reentrant=True)
        return (y ** 2).sum()
    _a_gradient_made_in_backward_leaves_as_a_host_copy(loss_of)


def bad_policy_arguments_name_the_problem() -> None:
    with pytest.raises(ValueError, match="policy must be one of recompute, swap, hybrid"):
        with pyalloc.recompute(policy="offload"):
            pass
    with pytest.raises(ValueError, match="prefetch"):
        with pyalloc.recompute(policy="swap", prefetch=-1):
            pass


def what_an_op_on_a_subclass_returns_leaves_as_a_host_copy() -> None:
    # Note [What a subclass's op returns] in registry/src/dispatch.cpp: a float8-style
    # subclass whose matmul returns its output upcast, as a plain tensor. Under swap, and
    # recompute with spill on, that output is a node without lineage; with spill off it
    # stays what it was, no node.
    from torch.utils._pytree import tree_map

    class Scaled(torch.Tensor):
        @staticmethod
        def __new__(cls, data, scale):
            return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.float32,
                                                       device=data.device)

        def __init__(self, data, scale):
            self._data, self._scale = data, scale

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda t: t._data.float() * t._scale if isinstance(t, Scaled) else t  # noqa: E731
            return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

    a = torch.randn(256, 256)
    w = Scaled(torch.randn(256, 256).to(torch.bfloat16), torch.tensor(0.5))
    want = torch.mm(a, w)
    # Under recompute with spill off nothing could bring it back: no node.
    for policy, spill in (("swap", True), ("recompute", True), ("recompute", False)):
        with pyalloc.recompute(min_bytes=0, policy=policy, prefetch=0, spill=spill) as reg:
            out = torch.mm(a, w)                 # plain: the subclass upcast it
            assert type(out) is torch.Tensor and torch.equal(out, want)
            node = reg.node_of(out)
            if not spill:
                assert node is None
                continue
            assert node is not None
            assert reg.evict([node.handle]) == 1 and reg.node_of(out).evicted
            assert torch.equal(out * 1, want)    # swapped back in
            assert reg.stats()["swap_ins"] >= 1


if __name__ == "__main__":
    main([a_tensor_without_lineage_is_swapped_and_a_failed_swap_in_loses_nothing,
          what_backward_makes_leaves_as_a_host_copy_and_comes_back_bit_for_bit,
          what_a_reentrant_checkpoint_hands_back_leaves_as_a_host_copy_and_comes_back_bit_for_bit,
          bad_policy_arguments_name_the_problem,
          what_an_op_on_a_subclass_returns_leaves_as_a_host_copy])
