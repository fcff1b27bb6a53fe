"""Selective activation checkpointing under a policy: losses and gradients as without one.

tests/test_dispatch.py runs ``python tests/programs/selective_checkpoint.py POLICY BUDGET``
(POLICY ``none`` for the reference) and compares what it prints. Four residual blocks, each
run through ``checkpoint(..., use_reentrant=False, context_fn=create_selective_checkpoint_contexts(...))``
that saves matmuls and recomputes the rest. Under recompute with a budget of half the peak, the
registry restores evicted inputs of a block while PyTorch recomputes it under a Python mode
that answers each saved op in order (Note [The registry's own ops] in registry/src/own_ops.h).
"""
from __future__ import annotations

import functools
import hashlib
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import pyalloc


def policy_fn(ctx, op, *args, **kwargs):
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class Block(torch.nn.Module):
    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(self.ln(x)))


def main() -> None:
    policy, budget = sys.argv[1], int(sys.argv[2])
    pyalloc.install(device="cpu", budget=budget, **({} if policy == "none" else {"policy": policy}))
    torch.manual_seed(0)
    inp = torch.nn.Linear(256, 256)
    blocks = torch.nn.ModuleList(Block() for _ in range(4))
    context = functools.partial(create_selective_checkpoint_contexts, policy_fn)
    h = inp(torch.randn(4096, 256))                  # 4 MiB activations
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False, context_fn=context)
    loss = h.square().mean()
    loss.backward()
    digest = hashlib.sha256()
    for p in list(inp.parameters()) + list(blocks.parameters()):
        digest.update(p.grad.numpy().tobytes())
    print("loss", float(loss.detach()).hex(), "grads", digest.hexdigest()[:16])
    print("recomputes", pyalloc.memory_stats().get("remat.recomputes", 0))


if __name__ == "__main__":
    main()
