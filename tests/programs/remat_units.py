"""Unit checks of rematerialization (pyalloc.registry) under PyTorch: evict, recompute, compare.

tests/test_remat.py runs each in a fresh interpreter, as
``python tests/programs/remat_units.py CHECK`` (see unit_harness.py: pyalloc installed on
the simulated device, ``ok`` printed at the end); the test of the same name says why.
"""
from __future__ import annotations

import contextlib
import gc
import math

import pytest
import torch

import pyalloc
from unit_harness import main


def random_ops_replay_bit_for_bit() -> None:
    x = torch.randn(256, 256, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        y = torch.nn.functional.dropout(x, 0.5) * 3      # empty_like, bernoulli_, div_, mul
        z = torch.rand_like(x) + x                      # a random creation
        # A random op that writes an argument: its draws (no copy of what was there).
        r = torch.nn.functional.rrelu(x * 1, training=True)
        want_y, want_z, want_r = y.detach().clone(), z.detach().clone(), r.detach().clone()
        assert reg.evict(list(reg.nodes)) > 0
        assert y.untyped_storage().nbytes() == 0        # really evicted
        torch.randn(10)                                 # moves the generator on
        assert torch.equal(y, want_y) and torch.equal(z, want_z) and torch.equal(r, want_r)
        assert reg.recomputes >= 2
        # Each replayed op is counted under its name: what recompute spent its time on.
        replays = reg.replays_by_op()
        # Dropout's mask: drawn by bernoulli_ on the CPU, by the fused native_dropout on CUDA.
        assert (replays.get("aten::bernoulli_.float", 0)
                + replays.get("aten::native_dropout", 0)) >= 1, replays
        assert replays.get("aten::mul.Tensor", 0) >= 1, replays
        assert sum(replays.values()) >= reg.recomputes, (replays, reg.recomputes)


def readers_of_an_earlier_version_stay_recomputable() -> None:
    x = torch.randn(256, 256, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        a = x * 2
        b = a + 1                       # recorded from a at version 0
        want = b.detach().clone()
        reg.evict([reg.node_of(b).handle])
        with torch.no_grad():
            a.mul_(3)                   # extends a's chain: b keeps its lineage
        want_a = a.detach().clone()
        assert not reg.node_of(b).frozen and reg.node_of(b).evicted
        assert torch.equal(b, want)     # a at version 0 rebuilt apart from a
        reg.evict(list(reg.nodes))
        assert torch.equal(a, want_a) and torch.equal(b, want)
        assert not reg.node_of(b).frozen and not reg.node_of(a).frozen
        # A write the chain cannot follow (two storages at once) settles b first:
        # restored while a's first step can still be replayed, then frozen.
        c = x * 7
        reg.evict(list(reg.nodes))
        with torch.no_grad():
            torch._foreach_add_([a, c], 1)
        node_b = reg.node_of(b)
        assert node_b.frozen and not node_b.evicted
        assert torch.equal(b, want)
        assert torch.equal(a, want_a + 1)
        a2 = x * 5
        a2.relu_()                      # an in-place chain on a fresh storage
        a2.add_(1)
        want2 = a2.detach().clone()
        reg.evict(list(reg.nodes))
        assert torch.equal(a2, want2)


def a_batch_norm_applied_twice_keeps_both_outputs_recomputable() -> None:
    # Note [Running statistics are read only in inference] in registry/src/registry.cpp.
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(64)
    x1, x2 = torch.randn(512, 64, requires_grad=True), torch.randn(512, 64, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        y1 = bn(x1) * 2                 # training: writes the running statistics
        want1 = y1.detach().clone()
        y2 = bn(x2) * 2                 # writes them again: y1 was made without reading them
        node = reg.node_of(y1)
        assert not node.frozen, "a training-mode update of the running statistics froze y1"
        reg.evict(list(reg.nodes))
        assert reg.node_of(y1).evicted
        assert torch.equal(y1, want1)
        stats = (bn.running_mean.clone(), bn.running_var.clone())
        (y1.sum() + y2.sum()).backward()  # the replay updated copies, never the module's
        assert torch.equal(bn.running_mean, stats[0]) and torch.equal(bn.running_var, stats[1])
        # In inference mode a batch norm reads them: a later update must not change what
        # it made. The statistics are far lighter than z, so z's lineage keeps a copy of
        # them (Note [A written leaf's readers keep a copy] in registry/src/writes.cpp).
        bn.eval()
        z_in = bn(x1.detach())
        z = z_in * 2
        want_z = z.clone()
        copies = reg.leaf_copies
        bn.train()
        bn(x2.detach())
        assert not reg.node_of(z_in).frozen and reg.leaf_copies == copies + 2  # mean and var
        reg.evict(list(reg.nodes))
        assert reg.node_of(z).evicted and reg.node_of(z_in).evicted
        assert torch.equal(z, want_z)


def what_autograd_saves_of_an_in_place_op_is_a_node_and_comes_back_bit_for_bit() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 256, requires_grad=True)
    w = torch.randn(256, 256, requires_grad=True)
    plain = torch.randn(256, 256)

    def step(evict):
        x.grad = w.grad = None
        with pyalloc.recompute(min_bytes=0) as reg:
            a = x * 2
            a.mul_(w)                   # extends a's chain; saves a at version 0
            with torch.no_grad():       # not a node (Note [What no_grad derives]):
                b = plain.clone()       # its write cannot be followed
            b.mul_(w)
            saved = reg.node_of(a.grad_fn._saved_self)
            not_saved = reg.node_of(b.grad_fn._saved_self)
            if evict:
                reg.evict(list(reg.nodes))
                assert saved.evicted
            ((a * a).sum() + b.sum()).backward()
            stats = reg.stats()
        return saved, not_saved, [x.grad.clone(), w.grad.clone()], stats

    saved, not_saved, want, _ = step(False)
    assert saved is not None and not_saved is None
    saved, _, got, stats = step(True)
    assert stats["recomputes"] > 0, stats
    assert all(torch.equal(g, h) for g, h in zip(want, got))


class _ScaledTanh(torch.autograd.Function):
    """A custom Function: its forward runs with grad mode off and saves its output."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x) * 1.7
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, gy):
        y, = ctx.saved_tensors
        return gy * (1.7 - y * y / 1.7)


def what_no_grad_derives_from_an_activation_is_a_node_and_comes_back_bit_for_bit() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    w = torch.randn(256, 256, requires_grad=True)

    def step(evict):
        w.grad = None
        with pyalloc.recompute() as reg:
            h = x @ w
            y = _ScaledTanh.apply(h)          # made with grad mode off, saved for backward
            with torch.no_grad():
                z = h * 2                     # reads an activation: derived from it
                from_param = w * 2            # reads only a parameter: not recorded
            with torch.inference_mode():
                inferred = h * 3              # inference mode: never recorded
            nodes = [reg.node_of(t) for t in (y, z, from_param, inferred)]
            want_z = z.clone()
            if evict:
                assert reg.evict([nodes[0].handle, nodes[1].handle]) == 2
                assert nodes[0].evicted and nodes[1].evicted
            (y * y).sum().backward()
            got_z = z.clone()
            stats = reg.stats()
        return nodes, w.grad.clone(), want_z, got_z, stats

    nodes, want, want_z, _, _ = step(False)
    assert nodes[0] is not None and nodes[1] is not None, nodes
    assert nodes[2] is None and nodes[3] is None, nodes
    _, got, _, got_z, stats = step(True)
    assert stats["recomputes"] >= 2, stats
    assert torch.equal(want, got) and torch.equal(want_z, got_z)


def _allocated() -> int:
    return pyalloc.memory_stats()["allocated_bytes.all.current"]


def _forward_held_then_replayed(forward, grads, zero, slack: int, then=None) -> None:
    """Trains `forward` once with no policy and once under recompute (min_bytes=0): its
    forward holds less under the policy than with none plus `slack`, backward after every
    node is evicted recomputes, and the gradients match. `then(reg)` runs under the policy
    after backward."""
    start = _allocated()
    loss = forward()
    plain_held = _allocated() - start
    loss.backward()
    want = grads()
    del loss
    zero()
    with pyalloc.recompute(min_bytes=0) as reg:
        start = _allocated()
        loss = forward()
        held = _allocated() - start
        assert held < plain_held + slack, (held, plain_held)
        assert reg.evict(list(reg.nodes)) > 0
        loss.backward()
        assert reg.recomputes > 0
        del loss
        if then is not None:
            then(reg)
    got = grads()
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _chain_after_evicting_everything(reg, t: torch.Tensor, evict: bool) -> int:
    """The chain of ``t``'s node (0: no node); with ``evict``, every node is evicted first,
    ``t``'s among them, and ``t`` must read back bit for bit."""
    node = reg.node_of(t)
    chain = node.chain if node is not None else 0
    want = t.detach().clone()
    if evict:
        assert reg.evict(list(reg.nodes)) > 0
        assert node.evicted
    assert torch.equal(t, want)
    return chain


def _is_a_node_with_lineage_and_trains_bit_for_bit(step) -> None:
    """``step(evict)`` returns (chain, gradients, stats): the tensor it looked at is a node
    with lineage, and evicting it (and everything else) recomputes, gradients unchanged."""
    chain, want, _ = step(False)
    assert chain >= 1    # a node with lineage, not a frozen or forgotten storage
    _, got, stats = step(True)
    assert stats["recomputes"] > 0, stats
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def what_a_pass_that_builds_a_graph_keeps_stays_evictable_and_comes_back_bit_for_bit() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 256, requires_grad=True)
    w = torch.randn(256, 256, requires_grad=True)

    def step(evict):
        x.grad = w.grad = None
        with pyalloc.recompute() as reg:
            y = torch.tanh(x @ w)
            # A gradient penalty: the pass builds a graph, and its result and what that
            # graph saved are read by the next backward.
            g, = torch.autograd.grad((y * y).sum(), x, create_graph=True)
            chain = _chain_after_evicting_everything(reg, g, evict)
            ((g * g).sum() + y.sum()).backward()
            stats = reg.stats()
        return chain, [x.grad.clone(), w.grad.clone()], stats

    _is_a_node_with_lineage_and_trains_bit_for_bit(step)


def what_a_reentrant_checkpoint_hands_back_stays_a_node_and_comes_back_bit_for_bit() -> None:
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    x = torch.randn(256, 256, requires_grad=True)
    w1 = torch.randn(256, 256, requires_grad=True)
    w2 = torch.randn(256, 256, requires_grad=True)

    def block(h):
        return torch.tanh(h @ w2) * 2

    def step(evict):
        x.grad = w1.grad = w2.grad = None
        seen = {}
        with pyalloc.recompute() as reg:
            h = torch.tanh(x @ w1)

            def hook(grad):
                # The gradient the checkpoint's inner pass made and handed back, read by
                # the outer pass after the inner one ended.
                seen["chain"] = _chain_after_evicting_everything(reg, grad, evict)

            h.register_hook(hook)
            y = checkpoint(block, h, use_reentrant=True)
            (y * y).sum().backward()
            stats = reg.stats()
        return seen["chain"], [x.grad.clone(), w1.grad.clone(), w2.grad.clone()], stats

    _is_a_node_with_lineage_and_trains_bit_for_bit(step)


def a_fill_written_with_activations_is_a_node_and_comes_back_bit_for_bit() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    w = torch.randn(256, 256, requires_grad=True)

    def step(evict):
        w.grad = None
        with pyalloc.recompute() as reg:
            h = x @ w
            # Made while activations exist: a zero-initialized parameter and a buffer of
            # statistics stay plain.
            param = torch.nn.Parameter(torch.zeros(256, 512))
            stat = torch.zeros(512)
            out = torch.zeros(256, 512)
            out[:, :256] = h * 2               # written with an activation: a node
            mask = torch.ones(256, 512)        # read by an op that makes an activation
            y = out * mask + param.t().t()     # (the parameter read through views)
            with torch.no_grad():
                stat.add_(y.mean(0))           # a write the lineage does not follow
            plain = torch.zeros(256, 512)      # never touched by an activation
            plain.add_(1)
            nodes = [reg.node_of(t) for t in (out, mask, param, stat, plain)]
            want = out.detach().clone()
            if evict:
                assert reg.evict([nodes[0].handle, nodes[1].handle]) == 2
                assert nodes[0].evicted and nodes[1].evicted
            assert torch.equal(out, want)
            (y * y).sum().backward()
            stats = reg.stats()
        return [n is not None for n in nodes], w.grad.clone(), stats

    made, want, _ = step(False)
    assert made == [True, True, False, False, False], made
    _, got, stats = step(True)
    assert stats["recomputes"] >= 2, stats
    assert torch.equal(want, got)


def gradients_summed_in_place_replay_bit_for_bit_and_leave_nothing_behind() -> None:
    torch.manual_seed(0)
    lin1, lin2, lin3 = (torch.nn.Linear(256, 256) for _ in range(3))
    params = [p for m in (lin1, lin2, lin3) for p in m.parameters()]
    x = torch.randn(512, 256)

    def loss_of(reg=None):
        h = lin1(x)
        y = h + lin2(torch.relu(h))
        if reg is not None:           # evict everything once h's gradient is summed
            h.register_hook(lambda g: (reg.evict(list(reg.nodes)), None)[1])
        return lin3(torch.tanh(y)).square().mean()

    loss_of().backward()
    want = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    with pyalloc.recompute(min_bytes=0) as reg:
        for step in range(3):
            loss_of(reg).backward()
            assert all(torch.equal(p.grad, w) for p, w in zip(params, want)), step
            # Frozen: only the gradients the program keeps, once each pass ends.
            assert reg.recomputes > 0 and reg.frozen == len(params) * (step + 1), reg.frozen
            assert len(reg.nodes) == 0, len(reg.nodes)
            for p in params:
                p.grad = None


def parameters_inputs_and_gradients_are_never_evicted() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1))
    x = torch.randn(512, 256)
    with pyalloc.recompute(min_bytes=0) as reg:
        loss = model(x).sum()
        reg.evict(list(reg.nodes))
        for t in [x, *model.parameters()]:
            assert t.untyped_storage().nbytes() > 0
        loss.backward()
        reg.evict(list(reg.nodes))
        for p in model.parameters():
            assert p.grad.untyped_storage().nbytes() > 0
        assert all(n.key not in {p.untyped_storage()._cdata for p in model.parameters()}
                   for n in reg.nodes.values())


