"""A compiled function that reads an activation it is not passed, under a policy.

Run by tests/test_compiled.py in a fresh interpreter: ``python
tests/programs/compiled_lifted_input.py POLICY``. Dynamo lifts what compiled code reads from
a dict, an attribute, a closure or a global into the graph as an input; pyalloc/compiled.py
held only the compiled callable's own arguments, so an evicted activation read that way was
read where it was not (the evicted-memory error), in forward and in the compiled backward
(_guard_graphs holds every input of every compiled graph). Evicts the tapped activation
before the forward, then again between forward and backward, and compares the output and
the gradients with the same calls under no eviction. Prints ``ok``.
"""
import sys

import torch

import pyalloc

policy = sys.argv[1]
pyalloc.install(device="cpu", budget="512MiB", policy=policy,
                **({} if policy == "recompute" else {"host_pool": "512MiB"}))
reg = pyalloc.registry.active()
taps = {}


@torch.compile
def head(x):
    return (x * taps["mid"]).tanh()   # taps["mid"]: no argument, a graph input all the same


torch.manual_seed(0)
w = torch.randn(512, 512, requires_grad=True)
x = torch.randn(512, 512, requires_grad=True)


def run(evict: bool):
    w.grad = x.grad = None
    taps["mid"] = torch.sigmoid(w * 2)   # an activation: a node
    if evict:
        assert reg.evict([reg.node_of(taps["mid"]).handle]) == 1
    y = head(x)
    if evict:
        assert reg.evict([reg.node_of(taps["mid"]).handle]) == 1
    y.sum().backward()
    return y.detach(), w.grad.clone(), x.grad.clone()


run(False)   # compiled here, with everything resident
want, got = run(False), run(True)
assert all(torch.equal(a, b) for a, b in zip(want, got))

# Note [Graph breaks keep the policy] in pyalloc/compiled.py: what eager code makes between
# a compiled callable's graphs is a node the registry can evict, and comes back bit for bit.
made = {}


@torch._dynamo.disable
def eager_middle(h):
    made["mid"] = torch.tanh(h @ w)   # runs eagerly inside the compiled callable
    return made["mid"]


@torch.compile
def broken(x):
    return (eager_middle(x * 2) * 3).sigmoid()


def run_broken(evict: bool):
    w.grad = x.grad = None
    y = broken(x)
    node = reg.node_of(made["mid"])
    assert node is not None, "an eager activation inside a compiled callable is no node"
    if evict:
        assert reg.evict([node.handle]) == 1
    y.sum().backward()
    return y.detach(), w.grad.clone(), x.grad.clone()


run_broken(False)
want, got = run_broken(False), run_broken(True)
assert all(torch.equal(a, b) for a, b in zip(want, got))
print("ok")
