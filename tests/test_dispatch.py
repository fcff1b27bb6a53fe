"""The registry's per-op path (registry/src/dispatch.cpp): a boxed fallback on a dispatch
key, what it sees, and what happens when it cannot have its key.

The training equivalence of the policies is tested in test_remat.py, test_swap.py,
test_remat_random.py and test_unet.py; this file tests the mechanism under them.
"""
from __future__ import annotations

import pytest

from conftest import run_in_subprocess, run_unit, train

# Takes the registry's dispatch key first, as torchdistx's deferred_init would.
SQUAT = """
import torch
squatter = torch.library.Library("_", "IMPL", "DeferredInit")
squatter.fallback(torch.library.fallthrough_kernel)
"""


def test_a_dispatch_key_another_library_holds_is_a_clear_error_and_changes_nothing():
    out = run_in_subprocess(SQUAT + """
import pyalloc
try:
    pyalloc.install(device="cpu", budget="1GiB", policy="recompute")
    print("installed")
except RuntimeError as e:
    print("refused:", str(e).replace(chr(10), " "))
print("installed after", pyalloc.is_installed())
# Without a policy pyalloc works as ever: the allocator needs no dispatch key.
pyalloc.install(device="cpu", budget="1GiB")
x = torch.randn(256, 256, requires_grad=True)
(x * 2).sum().backward()
print("trained", bool(torch.equal(x.grad, torch.full_like(x, 2.0))))
try:
    with pyalloc.recompute():
        pass
except RuntimeError as e:
    print("scoped refused too:", "DeferredInit" in str(e))
""")
    assert "installed after False" in out, out   # the failed install left nothing behind
    refusal = next(line for line in out.splitlines() if line.startswith("refused:"))
    assert "DeferredInit" in refusal and "torchdistx" in refusal
    assert "previous registration" in refusal   # where the other one was registered
    assert 'policy="none"' in refusal           # and what to do
    assert "trained True" in out and "scoped refused too: True" in out


def test_composite_ops_are_seen_through_to_their_pieces():
    # dropout and linear are CompositeImplicitAutograd: what they save for backward (the
    # mask, the matmul's output) is made by the ops they call, which must be nodes.
    run_unit("""
        x = torch.randn(512, 256, requires_grad=True)
        lin = torch.nn.Linear(256, 256)
        with pyalloc.recompute(min_bytes=0) as reg:
            h = torch.nn.functional.dropout(lin(x), 0.5)
            keys = {n.key for n in reg.nodes.values()}
            assert h.untyped_storage()._cdata in keys          # the output of the pieces
            assert len(reg.nodes) == 3, reg.nodes              # addmm, the mask, the product
            # addmm's output is gone already (dropout's backward does not save it): a dead
            # node, kept as the product's lineage. The mask and the product can be evicted.
            assert sum(n.dead for n in reg.nodes.values()) == 1
            want = h.detach().clone()
            assert reg.evict(list(reg.nodes)) == 2
            assert torch.equal(h, want)                        # the mask replays bit for bit
            h.sum().backward()
    """)


def test_autocast_casts_are_nodes():
    run_unit("""
        a = torch.randn(512, 512, requires_grad=True)
        b = torch.randn(512, 512, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                c = a @ b
            assert c.dtype == torch.bfloat16
            sizes = sorted(n.nbytes for n in reg.nodes.values())
            # Two casts of 512x512 to bf16 (the matmul saves them for backward) and the product.
            assert sizes.count(512 * 512 * 2) >= 3, sizes
            want = c.detach().clone()
            reg.evict(list(reg.nodes))
            assert torch.equal(c, want)
            c.float().sum().backward()
    """)


@pytest.mark.slow
def test_backward_ops_pass_through_the_registry_and_restore_what_they_read():
    run_unit("""
        x = torch.randn(256, 256, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            y = (x * 1.5).exp()                 # exp saves its output for backward
            reg.evict(list(reg.nodes))
            assert y.untyped_storage().nbytes() == 0
            ops = reg.ops
            y.sum().backward()                  # exp's backward reads the evicted output
            assert reg.ops > ops and reg.recomputes >= 1
            assert torch.allclose(x.grad, 1.5 * (x * 1.5).exp())
            reg.check_invariants()
    """)


@pytest.mark.slow
def test_python_numbers_replay_as_numbers():
    # PyTorch wraps a Python scalar as a 0-dim tensor marked as a number, which changes type
    # promotion (half * 2.5 stays half); the lineage keeps the number, and replay must wrap
    # it the same way.
    run_unit("""
        x = torch.randn(256, 256, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            h = (x.half() * 2.5) + 1
            assert h.dtype == torch.float16
            want = h.detach().clone()
            reg.evict(list(reg.nodes))
            assert torch.equal(h, want) and h.dtype == torch.float16
    """)