def a_gradient_bound_for_a_grad_is_a_victim_of_last_resort() -> None:
    # Note [Gradients bound for .grad]: what autograd makes in a node with an edge into an
    # AccumulateGrad (a Linear's AddmmBackward: the bias's) may become a parameter's .grad,
    # which the pass's end must bring back; the engine drops it only where nothing else can
    # go. A gradient made by a node with no such edge (ReLU's) stays an ordinary victim.
    torch.manual_seed(0)
    first, second = torch.nn.Linear(256, 512), torch.nn.Linear(512, 512)
    head = torch.nn.Linear(512, 10)
    x = torch.randn(512, 256)
    seen = {}
    with pyalloc.recompute(min_bytes=0) as reg:
        pre = second(torch.relu(first(x)))      # its gradient comes from ReLU's backward

        def hook(grad):
            weight_grad = reg.node_of(head.weight.grad)  # stolen by AccumulateGrad, in the pass
            seen["weight grad"] = weight_grad is not None and weight_grad.last_resort
            node = reg.node_of(grad)
            seen["activation grad"] = node is not None and not node.last_resort
            return grad

        pre.register_hook(hook)
        head(torch.relu(pre)).logsumexp(1).mean().backward()
        # Once the pass ends the gradients are the program's: no nodes.
        assert all(reg.node_of(p.grad) is None for p in head.parameters())
        # A pass that builds a graph keeps what it made as nodes (Note [Passes that build a
        # graph]); made by the head's AddmmBackward, the gradient is an ordinary victim once
        # its pass has ended.
        h = torch.relu(second(torch.relu(first(x))))
        (g,) = torch.autograd.grad(head(h).logsumexp(1).mean(), h, create_graph=True)
        node = reg.node_of(g)
        assert node is not None and node.chain > 0 and not node.last_resort, node
    assert seen == {"weight grad": True, "activation grad": True}, seen


def _spill_a_gradient_bound_for_grad(**options):
    """Evicts head.weight's gradient inside the backward pass that makes it; returns what
    evict() did, the node's state after, the registry's stats and the gradient."""
    torch.manual_seed(0)
    first, head = torch.nn.Linear(256, 512), torch.nn.Linear(512, 1024)   # head.weight: 2 MiB
    x = torch.randn(512, 256)

    seen = {}
    with pyalloc.recompute(min_bytes=0, **options) as reg:
        pre = torch.relu(first(x))

        def hook(grad):
            node = reg.node_of(head.weight.grad)   # stolen by AccumulateGrad, in the pass
            assert node is not None and node.last_resort, node
            seen["evicted"] = reg.evict([node.handle])
            seen["after"] = (node.evicted, node.marked)
            return grad

        pre.register_hook(hook)
        head(pre).logsumexp(1).mean().backward()
        stats = reg.stats()
    return seen, stats, head.weight.grad.clone()


def a_victim_too_dear_to_replay_spills() -> None:
    # Note [Spilling under recompute] in registry/src/evict.cpp: a gradient bound for .grad
    # (too dear to replay: its replay runs back through the pass) leaves as a host copy with
    # spill on, and comes back bit for bit; with spill off it is dropped and replayed.
    want = _spill_a_gradient_bound_for_grad(spill=False)
    assert want[0] == {"evicted": 1, "after": (True, False)}, want[0]
    assert want[1].get("swap_outs", 0) == 0 and want[1]["recomputes"] > 0, want[1]
    assert pyalloc._engine(None).stats()["host_pool_bytes"] == 0   # no pool made
    spilled = _spill_a_gradient_bound_for_grad()   # the default pool, made now
    assert spilled[0] == {"evicted": 1, "after": (True, False)}, spilled[0]
    assert spilled[1]["swap_outs"] == 1 and spilled[1]["swap_ins"] == 1, spilled[1]
    assert torch.equal(spilled[2], want[2])


def a_victim_too_dear_to_replay_that_the_pool_refuses_stays() -> None:
    # Where the pool has no room for it, it stays, offered to the engine again as a victim
    # of last resort (spill_refused), and still comes back bit for bit. (A process of its
    # own: an engine keeps the first host pool it makes.)
    want = _spill_a_gradient_bound_for_grad(spill=False)
    refused = _spill_a_gradient_bound_for_grad(host_pool=1 << 20)   # no room for 2 MiB
    assert refused[0] == {"evicted": 0, "after": (False, True)}, refused[0]
    assert refused[1]["swap_outs"] == 0 and refused[1]["swap_fallbacks"] == 1, refused[1]
    assert torch.equal(refused[2], want[2])


