"""Rematerialization (pyalloc.registry): evict activations, recompute them, change nothing.

The training tests run each model twice in fresh processes: unconstrained under pyalloc,
then with ``policy="recompute"`` under a budget of 35% of the first run's peak reserved
bytes, which the model can only meet by evicting and recomputing (the counters say it
did). Losses, parameters, buffers (BatchNorm's running statistics) and optimizer state
must be equal bit for bit. Dropout is on in every model, so every step replays random
ops; the CNN has in-place ReLU and addition; the transformer has views and transposes.
"""
from __future__ import annotations

import pytest

from conftest import run_in_subprocess, run_unit, train


@pytest.mark.slow
@pytest.mark.parametrize("task", ["mlp", "cnn", "transformer"])
def test_trains_bit_identically_at_35_percent_of_peak(task):
    free = train(task, "2GiB")
    budget = int(0.35 * free["peak"])
    tight = train(task, budget, policy="recompute", evict_strategy="window")
    assert len(tight["record"]) == 21
    assert tight["record"] == free["record"]
    assert tight["peak"] <= budget
    # The budget forced the policy to work, every step (20 steps).
    assert tight["evictions"] >= 20 and tight["recomputes"] >= 20, tight
    assert "evictions" not in free   # no policy, no registry


@pytest.mark.slow
def test_each_strategy_trains_bit_identically():
    free = train("cnn", "2GiB", steps=4)
    for strategy in ("dtr", "dte"):
        tight = train("cnn", int(0.4 * free["peak"]), policy="recompute", steps=4,
                      evict_strategy=strategy)
        assert tight["record"] == free["record"], strategy
        assert tight["recomputes"] > 0, strategy


SCOPED = """
import torch, pyalloc
from torch import nn
pyalloc.install(device="cpu", budget="{budget}")
from pyalloc.bench.models import mlp
torch.manual_seed(0)
model = mlp(256, 6)
x = torch.randn(4096, 256)
for step in range(3):
    with pyalloc.recompute() as reg:
        logits = model(x)
        logits.sum().backward()
    # Outside the block nothing intercepts reads: what the program still holds is resident.
    assert logits.untyped_storage().nbytes() == logits.numel() * 4
    print("logits", logits.double().sum().item().hex(), "recomputes", reg.stats()["recomputes"])
    model.zero_grad()
"""


@pytest.mark.slow
def test_scoped_form_restores_what_the_program_keeps():
    free = run_in_subprocess(SCOPED.format(budget="2GiB"))
    tight = run_in_subprocess(SCOPED.format(budget="40MiB"))
    assert [l.split()[1] for l in tight.splitlines()] == [l.split()[1] for l in free.splitlines()]
    assert all(int(l.split()[3]) > 0 for l in tight.splitlines())


OOM = """
import hashlib, torch, pyalloc
pyalloc.install(device="cpu", budget="2GiB", policy="recompute")
from pyalloc.bench.models import TASKS
task = TASKS["cnn"]
torch.manual_seed(0)
model = task.build()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = task.batch(64, torch.Generator().manual_seed(1))
def digest():
    h = hashlib.sha256()
    for t in list(model.state_dict().values()) + [
            v for s in opt.state_dict()["state"].values() for v in s.values()]:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
for step in range(2):
    opt.zero_grad(); task.loss(model, x, y).backward(); opt.step()
before = digest()
engine = pyalloc._engine(None)
engine.set_budget(int(pyalloc.memory_stats()["allocated_bytes.all.current"]) + (2 << 20))
try:
    opt.zero_grad()
    task.loss(model, x, y).backward()
    opt.step()
    print("no error")
except torch.OutOfMemoryError as e:
    print("oom:", str(e).splitlines()[0])
assert digest() == before, "the failed step changed the model or the optimizer"
from pyalloc import registry
assert all(n.pins == 0 for n in registry.active().nodes.values()), "pins leaked"
pyalloc.check_invariants()
engine.set_budget(2 << 30)
for step in range(2):
    opt.zero_grad(); loss = task.loss(model, x, y); loss.backward(); opt.step()
print("recovered", torch.isfinite(loss).item())
import json, tempfile, os
path = pyalloc.save_snapshot(os.path.join(tempfile.mkdtemp(), "snap.json"))
print("snapshot has remat counters", "remat.recomputes" in json.load(open(path))["stats"])
"""


