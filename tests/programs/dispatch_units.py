"""Unit checks of the registry's per-op path (registry/src/dispatch.cpp) under PyTorch.

tests/test_dispatch.py runs each in a fresh interpreter, as
``python tests/programs/dispatch_units.py CHECK`` (see unit_harness.py: pyalloc installed
on the simulated device, ``ok`` printed at the end).
"""
from __future__ import annotations

import torch

import pyalloc
from unit_harness import main


def composite_ops_are_seen_through_to_their_pieces() -> None:
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
        with torch.inference_mode():                       # a copy that is no node
            want = h.detach().clone()
        assert reg.evict(list(reg.nodes)) == 2
        assert torch.equal(h, want)                        # the mask replays bit for bit
        h.sum().backward()


def autocast_casts_are_nodes() -> None:
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


def backward_ops_pass_through_the_registry_and_restore_what_they_read() -> None:
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


def python_numbers_replay_as_numbers() -> None:
    x = torch.randn(256, 256, requires_grad=True)
    with pyalloc.recompute(min_bytes=0) as reg:
        h = (x.half() * 2.5) + 1
        assert h.dtype == torch.float16
        want = h.detach().clone()
        reg.evict(list(reg.nodes))
        assert torch.equal(h, want) and h.dtype == torch.float16


def every_activation_of_a_forward_pass_is_a_node() -> None:
    from pyalloc.bench.models import TASKS

    engine = pyalloc._engine(None)
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


def an_interrupt_stops_a_recomputation_in_backward_and_keeps_training_state() -> None:
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
        (x * 2).sum()
        reg.check_invariants()


def a_benchmark_time_limit_stops_a_backward_running_in_cpp() -> None:
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


def threads_the_program_starts_read_evicted_tensors_as_they_were() -> None:
    # Note [Threads the program starts] in pyalloc/registry.py: an op on a thread started
    # with `threading` while a policy runs restores what it reads (before, a segfault).
    import concurrent.futures
    import threading

    w = torch.randn(1024, 1024, requires_grad=True)
    x = torch.randn(1024, 1024)
    for policy in ("recompute", "swap"):
        with pyalloc.recompute(min_bytes=0, policy=policy, host_pool=64 << 20) as reg:
            h = torch.tanh(x @ w)
            want = h.detach().clone()
            got = []

            def read() -> None:
                got.append(h.detach().clone())

            for start in (lambda: threading.Thread(target=read).start(),
                          lambda: concurrent.futures.ThreadPoolExecutor(1).submit(read).result()):
                assert reg.evict([reg.node_of(h).handle]) == 1
                assert h.untyped_storage().nbytes() == 0
                start()
                for t in threading.enumerate():
                    if t is not threading.current_thread() and not t.daemon:
                        t.join()
                assert torch.equal(got.pop(), want), policy
            h.sum().backward()
            reg.check_invariants()


def training_in_a_thread_the_program_starts_evicts_and_trains_the_same() -> None:
    # The whole step on a thread the program started after the policy: its activations are
    # nodes, evicted after forward and recomputed in backward, bit for bit.
    import threading

    def train(steps_in_thread: bool) -> list:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                    torch.nn.Dropout(0.1), torch.nn.Linear(512, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        data = torch.Generator().manual_seed(2)
        batches = [(torch.randn(128, 256, generator=data), torch.randint(0, 10, (128,), generator=data))
                   for _ in range(3)]
        recomputes = []

        def steps(reg=None) -> None:
            for x, y in batches:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if reg is not None:
                    before = reg.recomputes
                    assert reg.evict(list(reg.nodes)) > 0
                opt.zero_grad()
                loss.backward()
                if reg is not None:
                    recomputes.append(reg.recomputes - before)
                opt.step()

        if steps_in_thread:
            with pyalloc.recompute(min_bytes=0) as reg:
                t = threading.Thread(target=steps, args=(reg,))
                t.start()
                t.join()
            assert len(recomputes) == 3 and min(recomputes) > 0, recomputes
        else:
            steps()
        return [p.detach().clone() for p in model.parameters()]

    plain = train(False)
    threaded = train(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, threaded))


def a_read_of_evicted_memory_outside_the_registry_is_a_clear_error() -> None:
    # Note [Reads of evicted memory] in registry/src/node.h: a thread that was running before
    # the policy started has no registry key, and tensor.data_ptr() is no op; either read of
    # an evicted storage was a segfault (or garbage), and is a RuntimeError saying why where
    # the torch lets a storage refuse access (2.13 does; where it does not, such a read still
    # crashes, so it is not made). The next op restores it as ever.
    import threading

    from pyalloc import _torch_shim

    refuses = bool(_torch_shim.load().pyalloc_registry_evicted_data_refuses())
    if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13):
        assert refuses, "torch 2.13 offers the flag and its clearing: the registry must use them"

    ready, go, seen = threading.Event(), threading.Event(), []

    def read_later() -> None:
        ready.set()
        go.wait()
        try:
            seen.append(float(h.detach().sum()))
        except RuntimeError as e:
            seen.append(str(e))

    early = threading.Thread(target=read_later)
    early.start()
    ready.wait()
    w = torch.randn(1024, 1024, requires_grad=True)
    for policy in ("recompute", "swap"):
        with pyalloc.recompute(min_bytes=0, policy=policy, host_pool=64 << 20) as reg:
            h = torch.tanh(torch.randn(1024, 1024) @ w)
            want = h.detach().clone()
            assert reg.evict([reg.node_of(h).handle]) == 1
            if refuses:
                if policy == "recompute":
                    go.set()
                    early.join()
                    assert "this tensor's memory was evicted by the registry" in seen[0], seen
                    assert "pyalloc.install()" in seen[0]
                try:
                    h.data_ptr()
                    raise AssertionError("data_ptr() of an evicted storage did not refuse")
                except RuntimeError as e:
                    assert "tensor.data_ptr()" in str(e), e
            assert torch.equal(h, want)                    # an op: restored, bit for bit
            assert h.data_ptr() != 0                       # and readable again
            h.sum().backward()
            reg.check_invariants()
    go.set()
    early.join()