@pytest.mark.slow
def test_a_python_dispatch_mode_of_the_program_works_beside_the_registry():
    # The registry sits above the Python key: a mode the program pushes (here pyalloc's own
    # op tagging for traces) sees every op, including the registry's replays, and training
    # stays bit-identical.
    free = train("transformer", "2GiB", steps=3)
    budget = int(0.4 * free["peak"])
    setup = """
import tempfile, os
_trace = pyalloc.record_trace(os.path.join(tempfile.mkdtemp(), "t.json.gz"), stacks=True)
_trace.__enter__()
"""
    tight = train("transformer", budget, steps=3, policy="recompute", setup=setup)
    assert tight["record"] == free["record"]
    assert tight["evictions"] > 0 and tight["recomputes"] > 0, tight


@pytest.mark.slow
def test_the_registry_keeps_its_invariants_through_training_and_lets_go_of_what_dies():
    report = """
from pyalloc import registry as _r
_r.active().check_invariants()
print("nodes after", _r.active().stats()["nodes"])
"""
    free = train("cnn", "2GiB", steps=3)
    tight = train("cnn", int(0.4 * free["peak"]), steps=3, policy="recompute", report=report)
    assert tight["record"] == free["record"]
    # After the step, activations are dead: their lineage was forgotten, not kept.
    nodes_after = int(tight["output"].split("nodes after ")[1].split()[0])
    assert nodes_after <= 2, tight["output"]


@pytest.mark.slow
def test_every_activation_of_a_forward_pass_is_a_node():
    # matmul and linear have a kernel on the Autograd alias key as well as a math kernel, but
    # the math kernel is what runs for dense tensors: their pieces (the clones a reshape of
    # q, k and v makes inside matmul, bmm, addmm) are what autograd saves, and each must be
    # a node, or it stays on the device through backward.
    run_unit("""
        from pyalloc.bench.models import TASKS
        task = TASKS["transformer"]
        model = task.build()
        x, y = task.batch(task.default_batch, torch.Generator().manual_seed(1))
        with pyalloc.recompute() as reg:
            before = {b["address"] for s in engine.snapshot()["segments"] for b in s["blocks"]
                      if b["state"] == "active_allocated"}
            loss = task.loss(model, x, y)
            nodes = {n.data for n in reg.nodes.values() if n.data}
            made = [(b["address"], b["size"]) for s in engine.snapshot()["segments"]
                    for b in s["blocks"]
                    if b["state"] == "active_allocated" and b["address"] not in before
                    and b["size"] >= 64 << 10]
            left = [size for address, size in made if address not in nodes]
            assert made and not left, (len(made), left)
            loss.backward()
    """)


def test_an_interrupt_stops_a_recomputation_in_backward_and_keeps_training_state():
    # A watchdog's way out of an op that recomputes for too long: backward runs in C++ and
    # never returns to Python, so no signal handler could run there.
    run_unit("""
        x = torch.randn(256, 256, requires_grad=True)
        w = torch.randn(256, 256, requires_grad=True)
        with pyalloc.recompute(min_bytes=0) as reg:
            y = (x @ w).exp()
            reg.evict(list(reg.nodes))
            reg.interrupt()
            try:
                y.sum().backward()               # exp's backward must recompute y first
                raise AssertionError("not interrupted")
            except RuntimeError as e:
                assert "pyalloc: interrupted" in str(e), e
            assert x.grad is None and w.grad is None
            y.sum().backward()                   # once only: the same backward now trains
            assert torch.allclose(x.grad, (x @ w).exp() @ w.T)
            reg.interrupt()
            reg.interrupt(False)                 # withdrawn before any op took it
            z = (x * 2).sum()
            reg.check_invariants()
    """)


@pytest.mark.slow
def test_a_benchmark_time_limit_stops_a_backward_running_in_cpp():
    # Backward runs in C++ on this thread: SIGALRM's handler waits for it to return, so
    # the limit's watchdog interrupts the registry, and the error it raises becomes
    # TooSlow (the exception chain tells the two ways apart).
    run_unit("""
        from pyalloc.bench.trial import TooSlow, time_limit
        ws = [torch.randn(1024, 1024, requires_grad=True) for _ in range(60)]
        with pyalloc.recompute() as reg:
            h = torch.randn(1024, 1024)
            for w in ws:
                h = (h @ w).tanh()               # backward: two matmuls a layer
            loss = h.sum()
            try:
                with time_limit(0.5):
                    loss.backward()
                raise AssertionError("not stopped")
            except TooSlow as e:
                # Raised from the interrupt, or by SIGALRM's handler while Python unwound it.
                chain = e.__cause__ or e.__context__
                assert "pyalloc: interrupted" in str(chain), repr(chain)
            x = torch.randn(8, requires_grad=True)
            (x * 2).sum().backward()             # no interrupt left behind
            assert torch.equal(x.grad, torch.full_like(x, 2.0))
            reg.check_invariants()
    """)