def deaths_in_separate_batches_charge_what_one_walk_would() -> None:
    # Note [Charging a batch of deaths]: a death walks to the frontier an earlier death left,
    # in an earlier batch too, and a frontier node that died since is walked into. Each
    # collect() releases its deaths as a batch of their own, newest first, as backward does.
    x = torch.randn(256, 256, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        a = x * 2
        b = a * 3
        c = a + b               # a diamond: reads a and b
        d = c * 0.5
        e = d + b               # reads the dead chain and b directly
        node = {name: reg.node_of(t) for name, t in dict(a=a, b=b, c=c, d=d, e=e).items()}
        own = {name: n.cost for name, n in node.items()}
        assert all(cost > 0 for cost in own.values()), own
        del d
        reg.collect()
        del c
        reg.collect()
        assert node["c"].dead and node["d"].dead
        assert math.isclose(node["e"].cost, own["e"] + own["d"] + own["c"]), node["e"].cost
        f = e * 2               # e's reader: e's death will charge it
        node["f"], own["f"] = reg.node_of(f), reg.node_of(f).cost
        e_at_death = node["e"].cost
        del e
        reg.collect()
        del b                   # through c and d (frontier: e, dead since) and e: to f
        reg.collect()
        del a
        reg.collect()
        assert all(node[k].dead for k in "abcde") and not node["f"].dead
        want = own["f"] + e_at_death + own["b"] + own["a"]
        assert math.isclose(node["f"].cost, want), (node["f"].cost, want)
        # What its replay rebuilds: every dead node once.
        assert node["f"].dead_bytes == sum(node[k].nbytes for k in "abcde"), node["f"].dead_bytes
        want_f = f.detach().clone()
        reg.evict([node["f"].handle])
        assert torch.equal(f, want_f)       # rebuilt through all five dead nodes


def a_charge_reaching_an_unnoticed_death_still_charges_the_rest() -> None:
    # Note [Deaths found by a charge] in registry/src/liveness.cpp: a death's walk that meets
    # a reader whose storage died since the last drain marks that reader dead after the walk,
    # not inside it, where its own walk emptied this one's work list.
    base = torch.randn(256, 256, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        a = base * 2
        x = a * 3               # a's first reader: dead before a
        y = x * 2               # reached from a only through x (x's frontier)
        b = a + 1               # a's second reader: its storage dies unnoticed
        z = b * 2               # b's reader, so that b's death walks too
        node = {name: reg.node_of(t) for name, t in dict(a=a, x=x, y=y, b=b, z=z).items()}
        own = {name: n.cost for name, n in node.items()}
        assert all(cost > 0 for cost in own.values()), own
        del x
        reg.collect()
        assert node["x"].dead and math.isclose(node["y"].cost, own["y"] + own["x"])
        del b                   # freed first, so a's death is taken first: its walk meets b
        del a
        reg.collect()
        assert node["a"].dead and node["b"].dead
        want_y = own["y"] + own["x"] + own["a"]
        assert math.isclose(node["y"].cost, want_y), (node["y"].cost, want_y)
        want_z = own["z"] + own["b"] + own["a"]
        assert math.isclose(node["z"].cost, want_z), (node["z"].cost, want_z)
        assert node["y"].dead_bytes == node["a"].nbytes + node["x"].nbytes, node["y"].dead_bytes
        want = y.clone(), z.clone()
        reg.evict([node["y"].handle, node["z"].handle])
        assert torch.equal(y, want[0]) and torch.equal(z, want[1])


def _tanh_chain(x: torch.Tensor, length: int) -> torch.Tensor:
    """The end of ``length`` steps ``h = tanh(h * 1.01)`` from ``x``: each product dies at
    once and each tanh output is saved, so every other node of the chain is dead."""
    h = x
    for _ in range(length):
        h = torch.tanh(h * 1.01)
    return h


def a_replay_thousands_deep_fits_a_small_thread_stack() -> None:
    # Note [Deep replays] in registry/src/restore.cpp: a restore whose lineage is evicted
    # thousands of nodes deep brings it back in order instead of recursing through it. Each
    # recursive level took ~2.4 KB of stack: a residual MLP of 4,000 layers under recompute at
    # 0.55 of its peak crashed with a stack overflow. Here the chain is 2,000 nodes deep (every
    # other one dead) and the restore runs on a thread with a 1 MiB stack, which the recursion
    # overflowed (about 430 levels).
    import threading

    def run(evict: bool, out: dict) -> None:
        try:
            torch.manual_seed(0)
            x = torch.randn(64, 64, requires_grad=True)
            with pyalloc.recompute(min_bytes=0) as reg:
                h = _tanh_chain(x, 1000)
                out["want"] = h.detach().clone()
                before = reg.recomputes
                if evict:
                    reg.evict(list(reg.nodes))
                    assert reg.node_of(h).evicted
                out["got"] = h + 0              # rebuilt through 2,000 nodes
                out["recomputes"] = reg.recomputes - before
                h.sum().backward()
                out["grad"] = x.grad.clone()
        except BaseException as e:   # re-raised on the main thread
            out["error"] = e

    evicted, kept = {}, {}
    old = threading.stack_size(1 << 20)
    try:
        t = threading.Thread(target=run, args=(True, evicted))
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
    if "error" in evicted:
        raise evicted["error"]
    run(False, kept)
    if "error" in kept:
        raise kept["error"]
    assert torch.equal(evicted["got"], evicted["want"]), "the deep replay rebuilt other bits"
    assert evicted["recomputes"] >= 1000, evicted["recomputes"]
    assert kept["recomputes"] == 0 and torch.equal(evicted["grad"], kept["grad"])


def a_replay_past_the_nesting_limit_gives_up_and_leaves_the_step_intact() -> None:
    # Note [Deep replays]: a restore nested more than replay_give_up_ deep raises an
    # out-of-memory error that names the cause; the replays it unwinds through let go of
    # their pins, the tensors stay evicted with their lineage, and the step goes on when
    # memory allows. The limits are lowered so that a chain of 80 nodes reaches them. With
    # the in-order limit low instead, the same chain comes back without nesting at all.
    def run(evict_with) -> tuple:
        torch.manual_seed(0)
        x = torch.randn(64, 64, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            h = _tanh_chain(x, 40)
            want = h.detach().clone()
            failed = None
            if evict_with is not None:
                reg.evict(list(reg.nodes))
                with reg._replay_limits(*evict_with):
                    try:
                        h + 0
                    except torch.OutOfMemoryError as e:
                        failed = str(e)
                reg.check_invariants()
                pinned = [n for n in reg.nodes.values() if n.pins]
                assert not pinned, f"{len(pinned)} nodes still pinned after the error"
            got = h + 0
            h.sum().backward()
            return failed, want, got, x.grad.clone()

    _, want, got, grad = run(None)
    failed, want_e, got_e, grad_e = run((10 ** 6, 8))   # never in order; give up past 8
    assert failed is not None, "a replay nested 80 deep did not give up at 8"
    assert "nested 9 deep" in failed and "Raise the budget" in failed, failed
    assert torch.equal(got_e, want_e) and torch.equal(grad_e, grad), "the step after the error differs"
    failed, _, got_o, grad_o = run((2, 8))               # in order from 2: never nests past 3
    assert failed is None, failed
    assert torch.equal(got_o, want) and torch.equal(grad_o, grad)


def backward_model():
    """A small MLP with dropout, its input, and ``step(evict_in_backward, fail=False)``: a
    training step under ``recompute(min_bytes=0)`` whose hook, inside backward, may evict
    everything or raise; returns (gradients, what the hook saw, the registry's stats, the
    node of each kept gradient)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    x = torch.randn(512, 256)

    def step(evict_in_backward, fail=False):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        seen = {}
        with pyalloc.recompute(min_bytes=0) as reg:
            h = model[:3](x)

            def hook(grad):          # runs inside backward, between two of its ops
                node = reg.node_of(grad)
                seen["gradient is a node"] = node is not None and node.chain > 0
                if evict_in_backward:
                    reg.evict(list(reg.nodes))
                    seen["evicted"] = node.evicted
                if fail:
                    raise RuntimeError("stop")
                return grad

            h.register_hook(hook)
            loss = torch.nn.functional.log_softmax(model[3:](h), 1).mean()
            loss.backward()
            stats = reg.stats()
            kept = [reg.node_of(p.grad) for p in model.parameters()]
        return [p.grad.clone() for p in model.parameters()], seen, stats, kept

    return model, x, step


def what_backward_creates_is_evicted_and_recomputed_bit_for_bit() -> None:
    model, _, step = backward_model()
    want, seen, free_stats, _ = step(False)
    assert seen == {"gradient is a node": True}
    got, seen, stats, kept = step(True)
    assert seen == {"gradient is a node": True, "evicted": True}, seen
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert stats["backward_nodes"] > 0 and stats["recomputes"] > 0, stats
    # What the program keeps from backward (.grad) is its own again: resident, no node.
    assert kept == [None] * len(kept), kept
    assert stats["backward_kept"] > 0 and free_stats["backward_kept"] > 0, stats
    assert all(p.grad.untyped_storage().nbytes() > 0 for p in model.parameters())


def a_backward_that_raises_leaves_no_backward_nodes_behind() -> None:
    _, x, step = backward_model()
    want, _, _, _ = step(False)
    with pytest.raises(RuntimeError, match="stop"):
        step(True, fail=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        (x * 2).sum()                     # the first op outside a backward settles it
        alive = [n for n in reg.nodes.values() if not n.dead and n.chain > 0]
        assert not alive, [n.op for n in alive]
    pyalloc.check_invariants()
    got, _, _, kept = step(True)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert kept == [None] * len(kept)


def autograd_grad_results_are_the_programs() -> None:
    x = torch.randn(512, 256, requires_grad=True)
    w = torch.randn(256, 256, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        y = (x @ w).relu()
        gx, gw = torch.autograd.grad(y.square().sum(), (x, w))
        assert reg.node_of(gx) is None and reg.node_of(gw) is None
        reg.evict(list(reg.nodes))
        assert gx.untyped_storage().nbytes() > 0
    y = (x @ w).relu()
    want = torch.autograd.grad(y.square().sum(), (x, w))
    assert torch.equal(gx, want[0]) and torch.equal(gw, want[1])


def views_follow_their_storage() -> None:
    x = torch.randn(64, 128, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        y = torch.tanh(x)
        v = y.t()[3:9]                  # a view: same storage
        want = v.detach().clone()
        reg.evict(list(reg.nodes))
        assert v.untyped_storage().nbytes() == 0
        assert torch.equal(v, want)     # reading the view restores the whole storage
        assert torch.equal(y[:, 3:9].t(), want)


def every_view_of_an_evicted_tensor_restores_it_first() -> None:
    # Note [Views without boxing]: the views with kernels of their own on the registry's
    # key pin their source, restored first. `transpose`, `select` and the others that go
    # through as_strided fail its bounds check on an evicted storage (size 0) otherwise.
    views = {
        "view": lambda y: y.view(48, 10), "t": lambda y: y[0].t(),
        "transpose": lambda y: y.transpose(0, 2), "detach": lambda y: y.detach(),
        "alias": lambda y: torch.ops.aten.alias(y), "expand": lambda y: y[:, :1].expand(6, 4, 10),
        "permute": lambda y: y.permute(2, 0, 1), "unsqueeze": lambda y: y.unsqueeze(1),
        "squeeze": lambda y: y[:, :1].squeeze(), "squeeze_dim": lambda y: y[:, :1].squeeze(1),
        "select": lambda y: y.select(1, 3), "slice": lambda y: y[2:5],
        "as_strided": lambda y: y.as_strided((4, 4), (1, 8), 5),
        "unfold": lambda y: y.unfold(2, 3, 2), "diagonal": lambda y: y.diagonal(0, 1, 2),
        "split": lambda y: y.split(2)[1], "split_with_sizes": lambda y: y.split([1, 5])[1],
        "unbind": lambda y: y.unbind(0)[4],
    }
    x = torch.randn(6, 8, 10, requires_grad=True)
    for name, view in views.items():
        want = view(torch.tanh(x * 2))
        if want.requires_grad:  # all but detach
            (want * want).sum().backward()
        want_grad, x.grad = x.grad, None
        with pyalloc.recompute(min_bytes=0) as reg:
            y = torch.tanh(x * 2)
            assert reg.evict([reg.node_of(y).handle]) == 1 and reg.node_of(y).evicted, name
            got = view(y)
            assert not reg.node_of(y).evicted, name
            assert torch.equal(got, want), name
            if got.requires_grad:
                (got * got).sum().backward()
        assert (x.grad is None and want_grad is None) or torch.equal(x.grad, want_grad), name
        x.grad = None


def what_only_dead_lineage_reads_is_let_go_before_out_of_memory() -> None:
    # Found by helper D's spiking net (tools/user_programs/spiking_surrogate.py): each
    # timestep's input needs no grad, so it is no node, and the recorded matmul that reads it
    # keeps it as it is. After backward the readers are dead, but the registry lets dead
    # nodes go in batches (its death drain and sweep), and the engine's evict rung, finding
    # no victim, reported out of memory with 4.8 MiB of such inputs still held (here a 20 MiB
    # request fails without it). Now the rung
    # asks the registry to let go of what nothing uses first.
    import gc
    engine = pyalloc._engine(None)
    engine.set_budget(26 << 20)
    x = torch.rand(64, 784)
    w = torch.randn(784, 512, requires_grad=True)
    with pyalloc.recompute():
        out = 0
        for t in range(25):
            inp = (x * (t + 1)).sin()   # 196 KiB, no node
            out = out + inp @ w
        out.sum().backward()
        del out, inp
        gc.collect()
        more = torch.ones(20 << 18)     # 20 MiB: fits only once the inputs are let go
        assert more.sum().item() == 20 << 18
        del more
    engine.set_budget(2 << 30)


def what_a_sparse_tensor_wraps_comes_back_before_a_sparse_kernel_reads_it() -> None:
    # Note [Sparse arguments]: a node wrapped as a sparse tensor's values, evicted, then read
    # only through the sparse tensor (found with nn.Embedding(sparse=True) and SparseAdam,
    # whose gradient's values are made in backward). Kernels reach the values through the
    # SparseTensorImpl, with no op of their own: without the fix, "this tensor's memory was
    # evicted by the registry".
    torch.manual_seed(0)
    w = torch.randn(64, requires_grad=True)
    x = torch.randn(48, 64)
    coo = torch.stack([torch.randint(0, 100, (48,)), torch.randint(0, 32, (48,))])
    crow, col = torch.arange(0, 49), torch.randint(0, 32, (48,))
    wrap = {"coo": lambda v: torch.sparse_coo_tensor(coo, v, (100, 32)),
            "csr": lambda v: torch.sparse_csr_tensor(crow, col, v, (48, 32))}
    reads = {"coo": [lambda s: (s + s).coalesce()._values(), lambda s: s.t().to_dense()],
             "csr": [lambda s: s @ torch.ones(32, 3), lambda s: s.to_dense()]}
    for layout in ("coo", "csr"):
        for i, read in enumerate(reads[layout]):
            want = read(wrap[layout](torch.tanh(x @ w).detach()))
            with pyalloc.recompute(min_bytes=0) as reg:
                values = torch.tanh(x @ w)
                node = reg.node_of(values)
                sparse = wrap[layout](values)
                del values  # only the sparse tensor holds it now
                assert reg.evict([node.handle]) == 1 and node.evicted, (layout, i)
                got = read(sparse)
                assert torch.equal(got.detach(), want), (layout, i)


def a_sparse_product_of_an_activation_is_a_node_its_reader_does_not_hold() -> None:
    # Note [Sparse arguments]: a graph convolution, torch.sparse.mm(adj, lin(h)) + bias, with
    # an adjacency no part of which is a node. Before, an op that took a sparse tensor was
    # never recorded: the product was a plain tensor, and `+ bias`, which saves nothing, held
    # it as a leaf until the end of backward, where plain PyTorch frees it when the layer
    # returns (a GCN held two such products more at its peak than with no policy). Now the
    # product is a node, let go with its layer and rebuilt from adj when a replay needs it;
    # a write to adj in place settles it first.
    torch.manual_seed(0)
    N, D, L = 2048, 64, 3
    i = torch.randint(0, N, (2, 4 * N))
    adj = torch.sparse_coo_tensor(i, torch.rand(4 * N), (N, N)).coalesce()
    lins = [torch.nn.Linear(D, D, bias=False) for _ in range(L)]
    biases = [torch.zeros(D, requires_grad=True) for _ in range(L)]
    x = torch.randn(N, D)
    product_bytes = N * D * 4

    def forward():
        h = x
        for lin, b in zip(lins, biases):
            h = torch.relu(torch.sparse.mm(adj, lin(h)) + b)
        return h.square().mean()

    def grads():
        return [p.grad.clone() for lin in lins for p in lin.parameters()] + [b.grad.clone() for b in biases]

    def zero():
        for lin, b in zip(lins, biases):
            lin.zero_grad(set_to_none=True)
            b.grad = None

    def writes_to_adj(reg) -> None:
        # What was made from adj keeps adj's contents as read when adj is written in place,
        # its values (mul_) or the parts themselves (a sparse add_ replaces them).
        for write in (lambda: adj.mul_(2), lambda: adj.add_(adj)):
            a = lins[0](x)
            product = torch.sparse.mm(adj, a)
            node = reg.node_of(product)
            assert node is not None and node.chain > 0, "the product is no node with lineage"
            expected = product.detach().clone()
            assert reg.evict([node.handle]) == 1
            with torch.no_grad():
                write()
            assert torch.equal(product.detach(), expected)

    # Before: the forward held all 3 products more than plain PyTorch.
    _forward_held_then_replayed(forward, grads, zero, product_bytes, then=writes_to_adj)


def a_random_op_replays_inside_a_batched_backward() -> None:
    # Note [The registry's own ops]: autograd.grad(is_grads_batched=True) runs backward under
    # the legacy vmap mode, whose kernel for random ops raises; replaying an evicted dropout
    # mask there failed with "We do not yet support calling random operations inside of vmap".
    import torch.nn.functional as F
    x = torch.randn(8, 16)
    w = torch.randn(16, 16, requires_grad=True)

    def jacobian_rows(evict: bool) -> torch.Tensor:
        torch.manual_seed(1)
        with pyalloc.recompute(min_bytes=0) as reg:
            h = F.dropout(torch.tanh(x @ w), 0.5)
            out = (h * h).sum(1)
            if evict:
                assert reg.evict(list(reg.nodes)) > 0
            (rows,) = torch.autograd.grad(out, w, torch.eye(8), is_grads_batched=True)
            if evict:
                assert reg.recomputes > 0
        return rows

    assert torch.equal(jacobian_rows(False), jacobian_rows(True))


def bad_recompute_arguments_name_the_problem() -> None:
    from pyalloc import registry

    with pytest.raises(ValueError, match="cost must be"):
        with pyalloc.recompute(cost="flops"):
            pass
    with pytest.raises(ValueError, match="min_bytes"):
        with pyalloc.recompute(min_bytes=-1):
            pass
    registry.enable()
    with pytest.raises(RuntimeError, match="already on"):
        registry.enable()
    registry.disable()


def modifying_a_saved_tensor_in_place_is_still_an_error() -> None:
    x = torch.randn(300, 300, requires_grad=True)
    with pyalloc.recompute(min_bytes=0):
        y = x.exp()                     # exp saves its output
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def _settle_a_pass_without_room(policy: str, spill: bool = True) -> None:
    # The end of a backward pass restores its evicted survivors to settle them (w.grad
    # here); with no room it leaves them evicted, and that failure is the registry's own:
    # no on_oom callback, no count in num_ooms (Engine.tentative). Read later, with room
    # again, the gradient comes back bit for bit.
    torch.manual_seed(0)
    x = torch.randn(256, 256, requires_grad=True)
    w = torch.randn(256, 256, requires_grad=True)
    engine = pyalloc._engine(None)

    def step(starve):
        x.grad = w.grad = None
        fillers, seen = [], []
        with pyalloc.recompute(policy=policy, spill=spill) as reg:
            y = torch.tanh(x @ w)

            def starve_the_end_of_the_pass(param):
                # Everything out, w.grad's node among them, then every free byte taken,
                # under a budget with no room for another segment.
                assert reg.evict(list(reg.nodes)) > 0
                assert reg.node_of(param.grad) is not None and reg.node_of(param.grad).evicted
                engine.set_budget(int(pyalloc.memory_stats()["reserved_bytes.all.current"]))
                with pyalloc.Engine.tentative():
                    try:
                        while True:
                            fillers.append(torch.empty(1 << 14))
                    except torch.OutOfMemoryError:
                        pass

            if starve:
                w.register_post_accumulate_grad_hook(starve_the_end_of_the_pass)
            ooms = pyalloc.memory_stats()["num_ooms"]
            callback = pyalloc.on_oom(lambda report: seen.append(report["size"]))
            try:
                (y * y).sum().backward()
            finally:
                callback.remove()
            after = pyalloc.memory_stats()["num_ooms"]
            node = reg.node_of(w.grad)
            still_evicted = starve and node is not None and node.evicted
            # Its pass is over: no victim of last resort any more once back (Note
            # [Gradients bound for .grad]; it stayed one for good before).
            last_resort = still_evicted and node.last_resort
            fillers.clear()
            engine.set_budget(2 << 30)
            grads = [x.grad.clone(), w.grad.clone()]   # w.grad comes back here
            stats = reg.stats()
        return seen, after - ooms, still_evicted, last_resort, grads, stats

    _, _, _, _, want, _ = step(False)
    seen, ooms, still_evicted, last_resort, got, stats = step(True)
    assert still_evicted, "the end of the pass found room: the check did not starve it"
    assert not last_resort, "a gradient its pass left evicted stayed a victim of last resort"
    assert seen == [] and ooms == 0, (seen, ooms)
    if policy == "recompute" and not spill:
        assert stats["recomputes"] > 0, stats
    else:   # a bare node (swap), or one too dear to replay (recompute, spilled): only its
        # host copy holds its contents (Note [Survivors that stay evicted])
        assert stats["swap_ins"] > 0, stats
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def settling_a_pass_without_room_is_no_oom_of_the_programs() -> None:
    _settle_a_pass_without_room("recompute", spill=False)
    _settle_a_pass_without_room("recompute", spill=True)


def a_survivor_left_swapped_out_at_the_end_of_a_pass_comes_back() -> None:
    # Note [Survivors that stay evicted] in registry/src/backward.cpp: under swap the pass's
    # end forgot w.grad's node, evicted, with its host copy, and reading w.grad then failed.
    _settle_a_pass_without_room("swap")


def an_op_that_updates_state_it_reads_replays_from_the_state_it_read() -> None:
    """Quantization-aware training's fused observer and fake quantizer: one op updates its
    running min and max, computes a scale from them and quantizes its input with it. A
    replay that started from the state after the op would quantize with another scale."""
    torch.manual_seed(0)
    x = torch.randn(128, 1024) * 3
    w = torch.randn(1024, 1024, requires_grad=True)
    on = torch.ones(1, dtype=torch.long)

    def step(evict):
        w.grad = None
        # A running min and max from earlier batches: the update moves them (from the
        # first batch's infinities it would set them, and a second update would agree).
        state = [torch.tensor([-1.0]), torch.tensor([1.0]),
                 torch.ones(1), torch.zeros(1, dtype=torch.int32)]
        with pyalloc.recompute() as reg:
            h = x @ w
            q = torch.fused_moving_avg_obs_fake_quant(h, on, on, *state, 0.01, 0, 255, -1)
            node = reg.node_of(q)
            chain = node.chain if node is not None else 0
            want = q.detach().clone()
            if evict:
                assert reg.evict([node.handle]) == 1 and node.evicted
            got = q.detach().clone()          # replayed, from the state before the op
            (q * q).sum().backward()
            stats = reg.stats()
        return chain, want, got, w.grad.clone(), [t.clone() for t in state], stats

    chain, want, _, grad, state, _ = step(False)
    assert chain == 1, chain      # a node with lineage
    _, want2, got, grad2, state2, stats = step(True)
    assert stats["recomputes"] >= 1, stats
    assert torch.equal(want, want2) and torch.equal(want2, got)
    assert torch.equal(grad, grad2)
    assert all(torch.equal(a, b) for a, b in zip(state, state2))   # updated once, not twice


def a_gradient_backward_builds_from_a_fill_is_a_node_and_comes_back_bit_for_bit() -> None:
    """The gradient of a max over a dimension is zeros scattered with the incoming
    gradient, built inside backward by a fill and a write: a node with a chain of two
    (the fill, the write), evicted from a hook and replayed when the pass reads it."""
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    w = torch.randn(256, 4096, requires_grad=True)

    def step(evict):
        w.grad = None
        seen = {}
        with pyalloc.recompute() as reg:
            h = x @ w                                   # 64 x 4096: 1 MiB

            def hook(grad):                             # the gradient with respect to h
                node = reg.node_of(grad)
                seen["chain"] = node.chain if node is not None else 0
                if evict and node is not None:
                    seen["evicted"] = reg.evict([node.handle])
                return None

            h.register_hook(hook)
            values, _ = h.view(64, 16, 256).max(dim=1)
            (values * values).sum().backward()
            stats = reg.stats()
        return seen, w.grad.clone(), stats

    seen, want, _ = step(False)
    assert seen["chain"] == 2, seen                     # the fill, then the scatter
    seen, got, stats = step(True)
    assert seen.get("evicted") == 1 and stats["recomputes"] >= 1, (seen, stats)
    assert torch.equal(want, got)


def what_the_program_keeps_comes_back_before_a_write_to_what_made_it() -> None:
    """An evicted result the program keeps past the backward pass, made through a chain of
    dead activations each of which read a weight: the weight's write brings the result back
    (frozen) instead of rebuilding and keeping every dead reader of the weight."""
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    w = torch.randn(256, 256, requires_grad=True)

    def forward():
        h = x
        for _ in range(8):
            h = torch.tanh(h @ w)                     # eight reads of w, each 64 KiB
        return h * 2

    def step(evict):
        w.grad = None
        with pyalloc.recompute() as reg:
            out = forward()                           # kept by the program past backward
            want = out.detach().clone()
            out.sum().backward()                      # the chain behind `out` is dead now
            node = reg.node_of(out)
            if evict:
                assert reg.evict([node.handle]) == 1 and node.evicted
            with torch.no_grad():
                w.add_(w.grad, alpha=-0.1)            # the optimizer's write
            kept_dead = sum(1 for n in reg.nodes.values() if n.dead and n._info().data)
            state = (node.evicted, node.chain)
            got = out.detach().clone()
        return want, got, kept_dead, state

    want, got, kept_dead, state = step(False)
    assert torch.equal(want, got) and kept_dead == 0 and state == (False, 0), (kept_dead, state)
    want, got, kept_dead, state = step(True)
    assert state == (False, 0), state                 # back, and frozen (no lineage left)
    assert kept_dead == 0, kept_dead                  # no dead reader rebuilt and kept
    assert torch.equal(want, got)


def rebinding_what_an_activation_was_made_from_keeps_the_activation_as_made() -> None:
    """`x.data = other` (and `p.data = other` on a parameter) between forward and backward:
    the recorded op read the tensor `x`, whose storage the rebinding swaps without an op
    that writes it. An activation made from x must come back from what x held when it was
    made, as autograd's saved result would be, not from the new data."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)
    for rebind in ("input", "parameter"):
        x = torch.randn(128, 64)
        with pyalloc.recompute(min_bytes=0) as reg:
            keep = torch.relu(lin(x))                     # read x (an input) and lin.weight
            want = keep.detach().clone()
            assert reg.evict([reg.node_of(keep).handle]) == 1
            if rebind == "input":
                x.data = torch.randn(128, 64)
            else:
                lin.weight.data = torch.randn(64, 64)
            assert torch.equal(keep, want), rebind        # as made, not from the new data
        # A rebinding of what no recorded op read changes nothing.
        with pyalloc.recompute(min_bytes=0) as reg:
            y = torch.tanh(lin(x))
            want = y.detach().clone()
            assert reg.evict([reg.node_of(y).handle]) == 1
            unrelated = torch.randn(8)
            unrelated.data = torch.randn(8)
            assert reg.node_of(y).evicted and not reg.node_of(y).frozen
            assert torch.equal(y, want)


def a_parameter_freed_and_gathered_again_keeps_what_was_made_from_it() -> None:
    """FSDP's pattern: a layer's gathered parameter is freed after its forward
    (`untyped_storage().resize_(0)`, no op) and gathered again before its backward (resized,
    then written by an op). The write settles what was recorded from the parameter; that
    must not replay from the memory just reallocated (Note [Storages resized outside the
    dispatcher] in registry/src/restore.cpp)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(1024, 256)
    with pyalloc.recompute(min_bytes=0) as reg:
        h = torch.relu(lin(x))
        want = h.detach().clone()
        assert reg.evict([reg.node_of(h).handle]) == 1
        gathered = lin.weight.detach().clone()
        storage = lin.weight.untyped_storage()
        nbytes = storage.nbytes()
        storage.resize_(0)                            # freed after the layer's forward
        other = torch.full((256, 256), 3.0)           # takes the freed memory
        storage.resize_(nbytes)                       # gathered again: first the memory,
        with torch.no_grad():
            lin.weight.copy_(gathered)                # then the all-gather's write
        assert torch.equal(h, want)
        # An activation's own storage resized by the program: its readers come back first,
        # and it is the program's from then on (never evicted again).
        a = torch.tanh(lin(x))
        b = a * 2
        want_b = b.detach().clone()
        assert reg.evict([reg.node_of(b).handle]) == 1
        a.untyped_storage().resize_(0)
        assert torch.equal(b, want_b)
        assert reg.node_of(a) is None or reg.node_of(a).fixed
        del other


def a_storage_frozen_while_read_is_let_go_once_nothing_reads_it() -> None:
    """Note [Inputs a frozen node no longer reads] in registry/src/writes.cpp: the registry
    holds a frozen input while recorded ops read it, and must let go of it after. Two ways it
    did not: `numpy()` of an activation a recorded op read (its Python storage object made
    the program seem to hold it), and a reversible block's Function resizing its inputs'
    storages in backward, whose readers froze in turn. Each left 4 MiB a step allocated."""
    import gc

    def allocated() -> int:
        gc.collect()
        return pyalloc.memory_stats()["allocated_bytes.all.current"]

    class Reversible(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x1, x2):
            with torch.no_grad():
                y1 = x1 + torch.tanh(x2)
                y2 = x2 + torch.tanh(y1)            # reads the other output
            ctx.x = (x1.detach(), x2.detach())
            return y1, y2

        @staticmethod
        def backward(ctx, dy1, dy2):
            for t in ctx.x:                         # a no-op resize, as memory-saving code does
                t.untyped_storage().resize_(t.untyped_storage().nbytes())
            del ctx.x
            return dy1, dy2

    a = torch.randn(1 << 20, requires_grad=True)    # 4 MiB
    for policy in ("recompute", "swap"):
        with pyalloc.recompute(min_bytes=0, policy=policy, host_pool=64 << 20) as reg:
            left = []
            for _ in range(3):
                base = allocated()
                x = a * 2.0
                with torch.no_grad():
                    y = torch.tanh(x)               # a recorded op reads x
                x.detach().numpy()                  # x is frozen and fixed while y reads it
                del x, y
                reg.collect()
                left.append(allocated() - base)
            assert left == [0, 0, 0], (policy, left)
            left = []
            for _ in range(4):
                base = allocated()
                x1, x2 = a * 1.0, a * 0.5
                for _ in range(3):
                    x1, x2 = Reversible.apply(x1, x2)
                (x1.sum() + x2.sum()).backward()
                del x1, x2
                a.grad = None
                reg.collect()
                left.append(allocated() - base)
            assert left[1:] == [0, 0, 0], (policy, left)
            reg.check_invariants()


def a_conjugate_view_replays_conjugated() -> None:
    """`x.conj()` is a view with a lazy conjugate bit, `x.conj().imag` one with a negative
    bit: ops below the registry read them conjugated or negated. A replay rebuilt such an
    argument without its bit, so under recompute `c.conj() * w` came back as `c * w`, and a
    complex network's weight gradients (autograd's mm backward reads `saved.conj()`) were
    wrong, silently (Ref::conj and Ref::neg in registry/src/node.h)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 512)
    w = torch.nn.Parameter(torch.randn(256, dtype=torch.cfloat))
    x = torch.randn(1024, 512)

    def made_from_conjugate_views():
        c = torch.view_as_complex(lin(x).view(-1, 256, 2))
        return [c.conj() * w,                         # the conjugate bit
                c.conj().imag * w.real,               # the negative bit
                torch.view_as_complex(lin(x).view(-1, 256, 2)).conj() @ torch.eye(
                    256, dtype=torch.cfloat)]         # a conjugated matmul operand

    def backward(made):
        sum(t.real.sum() + t.imag.sum() if t.is_complex() else t.sum() for t in made).backward()

    with pyalloc.recompute(min_bytes=0) as reg:
        made = made_from_conjugate_views()
        want = [t.detach().clone() for t in made]
        assert reg.evict([reg.node_of(t).handle for t in made]) == len(made)
        for t, expected in zip(made, want):
            assert torch.equal(t, expected)
        backward(made)
        grads = (lin.weight.grad.clone(), w.grad.clone())
    lin.weight.grad = w.grad = None
    backward(made_from_conjugate_views())            # plain PyTorch's gradients
    assert torch.equal(grads[0], lin.weight.grad) and torch.equal(grads[1], w.grad)


def a_buffer_assembled_step_by_step_in_forward_stays_recomputable() -> None:
    """`out[t] = h` in a hand-written RNN writes a buffer once per timestep: longer than a
    chain may grow in backward, yet each step is a copy, cheap to replay (Note [How long a chain may grow] in registry/src/registry.cpp). Before, the
    ninth write froze the buffer, which then could never leave under recompute."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    cell = torch.nn.RNNCell(64, 64)
    lstm = torch.nn.LSTM(64, 64, batch_first=True)
    x = torch.randn(20, 32, 64)
    with pyalloc.recompute(min_bytes=0) as reg:
        h = cell(x[0])                        # (a buffer filled before the step's first
        out = torch.zeros(20, 32, 64)         # activation is taken for a parameter's)
        out[0] = h
        for t in range(1, 20):
            h = cell(x[t], h)
            out[t] = h
        packed = pack_padded_sequence(x.transpose(0, 1), torch.arange(20, 4, -1)[:16].repeat(2),
                                      batch_first=True, enforce_sorted=False)
        padded, _ = pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=20)
        node = reg.node_of(out)
        assert node is not None and not node.frozen and node.chain == 21, node.chain   # the fill and 20 writes
        assert reg.node_of(padded) is not None and not reg.node_of(padded).frozen
        want, want_padded = out.detach().clone(), padded.detach().clone()
        assert reg.evict([reg.node_of(out).handle, reg.node_of(padded).handle]) == 2
        assert torch.equal(out, want) and torch.equal(padded, want_padded)
        (out.sum() + padded.sum()).backward()
        reg.check_invariants()


def a_mask_made_from_the_batch_is_let_go_when_its_layer_returns() -> None:
    # Note [What plain inputs derive]: a mask built per layer from the batch's padding reads
    # nothing that requires grad. Before, the op that read it held it as a leaf for as long
    # as the lineage after it lived (to the end of backward); plain PyTorch frees it when
    # the layer returns. Now it is a node, let go with the layer and rebuilt from the padding
    # when a replay needs it.
    torch.manual_seed(0)
    B, S, D, L = 8, 64, 32, 4
    lins = [torch.nn.Linear(D, D) for _ in range(L)]
    lens = torch.randint(S // 2, S + 1, (B,))
    padding = (torch.arange(S)[None, :] < lens[:, None])[:, None, :].expand(B, S, S).contiguous()
    x = torch.randn(B, S, D, requires_grad=True)
    mask_bytes = B * S * S * 4

    def forward():
        h = x
        for lin in lins:
            mask = torch.where(padding, 0.0, -1e9)    # (B, S, S) float, per layer
            s = h @ h.transpose(1, 2) + mask          # the add saves nothing: s and mask die
            h = lin(s.softmax(-1) @ h)
        return h.square().mean()

    def grads():
        return [x.grad.clone()] + [p.grad.clone() for lin in lins for p in lin.parameters()]

    def zero():
        x.grad = None
        for lin in lins:
            lin.zero_grad(set_to_none=True)

    def masks_rebuilt(reg) -> None:
        replays = reg.replays_by_op()
        assert any(op.startswith("aten::where") for op in replays), replays

    # Before: the forward held all 4 masks more than plain PyTorch.
    _forward_held_then_replayed(forward, grads, zero, mask_bytes, then=masks_rebuilt)


def a_copy_kept_across_iterations_keeps_no_earlier_iteration_behind_it() -> None:
    # Note [Lineage that outlives its iteration] (registry/src/backward.cpp): an exponential
    # moving average of a layer's output, kept across iterations out of place, was a node
    # whose lineage ran back through every earlier iteration, holding each one's input
    # batch: 0.5 MiB more allocated every step, without end (with grad mode on since Note
    # [What plain inputs derive]; under no_grad before it).
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 512)
    batches = [torch.randn(256, 512) for _ in range(12)]

    def train(grad_mode: bool, policy: bool):
        running = torch.zeros(256, 512)
        held = []
        with (pyalloc.recompute() if policy else contextlib.nullcontext()) as reg:
            for i, x in enumerate(batches):
                with torch.no_grad():
                    x = x.clone()                         # a batch that is no node
                h = torch.tanh(lin(x))
                with torch.set_grad_enabled(grad_mode):
                    running = running * 0.9 + h.detach() * 0.1
                h.sum().backward()
                del x, h
                held.append(_allocated())
            if policy:
                reg.collect()  # the deaths not drained yet
            nodes = len(reg.nodes) if policy else 0
        lin.zero_grad(set_to_none=True)
        return running, held, nodes

    for grad_mode in (True, False):
        want, _, _ = train(grad_mode, policy=False)
        got, held, nodes = train(grad_mode, policy=True)
        assert torch.equal(got, want), grad_mode
        assert held[-1] <= held[3], (grad_mode, held)   # before: + 0.5 MiB an iteration
        assert nodes <= 8, (grad_mode, nodes)


def a_reversible_network_keeps_no_lineage_heavier_than_what_it_frees() -> None:
    # Note [Lineage that holds more than it can free] (registry/src/backward.cpp): a
    # reversible network (tools/user_programs/revnet_free.py, as memcnn and revlib write
    # them) frees its blocks' inputs by hand and rebuilds them in backward, where each block
    # runs backward passes of its own and hands the gradient on. That gradient's lineage ran
    # back through every block's backward, keeping each block's restored outputs and summed
    # gradients: 68 MiB allocated at the peak under recompute against 39 MiB with no policy.
    torch.manual_seed(0)
    ch, blocks = 16, 6

    def free(t: torch.Tensor) -> None:
        t.untyped_storage().resize_(0)

    def refill(t: torch.Tensor, value: torch.Tensor) -> None:
        t.untyped_storage().resize_(value.numel() * value.element_size())
        with torch.no_grad():
            t.copy_(value)

    class Reversible(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x1, x2, f, g):
            ctx.f, ctx.g = f, g
            with torch.no_grad():
                y1 = x1 + f(x2)
                y2 = x2 + g(y1)
            ctx.x = (x1.detach(), x2.detach())
            free(x1)
            free(x2)
            ctx.y = (y1.detach(), y2.detach())
            return y1, y2

        @staticmethod
        def backward(ctx, dy1, dy2):
            y1, y2 = ctx.y
            with torch.enable_grad():
                y1_ = y1.detach().requires_grad_()
                gy = ctx.g(y1_)
                torch.autograd.backward(gy, dy2)
            with torch.no_grad():
                x2 = y2 - gy
            with torch.enable_grad():
                x2_ = x2.detach().requires_grad_()
                fx = ctx.f(x2_)
                dy1_total = dy1 + y1_.grad
                torch.autograd.backward(fx, dy1_total)
            with torch.no_grad():
                x1 = y1 - fx
                dx2 = dy2 + x2_.grad
            refill(ctx.x[0], x1)
            refill(ctx.x[1], x2)
            del ctx.x, ctx.y
            return dy1_total, dx2, None, None

    def branch() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.GroupNorm(4, ch), torch.nn.ReLU(),
                                   torch.nn.Conv2d(ch, ch, 3, padding=1))

    fs = torch.nn.ModuleList(branch() for _ in range(blocks))
    gs = torch.nn.ModuleList(branch() for _ in range(blocks))
    params = list(fs.parameters()) + list(gs.parameters())
    batches = [torch.randn(8, 2 * ch, 32, 32) for _ in range(2)]

    def train(policy: bool):
        grads, peaks = [], []
        with pyalloc.recompute() if policy else contextlib.nullcontext():
            for x in batches:
                x1, x2 = (t.contiguous() for t in (x * 1.0).requires_grad_().chunk(2, 1))
                pyalloc.reset_peak_memory_stats()
                for f, g in zip(fs, gs):
                    x1, x2 = Reversible.apply(x1, x2, f, g)
                (x1.square().sum() + x2.sum()).backward()
                peaks.append(pyalloc.memory_stats()["allocated_bytes.all.peak"])
                grads.append([p.grad.clone() for p in params])
                for p in params:
                    p.grad = None
                del x1, x2
        return grads, max(peaks)

    want, plain_peak = train(policy=False)
    got, peak = train(policy=True)
    for w, g in zip(want, got):
        assert all(torch.equal(a, b) for a, b in zip(w, g))
    block = batches[0].numel() * 4 // 2  # one half of the batch: a block's input or output
    # Before: about 3 blocks' worth more for each block of the network.
    assert peak <= plain_peak + 2 * block, (peak, plain_peak, block)


def what_a_dead_nodes_recording_kept_goes_with_its_death() -> None:
    # Note [Deaths worth a drain] (registry/src/liveness.cpp): a no_grad solver loop that
    # mixes an activation into each iterate (deep equilibrium models) records `relu(tmp + xi)`
    # with `tmp`, no node, kept by the recording. The node and `tmp` die the next iteration;
    # the recording went only with a batch of 16 deaths, so eight iterations' `tmp`s stayed.
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 32, 3, padding=1)
    x = torch.randn(32, 32, 16, 16)
    tmp_bytes = x.numel() * 4

    def solve(policy: bool):
        with pyalloc.recompute() if policy else contextlib.nullcontext():
            xi = conv(x)                              # an activation: a node
            base, over = _allocated(), []
            with torch.no_grad():
                hist = torch.zeros(32, 4, 32 * 16 * 16)
                z = torch.zeros(32, 32, 16, 16)
                for k in range(20):
                    tmp = z + conv(z)                 # reads no node: no node
                    out = torch.relu(tmp + xi)        # reads xi: recorded, keeping `tmp`
                    del tmp
                    hist[:, k % 4] = out.reshape(32, -1)
                    z = hist[:, k % 4].view(32, 32, 16, 16)
                    del out
                    over.append(_allocated() - base)
            return z.clone(), max(over)

    want, plain = solve(policy=False)
    got, held = solve(policy=True)
    assert torch.equal(got, want)
    assert held <= plain + tmp_bytes, (held, plain, tmp_bytes)   # before: 8 more `tmp`s


def a_step_of_several_backward_passes_holds_none_of_its_own_activations() -> None:
    # Note [Lineage that outlives its iteration] (registry/src/backward.cpp): a step that
    # runs three backward passes (autograd.grad and a backward with retain_graph, then a
    # last backward) counted as three iterations, so at its second pass's end its own
    # forward's dead nodes (a convolution's output) were two iterations old and their live
    # dependent, the ReLU's output the retained graph still saved, was frozen. A max-pool's
    # recording read it, and the pooled map the program kept held it for that reader
    # (tools/user_programs/grad_taps.py: +5 MiB at the end of the run over no policy).
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 32, 3, padding=1)
    head = torch.nn.Linear(32 * 16 * 16, 10)
    batches = [torch.randn(16, 8, 32, 32) for _ in range(3)]
    act_bytes = 16 * 32 * 32 * 32 * 4                     # the ReLU's output: 2 MiB

    def allocated() -> int:
        gc.collect()
        return pyalloc.memory_stats()["allocated_bytes.all.current"]

    def train(policy: bool):
        out = []
        with (pyalloc.recompute() if policy else contextlib.nullcontext()) as reg:
            base = allocated()
            for x in batches:
                a = torch.relu(conv(x))                   # conv's output dies here
                p = torch.nn.functional.max_pool2d(a, 2)  # the program keeps it
                y = head(p.flatten(1))
                g, = torch.autograd.grad(y.sum(), p, retain_graph=True)
                y.square().sum().backward(retain_graph=True)
                y.sum().backward()                        # the graph goes, and `a` with it
                out += [g.sum(), conv.weight.grad.clone(), head.weight.grad.clone()]
                conv.zero_grad(set_to_none=True)
                head.zero_grad(set_to_none=True)
                del a, y, g
            if policy:
                reg.collect()  # the deaths not drained yet
            held = allocated() - base
            out.append(p.detach().clone())
        return out, held

    want, plain = train(policy=False)
    got, held = train(policy=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert held <= plain + act_bytes // 2, (held, plain, act_bytes)   # before: + act_bytes


class _Wrapper(torch.Tensor):
    """A `__torch_dispatch__` subclass that keeps a plain tensor inside and runs every op on
    it, as torchao's float8 tensors keep their data: defined before install()."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype,
                                                   device=data.device)

    def __init__(self, data):
        self._data = data

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map
        unwrap = lambda t: t._data if isinstance(t, _Wrapper) else t  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