def copies_pickles_and_lists_of_an_evicted_tensor_read_what_it_holds() -> None:
    # Note [Storage access around the dispatcher] in pyalloc/registry.py: a module
    # that keeps a detached activation, evicted, then copied, saved and listed. Before, each
    # of these raised the evicted-memory error (deepcopy: an empty storage).
    import copy
    import io

    w = torch.randn(256, 256, requires_grad=True)
    for policy in ("recompute", "swap"):
        with pyalloc.recompute(min_bytes=0, policy=policy, host_pool=64 << 20) as reg:
            h = torch.tanh(torch.randn(256, 256) @ w)
            kept = {"last": h.detach(), "step": 3}          # as a module attribute would
            want = h.detach().clone()

            def evict() -> None:
                assert reg.evict([reg.node_of(h).handle]) == 1 and reg.node_of(h).evicted

            evict()
            copied = copy.deepcopy(kept)
            assert torch.equal(copied["last"], want), policy
            assert copied["last"].untyped_storage()._cdata != h.untyped_storage()._cdata
            evict()
            buffer = io.BytesIO()
            torch.save(kept, buffer)
            buffer.seek(0)
            assert torch.equal(torch.load(buffer)["last"], want), policy
            evict()
            assert kept["last"][:4].tolist() == want[:4].tolist(), policy
            assert not reg.node_of(h).fixed                 # read and left to leave again
            evict()
            # numpy() shares the memory: brought back, and never evicted under it again.
            array = kept["last"].numpy()
            assert (array == want.numpy()).all(), policy
            node = reg.node_of(h)
            assert node.fixed and not node.evicted and reg.evict([node.handle]) == 0
            h.sum().backward()
            reg.check_invariants()
    # With no policy running, the tensor API is PyTorch's own again.
    assert "tolist" not in torch.Tensor.__dict__ and "numpy" not in torch.Tensor.__dict__
    assert torch.Tensor.__deepcopy__.__module__ == "torch._tensor"


def a_tensor_that_finds_no_memory_to_come_back_raises_out_of_memory() -> None:
    # A restore that finds no memory is an out-of-memory error wherever it happens, so that
    # a training loop's `except torch.OutOfMemoryError` (skip the batch, halve it) sees it:
    # a swap-in of a tensor with no lineage to fall back on, and the entry points Python
    # calls (restore_all(), the storage accesses of Note [Storage access around the
    # dispatcher]). Before, they raised a plain RuntimeError. Nothing is lost: with memory
    # back, the tensor reads what it held.
    import copy

    engine = pyalloc._engine(None)
    w = torch.randn(1024, 1024, requires_grad=True)
    x = torch.randn(1024, 1024)
    for policy in ("recompute", "swap"):
        with pyalloc.recompute(min_bytes=0, policy=policy, host_pool=64 << 20) as reg:
            h = torch.tanh(x @ w)
            if policy == "swap":   # made a parameter and written: frozen, no lineage
                h = h.detach().requires_grad_()
                with torch.no_grad():
                    h.add_(1)
            want = h.detach().clone()
            node = reg.node_of(h)
            assert node.frozen == (policy == "swap"), policy
            assert reg.evict([node.handle]) == 1
            engine.empty_cache()
            engine.set_budget(pyalloc.memory_stats()["reserved_bytes.all.current"])
            fill = []   # what is free goes to tensors the program holds
            try:
                while True:
                    fill.append(torch.empty(1 << 18))
            except torch.OutOfMemoryError:
                pass
            for access in (reg.restore_all, lambda: h.sum(), lambda: copy.deepcopy(h.detach()),
                           lambda: h.detach().numpy()):
                try:
                    access()
                except torch.OutOfMemoryError as e:
                    if policy == "swap":
                        assert "no lineage" in str(e) or "tried to allocate" in str(e), e
                else:
                    raise AssertionError(f"{policy}: no error with no memory to restore into")
            del fill
            engine.set_budget(1 << 30)
            assert torch.equal(h.detach(), want), policy
            reg.check_invariants()


if __name__ == "__main__":
    main([composite_ops_are_seen_through_to_their_pieces,
          autocast_casts_are_nodes,
          backward_ops_pass_through_the_registry_and_restore_what_they_read,
          python_numbers_replay_as_numbers,
          every_activation_of_a_forward_pass_is_a_node,
          an_interrupt_stops_a_recomputation_in_backward_and_keeps_training_state,
          a_benchmark_time_limit_stops_a_backward_running_in_cpp,
          threads_the_program_starts_read_evicted_tensors_as_they_were,
          training_in_a_thread_the_program_starts_evicts_and_trains_the_same,
          a_read_of_evicted_memory_outside_the_registry_is_a_clear_error,
          copies_pickles_and_lists_of_an_evicted_tensor_read_what_it_holds,
          a_tensor_that_finds_no_memory_to_come_back_raises_out_of_memory])
