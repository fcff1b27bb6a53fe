"""CUDA graphs under pyalloc.install() with no policy, on a GPU.

tests/test_gpu.py runs it as ``python tests/programs/gpu_graph_capture.py``. Each check
prints ``<name>: ok`` or ``<name>: FAILED <why>``; the program exits 1 if any failed, so
one run says everything it found.

* A captured graph replays into the addresses it was captured with, also those of
  intermediates it freed during capture: they must stay the graph's (PyTorch's private
  pools), never be handed to eager tensors made after the capture.
* The graph's memory comes back once the graph and its outputs are gone.
* A second graph with its own pool never takes the first one's memory.
* torch.cuda.MemPool, which PyTorch builds only on its own allocator, says so.
* Under a policy, capture refuses with a message that says what to do.
"""
from __future__ import annotations

import sys
import traceback

import torch

import pyalloc

pyalloc.install(device="cuda")
failed: list = []
N = 1 << 20  # 4 MiB of float32


def check(fn):
    try:
        fn()
        print(f"{fn.__name__}: ok", flush=True)
    except BaseException as exc:  # noqa: BLE001 - a probe reports every failure
        failed.append(fn.__name__)
        print(f"{fn.__name__}: FAILED {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
    return fn


def warm_up(fn) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


@check
def graph_memory_is_never_handed_to_eager_tensors():
    x = torch.zeros(N, device="cuda")
    warm_up(lambda: ((x * 2) + 1) * 3)
    graph = torch.cuda.CUDAGraph()
    inner = []
    with torch.cuda.graph(graph):
        a = x * 2
        b = a + 1
        inner += [a.data_ptr(), b.data_ptr()]
        del a
        out = b * 3
        del b
    # Eager tensors of the same size, made after the capture: the caching allocator's
    # first choice would be the blocks a and b left.
    probes = [torch.full((N,), 7.0, device="cuda") for _ in range(4)]
    clash = [p.data_ptr() for p in probes if p.data_ptr() in inner]
    assert not clash, (f"eager tensors got the graph's intermediate blocks {clash} "
                       f"(graph blocks {inner})")
    x.copy_(torch.arange(N, device="cuda", dtype=torch.float32))
    graph.replay()
    torch.cuda.synchronize()
    overwritten = sum(int((p != 7.0).sum()) for p in probes)
    assert overwritten == 0, f"the replay overwrote {overwritten} elements of eager tensors"
    assert torch.equal(out, (x * 2 + 1) * 3), "the replay computed a wrong result"
    pyalloc.check_invariants()


@check
def a_second_graph_can_share_the_first_ones_pool():
    x = torch.ones(N, device="cuda")
    warm_up(lambda: x * 5)
    first = torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        y = x * 5
    second = torch.cuda.CUDAGraph()
    with torch.cuda.graph(second, pool=first.pool()):
        z = y + 1
    first.replay()
    second.replay()
    torch.cuda.synchronize()
    assert torch.equal(z, torch.full_like(x, 6.0))
    pyalloc.check_invariants()


@check
def memory_comes_back_when_the_graph_and_its_outputs_go():
    torch.cuda.synchronize()
    pyalloc.empty_cache()
    before = pyalloc.memory_stats()["allocated_bytes.all.current"]
    x = torch.zeros(4 * N, device="cuda")
    warm_up(lambda: (x + 1) * 2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = (x + 1) * 2
    graph.replay()
    del graph, out, x
    torch.cuda.synchronize()
    pyalloc.empty_cache()
    after = pyalloc.memory_stats()
    assert after["allocated_bytes.all.current"] == before, (before, after)
    pyalloc.check_invariants()


@check
def a_second_graph_with_its_own_pool_never_takes_the_firsts_memory():
    # torch.cuda.graph's default capture stream is shared by every graph: without private
    # pools the second capture would reuse the first graph's freed intermediate, and
    # replaying the first would overwrite the second one's output.
    x = torch.ones(N, device="cuda")
    warm_up(lambda: (x * 2) + 1)
    first = torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        a = x * 2
        inner = a.data_ptr()
        out1 = a + 1
        del a
    second = torch.cuda.CUDAGraph()
    with torch.cuda.graph(second):
        out2 = x * 10
    assert out2.data_ptr() != inner, "the second graph's output took the first's intermediate"
    second.replay()
    first.replay()
    torch.cuda.synchronize()
    assert torch.equal(out2, torch.full_like(x, 10.0)), "replaying the first graph overwrote the second's output"
    assert torch.equal(out1, torch.full_like(x, 3.0))
    del first, second, out1, out2
    pyalloc.check_invariants()


@check
def a_graphs_pool_joins_the_cache_once_the_graph_is_gone():
    import gc

    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    before = pyalloc.memory_stats()["reserved_bytes.all.current"]
    x = torch.zeros(8 * N, device="cuda")
    warm_up(lambda: (x + 1) * 2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = (x + 1) * 2   # (x + 1) is freed inside: the pool keeps it
    del out
    torch.cuda.empty_cache()
    held = pyalloc.memory_stats()["reserved_bytes.all.current"]
    assert held >= before + 8 * N * 4, (before, held)  # x and the graph's memory stay
    del graph
    gc.collect()
    del x
    torch.cuda.empty_cache()
    after = pyalloc.memory_stats()["reserved_bytes.all.current"]
    assert after <= before, (before, held, after)
    pyalloc.check_invariants()


@check
def mem_pool_says_what_to_do_under_pyalloc():
    # PyTorch builds MemPool only on its own allocator (a pluggable one raises from C++).
    try:
        torch.cuda.MemPool()
    except RuntimeError as exc:
        assert "pyalloc" in str(exc) and "reduce-overhead" in str(exc), exc
    else:
        print("  (this torch builds MemPool under a pluggable allocator)")


@check
def capture_under_a_policy_refuses():
    x = torch.ones(N, device="cuda", requires_grad=True)
    with pyalloc.recompute():
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                (x * 2).sum()
        except RuntimeError as exc:
            assert "not supported while policy" in str(exc), exc
        else:
            raise AssertionError("capture under a policy did not refuse")
    torch.cuda.synchronize()
    y = torch.ones(N, device="cuda") * 3  # the device still works after the refusal
    assert float(y.sum()) == 3.0 * N


s = pyalloc.memory_stats()
print(f"syncs {s.get('num_sync_all_streams')} maps {s.get('num_segment_maps')} "
      f"unmaps {s.get('num_segment_unmaps')}")
if failed:
    print("failed:", " ".join(failed))
    sys.exit(1)
print("ok")