def what_a_subclass_keeps_inside_comes_back_before_its_ops_read_it() -> None:
    # Note [Storage access around the dispatcher] in pyalloc/registry.py: a subclass's own
    # ops run on its inner tensors below the registry's key. Before, an op on a subclass
    # holding an evicted activation read it where it was not (the evicted-memory error).
    class Flattened(torch.Tensor):   # defined under the policy, with __tensor_flatten__
        @staticmethod
        def __new__(cls, data, scale):
            return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype,
                                                       device=data.device)

        def __init__(self, data, scale):
            self._data, self._scale = data, scale

        def __tensor_flatten__(self):
            return ["_data", "_scale"], None

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            from torch.utils._pytree import tree_map
            unwrap = lambda t: t._data * t._scale if isinstance(t, Flattened) else t  # noqa: E731
            return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

    x = torch.randn(256, 256, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        a = torch.tanh(x * 2)                    # activations: nodes
        b = torch.sigmoid(x * 3)
        plain, flat = _Wrapper(a.detach()), Flattened(b.detach(), (x * 0.5).detach())
        want_plain, want_flat = (plain + 1).sum(), (flat * 2).sum()
        for t in (a, b):
            assert reg.evict([reg.node_of(t).handle]) == 1
        assert torch.equal((plain + 1).sum(), want_plain)
        assert torch.equal((flat * 2).sum(), want_flat)
        assert reg.recomputes >= 2
    # Outside the policy the classes run their own __torch_dispatch__ again.
    for cls in (_Wrapper, Flattened):
        assert not getattr(cls.__dict__["__torch_dispatch__"].__func__, "__pyalloc_holds__", False)


def _report_of_a_request_past_what_is_free(extra: int = 512 << 10) -> str:
    """The out-of-memory report of a request ``extra`` bytes larger than what is free, under a
    budget of what is reserved now (so no segment can be added)."""
    engine = pyalloc._engine(None)
    stats = pyalloc.memory_stats()
    reserved = stats["reserved_bytes.all.current"]
    engine.set_budget(reserved)
    try:
        with pytest.raises(torch.OutOfMemoryError) as oom:
            torch.empty(reserved - stats["allocated_bytes.all.current"] + extra, dtype=torch.uint8)
    finally:
        engine.set_budget(2 << 30)
    return str(oom.value)


def a_tangent_forward_mode_ad_makes_leaves_as_a_host_copy() -> None:
    # Note [Tangents forward-mode AD makes] in registry/src/dispatch.cpp: an op on a dual
    # tensor computes its tangent in autograd's layer, inside the op the registry runs; the
    # tangents were never nodes and a conv net with a JVP regulariser ran out of memory
    # under every policy with nothing evictable. Under swap and hybrid, and under recompute
    # with a host pool, they are nodes without lineage now, which leave and come back bit for
    # bit. With spill off they stay, and an out-of-memory report says so.
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(0)
    w = torch.randn(256, 256, requires_grad=True)
    x, v = torch.randn(128, 256), torch.randn(128, 256)

    def run(reg):
        with fwAD.dual_level():
            h = fwAD.make_dual(x, v) @ w
            out = torch.tanh(torch.nn.functional.layer_norm(h, (256,))) * 2.0
            p, t = fwAD.unpack_dual(out)
            if reg is not None:
                nodes = [reg.node_of(fwAD.unpack_dual(o).tangent) for o in (h, out)]
                assert all(n is not None for n in nodes), nodes
                assert reg.evict(list(reg.nodes)) >= 2
        loss = p.sum() + t.pow(2).mean()
        g, = torch.autograd.grad(loss, w)
        return loss.detach(), g

    want = run(None)
    for policy in ("swap", "hybrid", "recompute"):
        with pyalloc.recompute(min_bytes=0, policy=policy, host_pool=64 << 20) as reg:
            got = run(reg)
            assert reg.swap_outs >= 2, reg.swap_outs
            reg.check_invariants()
        assert all(torch.equal(a, b) for a, b in zip(got, want)), policy

    with pyalloc.recompute(min_bytes=0, spill=False):   # the report says why they stay
        with fwAD.dual_level():
            h = fwAD.make_dual(x, v) @ w
            message = _report_of_a_request_past_what_is_free()
    assert "forward-mode AD (dual tensors)" in message and "option spill" in message, message


def an_efficient_zero_tensor_is_no_node() -> None:
    # Note [Efficient zero tensors] in registry/src/node.h: a zero tensor (what forward-mode
    # AD's formulas use for an undefined tangent) has a storage with no memory behind it. It
    # became a node, and the replay of what read it rebuilt it as a plain tensor over a null
    # pointer: torch.func.jvp of `h * 2.0` segfaulted in backward under recompute.
    x = torch.randn(64, 64, requires_grad=True)

    def f():
        zero = torch.tanh(x * 2) * torch._efficientzerotensor(())    # a zero tensor again
        return zero + torch.sin(x), zero

    with torch.no_grad():
        want = f()[0]
    with pyalloc.recompute(min_bytes=0) as reg:
        got, zero = f()
        assert zero._is_zerotensor() and reg.node_of(zero) is None
        assert reg.evict(list(reg.nodes)) >= 1
        assert torch.equal(got * 1, want)
        w = torch.randn(16, 16, requires_grad=True)
        p, t = torch.func.jvp(lambda i: (i @ w) * 2.0, (torch.randn(8, 16),), (torch.randn(8, 16),))
        reg.evict(list(reg.nodes))
        (p.sum() + t.pow(2).sum()).backward()          # replays the tangent's add
        assert w.grad is not None and reg.recomputes >= 2
        reg.check_invariants()


def a_composite_op_on_a_vmap_wrapper_makes_no_node_inside() -> None:
    # Note [Composite ops on wrappers] in registry/src/dispatch.cpp: legacy vmap (which
    # autograd.grad(is_grads_batched=True) runs backward under) ran a composite op's pieces,
    # `stack` included, with the registry's key on: the stacked storage became a node inside
    # a BatchedTensor, and the next batching rule read it evicted.
    import warnings
    from torch._vmap_internals import _vmap
    x = torch.randn(4, 64, 64, requires_grad=True)

    def vmapped(evict: bool) -> torch.Tensor:
        with pyalloc.recompute(min_bytes=0) as reg, warnings.catch_warnings():
            warnings.simplefilter("ignore")

            def f(t):
                d = torch.diff(t, dim=0)             # composite
                if evict:
                    reg.evict(list(reg.nodes))
                return d * 2

            return _vmap(f)(x * 1).detach()

    assert torch.equal(vmapped(False), vmapped(True))
    z = torch.randn(16, 32, 8, requires_grad=True)

    def penalty(evict: bool) -> torch.Tensor:
        with pyalloc.recompute(min_bytes=0) as reg:
            a = z * 2
            c = torch.cummax(a, dim=1).values * a
            if evict:
                c.register_hook(lambda g: (reg.evict(list(reg.nodes)), None)[1])
            (gz,) = torch.autograd.grad(c.mean((1, 2)), z, torch.eye(16)[:4],
                                        is_grads_batched=True)
            return gz

    # cummax's backward scatters its gradient with atomic adds on CUDA, so two plain runs
    # differ in the last bits there; deterministic mode makes every run add in one order.
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.equal(penalty(False), penalty(False))
        assert torch.equal(penalty(False), penalty(True))
    finally:
        torch.use_deterministic_algorithms(deterministic)


def an_out_of_memory_report_names_what_recompute_can_no_longer_rebuild() -> None:
    # Note [What the registry adds to a report] in registry/src/inspect.cpp: FSDP2 under
    # recompute ran out of memory with 47 MiB of frozen activations and a report that blamed
    # fragmentation.
    engine = pyalloc._engine(None)
    with pyalloc.recompute(min_bytes=0, spill=False) as reg:
        p = torch.randn(1024, 1024, requires_grad=True)   # a gathered parameter, 4 MiB
        acts = [torch.tanh(p * (i + 1)) for i in range(3)]  # 12 MiB made from it
        assert all(not reg.node_of(a).frozen for a in acts)
        p.untyped_storage().resize_(0)                     # FSDP's reshard: frees it
        assert all(reg.node_of(a).frozen for a in acts)
        engine.set_budget(pyalloc.memory_stats()["reserved_bytes.all.current"])
        reports = []
        handle = pyalloc.on_oom(reports.append)
        try:
            with pytest.raises(torch.OutOfMemoryError) as oom:
                torch.empty(64 << 20, dtype=torch.uint8)
        finally:
            handle.remove()
            engine.set_budget(2 << 30)
        line = "registry: 12.00 MiB in 3 activations can no longer be recomputed"
        message = str(oom.value)
        assert line in message
        assert "reshard_after_forward=False" in message and "option spill" in message
        # The same line reaches what a framework's observer and a later look at the
        # snapshot read (FSDP2's on_oom dict had lacked it).
        assert len(reports) == 1 and line in reports[0]["report"], reports
        assert line in engine.last_oom_snapshot()["oom"]["report"]
        del acts


def an_out_of_memory_report_names_gradients_backward_froze() -> None:
    # Gradients a backward pass froze (a buffer autograd summed into more than eight times:
    # Note [How long a chain may grow] in registry/src/registry.cpp) are named as such, not as
    # activations whose inputs the program wrote (the remedy that line gives does not apply).
    engine = pyalloc._engine(None)
    x = torch.randn(512, 1024, requires_grad=True)
    messages = []
    with pyalloc.recompute(min_bytes=0, spill=False) as reg:   # with spill, they could leave
        h = x * 2                                           # 2 MiB; its gradient is summed
        parts = [h[:, 64 * i:64 * (i + 1)].tanh() for i in range(16)]   # from 16 slices

        def starve(grad):  # h's gradient is complete: the buffer, written 16 times
            assert reg.node_of(grad) is not None and reg.node_of(grad).frozen
            engine.set_budget(pyalloc.memory_stats()["reserved_bytes.all.current"])
            try:
                with pytest.raises(torch.OutOfMemoryError) as oom:
                    torch.empty(64 << 20, dtype=torch.uint8)
            finally:
                engine.set_budget(2 << 30)
            messages.append(str(oom.value))
            return grad

        h.register_hook(starve)
        sum(p.sum() for p in parts).backward()
    assert len(messages) == 1
    assert "registry: 2.00 MiB in 1 gradients this backward pass made cannot be recomputed" in \
        messages[0], messages[0]
    assert "activations can no longer be recomputed" not in messages[0], messages[0]


def an_out_of_memory_report_names_tensors_too_small_to_evict() -> None:
    # A recurrent network with a small batch and hidden size makes only tensors below
    # min_evictable (16 KiB here, set by the test; 1 KiB by default): nothing is evictable,
    # and the hint blamed fragmentation. It names them and the option that lets them leave
    # (allocator/src/oom_report.cpp).
    x = torch.randn(32, 32, requires_grad=True)          # 4 KiB
    with pyalloc.recompute():
        states = [x]
        for _ in range(1000):                            # 4 MiB of 4 KiB activations
            states.append(torch.tanh(states[-1] * 1.01))
        message = _report_of_a_request_past_what_is_free()
    assert "tensors smaller than min_evictable (16.00 KiB), which no policy evicts" in message, message
    assert "PYALLOC_MIN_EVICTABLE" in message, message
    del states


def an_out_of_memory_report_names_segments_kept_by_tensors_too_small_to_evict() -> None:
    # A packed LSTM on the CPU makes each timestep's gates (evictable) beside its small
    # states (below min_evictable, never evicted nor moved): every 2 MiB segment held a few,
    # so no segment could be emptied, and a 5 MiB request failed at 0.9 of the program's peak
    # with 36 MiB evictable. The hint blamed fragmentation; lowering min_evictable as it now
    # says let the program train (allocator/src/oom_report.cpp). With min_evictable 16 KiB
    # (set by the test), the default before it became 1 KiB.
    engine = pyalloc._engine(None)
    x = torch.randn(128, 128, requires_grad=True)       # 64 KiB
    with pyalloc.recompute():
        h, small = x, []
        for _ in range(160):                             # 10 MiB of evictable activations
            h = torch.tanh(h * 1.01)
            small.append(h[:8] * 2)                      # 4 KiB beside each, kept
        stats = pyalloc.memory_stats()
        reserved = stats["reserved_bytes.all.current"]
        engine.set_budget(reserved)
        try:   # a large request: no segment can be emptied and the budget is spent
            with pytest.raises(torch.OutOfMemoryError) as oom:
                torch.empty(4 << 20, dtype=torch.uint8)
        finally:
            engine.set_budget(2 << 30)
    message = str(oom.value)
    assert "hold nothing but free or evictable bytes and" in message, message
    assert "tensors smaller than min_evictable (16.00 KiB), which no policy evicts or moves" in message, message
    assert "PYALLOC_MIN_EVICTABLE" in message, message
    del small, h


def what_a_scripted_differentiable_graph_saves_is_a_node_and_comes_back_bit_for_bit() -> None:
    # Note [A detached parameter is still a parameter] in registry/src/registry.cpp: from its
    # second call TorchScript's profiling executor runs a scripted model's differentiable
    # subgraph on detached inputs, parameters included, so nothing it made was a node.
    class Cell(torch.jit.ScriptModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(512, 256) * 0.05)
            self.b = torch.nn.Parameter(torch.zeros(512))

        @torch.jit.script_method
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.mm(x, self.w.t()) + self.b
            return torch.sigmoid(h) * torch.tanh(h)

    cell = Cell()
    x = torch.randn(128, 256)   # 128 KiB in; 256 KiB a result, no more than the weight

    with pyalloc.recompute() as reg:
        def step(evict: bool):
            cell.w.grad = cell.b.grad = None
            before = set(reg.nodes)
            y = cell(x)
            made = [h for h in reg.nodes if h not in before]
            evicted = reg.evict(made) if evict else 0
            (y * y).sum().backward()
            return cell.w.grad.clone(), cell.b.grad.clone(), made, evicted

        for _ in range(3):   # profiled, then specialized
            step(False)
        graph = str(torch.jit.last_executed_optimized_graph())
        assert "DifferentiableGraph" in str(cell.graph_for(x)), graph
        want_w, want_b, made, _ = step(False)
        assert len(made) >= 4, [reg.nodes[h].op for h in made]
        got_w, got_b, _, evicted = step(True)
        assert evicted >= 2, evicted
    assert torch.equal(want_w, got_w) and torch.equal(want_b, got_b)


@torch.jit.script
def _scripted_cell(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * y + 1.0) * torch.sigmoid(y)


def torchscript_fuses_nothing_while_a_policy_runs() -> None:
    # Note [TorchScript fusion under a policy] in pyalloc/registry.py: a fusion group's
    # kernel reads its inputs by data pointer, out of the registry's sight.
    C = torch._C
    C._jit_override_can_fuse_on_cpu(True)        # the program's choice, before the policy
    C._jit_set_te_must_use_llvm_cpu(False)       # NNC's CPU fuser without LLVM
    try:
        x = torch.randn(256, 256, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            assert not C._jit_can_fuse_on_cpu() and not C._jit_texpr_fuser_enabled()
            h = x * 2                            # a node
            hd = h.detach()                      # an input that requires no grad
            with torch.no_grad():
                for _ in range(3):               # profiled, then optimized
                    want = _scripted_cell(hd, hd)
                graph = str(torch.jit.last_executed_optimized_graph())
                assert "TensorExprGroup" not in graph, graph
                assert reg.evict([reg.node_of(h).handle]) == 1
                assert hd.untyped_storage().nbytes() == 0
                got = _scripted_cell(hd, hd)     # each op restores what it reads
            assert torch.equal(got, want)
        assert C._jit_can_fuse_on_cpu() and C._jit_texpr_fuser_enabled()   # as they were
    finally:
        C._jit_override_can_fuse_on_cpu(False)


def an_out_of_memory_error_inside_a_replay_says_what_the_replay_pins() -> None:
    # Note [What the registry adds to a report] in registry/src/inspect.cpp: a request that
    # fails inside a replay was blamed on fragmentation (wav2vec2 under recompute at 0.4).
    # With spill off, so that the report names it as the remedy.
    engine = pyalloc._engine(None)
    with pyalloc.recompute(min_bytes=0, spill=False) as reg:
        x = torch.randn(2048, 2048, requires_grad=True)   # 16 MiB, a leaf
        a = torch.tanh(x * 2)                             # 16 MiB each: nodes
        b = torch.sigmoid(a)
        assert reg.evict([reg.node_of(b).handle, reg.node_of(a).handle]) == 2
        engine.empty_cache()
        engine.set_budget(pyalloc.memory_stats()["reserved_bytes.all.current"] + (17 << 20))
        try:
            with pytest.raises(torch.OutOfMemoryError) as oom:
                # b's restore rebuilds a, whose own restore rebuilds the dead x * 2 first:
                # two replays deep, x * 2 pinned while tanh asks for 16 MiB more.
                b + 1
        finally:
            engine.set_budget(2 << 30)
        message = str(oom.value)
        assert "registry: the request came from a replay 2 deep" in message, message
        assert "16.00 MiB in 1 activations are pinned" in message, message
        assert "the option spill (off here; on by default) sends a victim" in message, message
        assert torch.equal(b, torch.sigmoid(torch.tanh(x * 2)))   # and it trains on


def what_a_subclass_op_returns_inside_leaves_under_swap_and_comes_back() -> None:
    # Note [What a subclass's results keep inside] in registry/src/registry.cpp: a jagged
    # nested tensor's values, made by its own ops below the registry, were never nodes.
    from torch.utils._pytree import tree_map

    class Boxed(_Wrapper):   # as _Wrapper, but its results are Boxed too
        def __tensor_flatten__(self):
            return ["_data"], None

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda t: t._data if isinstance(t, Boxed) else t  # noqa: E731
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
            return tree_map(lambda t: Boxed(t) if isinstance(t, torch.Tensor) else t, out)

    x = torch.randn(512, 512)
    # Under swap, and under recompute with spill on (the default), it leaves as a host copy;
    # with spill off nothing could rebuild it: no node.
    for policy, spill in (("swap", True), ("recompute", True), ("recompute", False)):
        with pyalloc.recompute(min_bytes=0, policy=policy, spill=spill,
                               host_pool=64 << 20 if spill else 0) as reg:
            boxed = Boxed(x.clone())
            y = boxed * 2                    # y._data: made inside the subclass's op
            node = reg.node_of(y._data)
            if not spill:
                assert node is None
                continue
            assert node is not None and reg.node_of(boxed._data) is None   # the argument's stays
            assert reg.evict([node.handle]) == 1 and node.evicted
            z = y + 1                        # holds y._data: swapped back in first
            assert not node.evicted
            assert torch.equal(z._data, x * 2 + 1)

    with pyalloc.recompute(min_bytes=0, spill=False):   # the report says why they stay
        y = Boxed(x.clone()) * 2
        message = _report_of_a_request_past_what_is_free()
    assert "Python tensor subclasses" in message and "option spill" in message, message


def small_nodes_do_not_change_which_large_activations_are_evicted() -> None:
    # Note [What moves the clock] (allocator/src/evictor.h): with min_evictable at 1 KiB
    # the demo's residual CNN makes thousands of 1-16 KiB nodes a step. When each of their
    # marks ticked the engine's staleness clock, the large victims changed: 93 evictions
    # here against 132 at 16 KiB (726 against 528 on the demo's own six steps), and the demo
    # ran at 0.34x the stock batch's samples/s against 0.47x. Now both settings evict and
    # replay the same large activations.
    from pyalloc import demo
    engine = pyalloc._engine(None)
    cpu = torch.device("cpu")
    stock = demo.train(demo.Run("stock", 16, "none"), 3, 64, cpu, "cpu", 600)
    engine.set_budget(int(stock.peak_reserved * 1.1))
    seen = {}
    for min_bytes in (1 << 10, 16 << 10):
        torch.manual_seed(0)
        with pyalloc.recompute(min_bytes=min_bytes) as reg:
            run = demo.train(demo.Run("4x", 64, "recompute"), 3, 64, cpu, "cpu", 600)
            seen[min_bytes] = (run.trained, run.evictions, run.final_loss, reg.replays_by_op())
    assert seen[1 << 10][0] and seen[1 << 10][1] > 0, seen
    assert seen[1 << 10] == seen[16 << 10], seen


def a_fill_of_a_parameters_shape_is_remembered_not_a_node() -> None:
    # Note [Fills of a parameter's shape] in registry/src/dispatch.cpp: Adagrad makes its state
    # with full_like(p, ...) in its constructor, with grad mode on; those sums became nodes
    # that froze under the optimizer's writes. Under recompute with spill off a fill of a
    # parameter's shape is remembered now, and a node only once an op that may make an
    # activation reads or writes it; under swap and hybrid, and recompute with spill on, it
    # stays a node that can leave.
    torch.manual_seed(0)
    x = torch.randn(256, 256)

    def train(policy):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256))
        ctx = pyalloc.recompute(min_bytes=0, spill=False) if policy else contextlib.nullcontext()
        with ctx as reg:
            opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
            sums = [opt.state[p]["sum"] for p in model.parameters()]
            if reg is not None:
                assert all(reg.node_of(t) is None for t in sums)
                h = model[0](x)
                acc = torch.zeros_like(h)        # read by an op on an activation: a node
                acc += h
                assert reg.node_of(acc) is not None
                assert reg.node_of(torch.ones_like(model[0].weight)) is None
                del h, acc
            losses = []
            for _ in range(3):
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
                if reg is not None:
                    assert all(reg.node_of(t) is None for t in sums), "optimizer state became a node"
                    reg.evict(list(reg.nodes))
                    reg.check_invariants()
        return torch.stack(losses), [p.detach().clone() for p in model.parameters()]

    want_losses, want_params = train(False)
    got_losses, got_params = train(True)
    assert torch.equal(want_losses, got_losses)
    assert all(torch.equal(a, b) for a, b in zip(want_params, got_params))
    # Where a node can leave as a host copy, the state is one (it may then leave).
    for policy in ("swap", "hybrid", "recompute"):
        with pyalloc.recompute(min_bytes=0, policy=policy, host_pool=64 << 20) as reg:
            p = torch.nn.Parameter(torch.randn(256, 256))
            state = torch.full_like(p, 0.1)
            assert reg.node_of(state) is not None, policy