@pytest.mark.slow
def test_budget_below_the_minimum_fails_cleanly_and_keeps_training_state():
    out = run_in_subprocess(OOM)
    assert "oom: pyalloc: out of memory" in out
    assert "recovered True" in out
    assert "snapshot has remat counters True" in out   # so pyalloc-stats report shows them


@pytest.mark.slow
def test_random_ops_replay_bit_for_bit():
    run_unit("""
        x = torch.randn(256, 256, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            y = torch.nn.functional.dropout(x, 0.5) * 3      # empty_like, bernoulli_, div_, mul
            z = torch.rand_like(x) + x                      # a random creation
            want_y, want_z = y.detach().clone(), z.detach().clone()
            assert reg.evict(list(reg.nodes)) > 0
            assert y.untyped_storage().nbytes() == 0        # really evicted
            torch.randn(10)                                 # moves the generator on
            assert torch.equal(y, want_y) and torch.equal(z, want_z)
            assert reg.recomputes >= 2
    """)


@pytest.mark.slow
def test_readers_of_an_earlier_version_stay_recomputable():
    run_unit("""
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
    """)


def test_what_autograd_saves_of_an_in_place_op_is_a_node_and_comes_back_bit_for_bit():
    # a.mul_(w) needs the old a for w's gradient: autograd's kernel clones it, inside the op.
    # See Note [What autograd saves] in registry/src/dispatch.cpp.
    run_unit("""
        torch.manual_seed(0)
        x = torch.randn(256, 256, requires_grad=True)
        w = torch.randn(256, 256, requires_grad=True)
        plain = torch.randn(256, 256)

        def step(evict):
            x.grad = w.grad = None
            with pyalloc.recompute(min_bytes=0) as reg:
                a = x * 2
                a.mul_(w)                   # extends a's chain; saves a at version 0
                b = plain.clone()           # not a node: its write cannot be followed
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
    """)


@pytest.mark.slow
def test_gradients_summed_in_place_replay_bit_for_bit_and_leave_nothing_behind():
    # Autograd sums a skip connection's two gradients in place, into the one that came
    # down the skip, after the branch read it: a cycle of readers through an earlier
    # version (Note [Readers of an earlier version]), evicted here in the middle of
    # backward and replayed, then gone when the pass ends.
    run_unit("""
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
    """)


@pytest.mark.slow
def test_parameters_inputs_and_gradients_are_never_evicted():
    run_unit("""
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
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
            assert all(not n.key in {p.untyped_storage()._cdata for p in model.parameters()}
                       for n in reg.nodes.values())
    """)


BACKWARD = """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
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
"""


@pytest.mark.slow
def test_what_backward_creates_is_evicted_and_recomputed_bit_for_bit():
    run_unit(BACKWARD + """
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
    """)


@pytest.mark.slow
def test_a_backward_that_raises_leaves_no_backward_nodes_behind():
    run_unit(BACKWARD + """
        want, _, _, _ = step(False)
        with pytest.raises(RuntimeError, match="stop"):
            step(True, fail=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            left = {h: n.op for h, n in reg.nodes.items()}
            (x * 2).sum()                     # the first op outside a backward settles it
            alive = [n for n in reg.nodes.values() if not n.dead and n.chain > 0]
            assert not alive, [n.op for n in alive]
        pyalloc.check_invariants()
        got, _, _, kept = step(True)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        assert kept == [None] * len(kept)
    """)


@pytest.mark.slow
def test_autograd_grad_results_are_the_programs():
    run_unit("""
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
    """)


@pytest.mark.slow
def test_views_follow_their_storage():
    run_unit("""
        x = torch.randn(64, 128, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            y = torch.tanh(x)
            v = y.t()[3:9]                  # a view: same storage
            want = v.detach().clone()
            reg.evict(list(reg.nodes))
            assert v.untyped_storage().nbytes() == 0
            assert torch.equal(v, want)     # reading the view restores the whole storage
            assert torch.equal(y[:, 3:9].t(), want)
    """)


@pytest.mark.slow
def test_bad_arguments_name_the_problem():
    run_unit("""
        import pytest
        with pytest.raises(ValueError, match="cost must be"):
            with pyalloc.recompute(cost="flops"):
                pass
        with pytest.raises(ValueError, match="min_bytes"):
            with pyalloc.recompute(min_bytes=-1):
                pass
        from pyalloc import registry
        registry.enable()
        with pytest.raises(RuntimeError, match="already on"):
            registry.enable()
        registry.disable()
    """)
    out = run_in_subprocess("""
import pyalloc
try:
    pyalloc.install(device="cpu", policy="swapp")
except ValueError as e:
    print(e)
""")
    assert "policy" in out and "none, recompute" in out


@pytest.mark.slow
def test_modifying_a_saved_tensor_in_place_is_still_an_error():
    # Autograd skips its version check for tensors behind saved-tensor hooks; the registry
    # makes it instead, so a user's in-place bug is not silently turned into wrong gradients.
    run_unit("""
        import pytest
        x = torch.randn(300, 300, requires_grad=True)
        with pyalloc.recompute(min_bytes=0):
            y = x.exp()                     # exp saves its output
            y.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                y.sum().backward()
    """)


@pytest.mark.slow
def test_a_replay_runs_in_the_grad_mode_its_op_ran_in():
    """An LSTM on the CPU (mkldnn_rnn_layer) returns its workspace only with grad mode on.
    With every storage recorded (min_evictable 0), backward restores the layer's small
    outputs by replaying it with grad mode off, where it made one result fewer than
    recorded and the restore failed; replayed in the forward's mode, training is
    bit-identical."""
    import pyalloc.bench.zoo  # noqa: F401  (adds the zoo_* tasks)

    free = train("zoo_lstm_lm", "2GiB", steps=3)
    tight = train("zoo_lstm_lm", int(0.5 * free["peak"]), steps=3, policy="recompute",
                  min_evictable="0")
    assert tight["record"] == free["record"]
    assert tight["recomputes"] > 0 and tight["peak"] <= 0.5 * free["peak"], tight


@pytest.mark.slow
def test_empty_cache_after_an_oom_in_backward_frees_what_the_failed_step_left():
    """An out-of-memory error in backward leaves the step's nodes behind, dead (the
    program dropped their tensors) but waiting for the registry's next periodic sweep, with
    the storages rebuilt for their readers. empty_cache() collects them first, so a retry
    (a smaller batch, the next trial of a benchmark) starts from what the model holds."""
    out = run_in_subprocess("""
        import gc, torch, pyalloc
        pyalloc.install(device="cpu", policy="recompute")
        import pyalloc.bench.zoo
        from pyalloc.bench.models import TASKS
        task = TASKS["zoo_unet"]
        torch.manual_seed(0)
        model = task.build()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = task.batch(task.default_batch, torch.Generator().manual_seed(1))
        def step():
            opt.zero_grad(set_to_none=True)
            task.loss(model, x, y).backward()
            opt.step()
        step(); step()
        engine = pyalloc._engine(None)
        before = engine.stats()["allocated_bytes.all.current"]
        # Above its floor (0.27), below what it trains in: out of memory in backward.
        engine.set_budget(int(0.28 * engine.stats()["reserved_bytes.all.peak"]))
        try:
            step()
        except torch.OutOfMemoryError:
            print("oom")
        opt.zero_grad(set_to_none=True)
        # Autograd leaves the failed pass's pending tasks (their gradients, the graph's
        # saved tensors) in this thread's ready queue until the thread's next backward
        # drains them; that is PyTorch's, not pyalloc's, and any backward releases it.
        torch.ones(1, requires_grad=True).sum().backward()
        gc.collect()
        pyalloc.empty_cache()
        print("held", engine.stats()["allocated_bytes.all.current"] - before)
    """)
    assert "oom" in out
    held = int(out.split("held ")[1].split()[0])
    assert held <= 64 << 10, out