def what_an_op_returns_beside_a_write_is_a_node_and_comes_back_bit_for_bit() -> None:
    # Note [Fresh results beside a write] in registry/src/dispatch.cpp: RReLU in training
    # mode writes its noise into a buffer (a node) and returns the activation, which was no
    # node and stayed. Now it is one, recorded from the same op: evicted, it comes back from
    # the noise buffer's version before the write, with the op's random state, bit for bit;
    # the noise buffer itself is not written again by that replay.
    x = torch.randn(128, 64)

    def train(policy):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.RReLU(), torch.nn.Linear(128, 128),
                                    torch.nn.RReLU(), torch.nn.Linear(128, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        pool = None if policy == "recompute" else 64 << 20
        ctx = pyalloc.recompute(min_bytes=0, policy=policy, host_pool=pool) if policy else contextlib.nullcontext()
        losses = []
        with ctx as reg:
            for _ in range(3):
                h = model[1](model[0](x))
                if reg is not None:
                    node = reg.node_of(h)
                    assert node is not None and node.op.startswith("aten::rrelu_with_noise"), node.op
                    reg.evict(list(reg.nodes))          # the activation and its noise leave
                    reg.check_invariants()
                loss = model[4](model[3](model[2](h))).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
                if reg is not None:
                    reg.evict(list(reg.nodes))
                    reg.check_invariants()
            if reg is not None:
                assert reg.recomputes > 0 or policy != "recompute", reg.stats()
        return torch.stack(losses), [p.detach().clone() for p in model.parameters()]

    want_losses, want_params = train(None)
    for policy in ("recompute", "swap", "hybrid"):
        got_losses, got_params = train(policy)
        assert torch.equal(want_losses, got_losses), policy
        assert all(torch.equal(a, b) for a, b in zip(want_params, got_params)), policy


def a_graph_held_across_an_optimizer_step_stays_evictable_and_comes_back_bit_for_bit() -> None:
    # Note [A written leaf's readers keep a copy] in registry/src/writes.cpp: the last step's
    # features, alive across opt.step() (PCGrad's retained graphs, a loss kept in its
    # variable), were restored and frozen at the step's first write to the weights they
    # were made from. Now their recordings read a copy of those weights: they stay
    # evictable and come back bit for bit, and the next step reads them (a consistency term
    # to the last step's features).
    torch.manual_seed(0)
    x = torch.randn(6, 1024, 128)  # each activation at least twice its layer's weight

    def train(policy):
        torch.manual_seed(1)
        trunk = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
        head = torch.nn.Linear(256, 4)
        opt = torch.optim.Adam([*trunk.parameters(), *head.parameters()], lr=1e-2)
        pool = None if policy == "recompute" else 64 << 20
        ctx = pyalloc.recompute(min_bytes=0, policy=policy, host_pool=pool) if policy else contextlib.nullcontext()
        losses, prev = [], None
        with ctx as reg:
            for step in range(len(x)):
                feat = trunk(x[step])
                loss = head(feat).square().mean()
                if prev is not None:
                    loss = loss + (feat - prev.detach()).square().mean()
                opt.zero_grad()
                loss.backward(retain_graph=True)   # the graph outlives the step
                copies = reg.leaf_copies if reg is not None else 0
                opt.step()
                losses.append(loss.detach())
                if reg is not None:
                    node = reg.node_of(feat)
                    assert not node.frozen, "the optimizer's write froze the held features"
                    assert reg.leaf_copies > copies, reg.stats()
                    reg.evict(list(reg.nodes))
                    reg.check_invariants()
                    if policy == "recompute":
                        assert reg.node_of(feat).evicted
                prev = feat
        return torch.stack(losses), [p.detach().clone() for p in [*trunk.parameters(), *head.parameters()]]

    want_losses, want_params = train(None)
    for policy in ("recompute", "swap", "hybrid"):
        got_losses, got_params = train(policy)
        assert torch.equal(want_losses, got_losses), policy
        assert all(torch.equal(a, b) for a, b in zip(want_params, got_params)), policy

    # A reader lighter than twice what it read is settled as before: kept resident, frozen.
    with pyalloc.recompute(min_bytes=0) as reg:
        lin = torch.nn.Linear(1024, 1024)
        y = lin(torch.randn(2, 1024)) * 2
        want = y.detach().clone()
        copies = reg.leaf_copies
        with torch.no_grad():
            lin.weight.add_(1)
        assert reg.leaf_copies == copies and reg.node_of(y).frozen
        assert torch.equal(y, want)

    # Logits held across a plain backward and the step: every layer's activation is dead
    # lineage of them, and no weight is copied to keep them evictable (the first layer's
    # write freezes them, as plain PyTorch holds them).
    with pyalloc.recompute(min_bytes=0) as reg:
        mlp = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh())
                                    for _ in range(6)], torch.nn.Linear(64, 2048))
        opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
        logits = mlp(torch.randn(512, 64))
        want = logits.detach().clone()
        logits.logsumexp(-1).mean().backward()
        copies = reg.leaf_copies
        opt.step()
        assert reg.leaf_copies == copies, reg.stats()
        assert reg.node_of(logits).frozen and torch.equal(logits, want)


if __name__ == "__main__":
    main([random_ops_replay_bit_for_bit,
          readers_of_an_earlier_version_stay_recomputable,
          what_autograd_saves_of_an_in_place_op_is_a_node_and_comes_back_bit_for_bit,
          what_no_grad_derives_from_an_activation_is_a_node_and_comes_back_bit_for_bit,
          what_a_pass_that_builds_a_graph_keeps_stays_evictable_and_comes_back_bit_for_bit,
          what_a_reentrant_checkpoint_hands_back_stays_a_node_and_comes_back_bit_for_bit,
          a_fill_written_with_activations_is_a_node_and_comes_back_bit_for_bit,
          a_fill_of_a_parameters_shape_is_remembered_not_a_node,
          what_an_op_returns_beside_a_write_is_a_node_and_comes_back_bit_for_bit,
          a_graph_held_across_an_optimizer_step_stays_evictable_and_comes_back_bit_for_bit,
          gradients_summed_in_place_replay_bit_for_bit_and_leave_nothing_behind,
          parameters_inputs_and_gradients_are_never_evicted,
          what_backward_creates_is_evicted_and_recomputed_bit_for_bit,
          a_backward_that_raises_leaves_no_backward_nodes_behind,
          autograd_grad_results_are_the_programs,
          views_follow_their_storage,
          every_view_of_an_evicted_tensor_restores_it_first,
          what_only_dead_lineage_reads_is_let_go_before_out_of_memory,
          what_a_sparse_tensor_wraps_comes_back_before_a_sparse_kernel_reads_it,
          a_sparse_product_of_an_activation_is_a_node_its_reader_does_not_hold,
          a_random_op_replays_inside_a_batched_backward,
          bad_recompute_arguments_name_the_problem,
          modifying_a_saved_tensor_in_place_is_still_an_error,
          settling_a_pass_without_room_is_no_oom_of_the_programs,
          an_op_that_updates_state_it_reads_replays_from_the_state_it_read,
          a_gradient_backward_builds_from_a_fill_is_a_node_and_comes_back_bit_for_bit,
          what_the_program_keeps_comes_back_before_a_write_to_what_made_it,
          rebinding_what_an_activation_was_made_from_keeps_the_activation_as_made,
          a_parameter_freed_and_gathered_again_keeps_what_was_made_from_it,
          a_storage_frozen_while_read_is_let_go_once_nothing_reads_it,
          a_conjugate_view_replays_conjugated,
          a_buffer_assembled_step_by_step_in_forward_stays_recomputable,
          a_mask_made_from_the_batch_is_let_go_when_its_layer_returns,
          a_copy_kept_across_iterations_keeps_no_earlier_iteration_behind_it,
          a_reversible_network_keeps_no_lineage_heavier_than_what_it_frees,
          what_a_dead_nodes_recording_kept_goes_with_its_death,
          a_step_of_several_backward_passes_holds_none_of_its_own_activations,
          what_a_subclass_keeps_inside_comes_back_before_its_ops_read_it,
          a_composite_op_on_a_vmap_wrapper_makes_no_node_inside,
          a_tangent_forward_mode_ad_makes_leaves_as_a_host_copy,
          an_efficient_zero_tensor_is_no_node,
          an_out_of_memory_report_names_what_recompute_can_no_longer_rebuild,
          what_a_scripted_differentiable_graph_saves_is_a_node_and_comes_back_bit_for_bit,
          torchscript_fuses_nothing_while_a_policy_runs,
          an_out_of_memory_error_inside_a_replay_says_what_the_replay_pins,
          what_a_subclass_op_returns_inside_leaves_under_swap_and_comes_back,
          a_batch_norm_applied_twice_keeps_both_outputs_recomputable,
          a_gradient_bound_for_a_grad_is_a_victim_of_last_resort,
          a_victim_too_dear_to_replay_spills,
          a_victim_too_dear_to_replay_that_the_pool_refuses_stays,
          deaths_in_separate_batches_charge_what_one_walk_would,
          a_charge_reaching_an_unnoticed_death_still_charges_the_rest,
          a_replay_thousands_deep_fits_a_small_thread_stack,
          a_replay_past_the_nesting_limit_gives_up_and_leaves_the_step_intact,
          a_survivor_left_swapped_out_at_the_end_of_a_pass_comes_back,
          an_out_of_memory_report_names_gradients_backward_froze,
          an_out_of_memory_report_names_tensors_too_small_to_evict,
          an_out_of_memory_report_names_segments_kept_by_tensors_too_small_to_evict,
          small_nodes_do_not_change_which_large_activations_are_evicted])
