"""GPU tests: pyalloc as PyTorch's CUDA allocator. Skipped cleanly without CUDA.

Each test installs pyalloc in a fresh interpreter (install() is one-way per process).
"""
from __future__ import annotations

import pytest

from conftest import PARAM_DIGEST, run_in_subprocess, train, training_record

pytestmark = pytest.mark.gpu

MLP_RUN = """
import torch
from torch import nn
if {install}:
    import pyalloc
    pyalloc.install(device="cuda", budget="4GiB")
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Dropout(0.1), nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(512, 256, device="cuda"); y = torch.randint(0, 10, (512,), device="cuda")
for _ in range(8):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print("loss", loss.item().hex())
{digest}
if {install}:
    s = pyalloc.memory_stats()
    live = sum(p.numel() * p.element_size() for p in model.parameters())
    assert s["allocated_bytes.all.current"] >= live, s
    assert s["reserved_bytes.all.current"] <= 4 << 30
    pyalloc.check_invariants()
    print("served", s["allocation.all.allocated"])
"""


def test_training_on_gpu_is_bit_identical_to_native_allocator():
    mine = run_in_subprocess(MLP_RUN.format(digest=PARAM_DIGEST, install=True))
    native = run_in_subprocess(MLP_RUN.format(digest=PARAM_DIGEST, install=False))
    assert len(training_record(mine)) == 9
    assert training_record(mine) == training_record(native)
    assert "served" in mine


def test_hooks_empty_cache_memory_fraction_record_stream():
    run_in_subprocess("""
        import torch, pyalloc
        pyalloc.install(device="cuda")
        total = pyalloc.memory_stats()["device_total_bytes"]
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        del x
        assert pyalloc.memory_stats()["reserved_bytes.all.current"] >= 64 << 20
        torch.cuda.empty_cache()                          # reset hook
        assert pyalloc.memory_stats()["reserved_bytes.all.current"] == 0
        torch.cuda.set_per_process_memory_fraction(0.25)  # memory-fraction hook
        assert pyalloc.memory_stats()["budget_bytes"] == int(0.25 * total)
        side = torch.cuda.Stream()
        y = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            y.mul_(2)
            # Keep the side stream busy after its last use of y. (On the H100 this was
            # checked on, a launch behind a long-running kernel blocked the host until that
            # kernel finished — with PyTorch's own allocator too — so the long kernel goes
            # last, where nothing waits for it.)
            torch.cuda._sleep(2_000_000_000)
        y.record_stream(side)                             # record_stream hook
        y_ptr = y.data_ptr()
        del y
        s = pyalloc.memory_stats()
        assert s["pending_frees"] == 1, s                 # waits for the side stream
        z = torch.empty(1 << 20, device="cuda")           # the side stream still uses y's block
        assert not side.query(), "side stream finished too early; the test proves nothing"
        assert z.data_ptr() != y_ptr
        torch.cuda.synchronize()
        pyalloc.empty_cache()
        assert pyalloc.memory_stats()["pending_frees"] == 0
        pyalloc.check_invariants()
        print("ok")
    """)


def test_cross_stream_reuse_never_corrupts():
    run_in_subprocess("""
        import random, torch, pyalloc
        pyalloc.install(device="cuda", budget="512MiB")
        rng = random.Random(0)
        streams = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(3)]
        live = []
        for i in range(3000):
            if live and (len(live) > 40 or rng.random() < 0.45):
                t, value, s = live.pop(rng.randrange(len(live)))
                with torch.cuda.stream(s):
                    assert bool((t == value).all()), f"block clobbered at step {i}"
                continue
            s = rng.choice(streams)
            n = rng.choice([1 << 10, 1 << 16, 1 << 20, 3 << 20, 9 << 20]) // 4
            with torch.cuda.stream(s):
                t = torch.full((n,), float(i), device="cuda")
            live.append((t, float(i), s))
        torch.cuda.synchronize()
        s = pyalloc.memory_stats()
        pyalloc.check_invariants()
        print("fences", s["num_stream_fences"], "retries", s["num_alloc_retries"])
    """)


def test_oom_under_budget_reports_and_recovers(tmp_path):
    out = run_in_subprocess("""
        import torch, pyalloc
        pyalloc.install(device="cuda", budget="1GiB")
        keep = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(768 << 20, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:   # raised by the torch shim's entry point
            assert "out of memory" in str(e) and "budget 1.00 GiB" in str(e), str(e)
            print("oom reported")
        small = torch.ones(16 << 20, device="cuda")        # 64 MiB of float32
        assert small.sum().item() == 16 << 20
        pyalloc.check_invariants()
        assert pyalloc.memory_stats()["num_ooms"] == 1
        # The layout the request failed in, kept by the engine (the 64 MiB tensor came later).
        import json
        doc = json.load(open(pyalloc.save_snapshot({path!r}, at_oom=True)))
        assert doc["oom"]["size"] == 768 << 20 and doc["backend"] == "cuda", doc["oom"]
        live = sum(b["size"] for seg in doc["segments"] for b in seg["blocks"]
                   if b["state"] == "active_allocated")
        assert 512 << 20 <= live < 768 << 20, live   # `keep`, and nothing of the failed request
        print("oom snapshot ok")
    """.format(path=str(tmp_path / "oom.json")))
    assert "oom reported" in out and "oom snapshot ok" in out


def test_install_after_cuda_init_says_what_to_do():
    out = run_in_subprocess("""
        import torch, pyalloc
        torch.zeros(1, device="cuda")
        try:
            pyalloc.install(device="cuda")
        except RuntimeError as e:
            print(e)
        assert not pyalloc.is_installed()
    """)
    assert "Call pyalloc.install() first thing" in out


def test_engine_handle_on_cuda():
    run_in_subprocess("""
        import pyalloc
        with pyalloc.Engine("cuda", budget="1GiB") as e:
            ptrs = [e.alloc(n) for n in (0, 1, 4096, 5 << 20, 40 << 20)]
            assert len(set(ptrs)) == len(ptrs)
            e.check_invariants()
            for p in ptrs:
                e.free(p)
            e.empty_cache()
            assert e.stats()["reserved_bytes.all.current"] == 0
            try:
                e.stress()
            except pyalloc.PyallocError as err:
                assert "simulated device" in str(err)
        print("ok")
    """)


def test_torch_cuda_memory_functions_report_pyalloc_figures():
    run_in_subprocess("""
        import torch, pyalloc
        pyalloc.install(device="cuda", budget="2GiB")
        x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
        s = pyalloc.memory_stats()
        assert torch.cuda.memory_allocated() == s["allocated_bytes.all.current"] >= 100 << 20
        assert torch.cuda.memory_reserved() == s["reserved_bytes.all.current"]
        assert torch.cuda.max_memory_allocated(0) == s["allocated_bytes.all.peak"]
        assert torch.cuda.max_memory_reserved(torch.device("cuda:0")) == s["reserved_bytes.all.peak"]
        assert torch.cuda.memory_stats()["num_ooms"] == 0
        del x
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
        summary = torch.cuda.memory_summary()
        assert "Allocated memory" in summary and "pyalloc: utilization" in summary
        print("ok")
    """)


def test_trace_on_gpu_replays_to_the_same_peak(tmp_path):
    run_in_subprocess(f"""
        import torch, pyalloc
        from torch import nn
        from pyalloc.replay import replay
        pyalloc.install(device="cuda", budget="4GiB")
        path = {str(tmp_path / 'gpu.json.gz')!r}
        with pyalloc.record_trace(path):
            model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
            opt = torch.optim.AdamW(model.parameters())
            for _ in range(5):
                x = torch.randn(256, 1024, device="cuda")
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
            torch.cuda.synchronize()
        trace = pyalloc.files.load(path)
        r = replay(trace)
        live = trace["final"]["stats"]
        assert r.peak_reserved == live["reserved_bytes.all.peak"], (r.peak_reserved, live["reserved_bytes.all.peak"])
        print("ok", r.peak_reserved)
    """)


# cuDNN picks its convolution algorithm by the workspace it can get: under a tight budget
# PyTorch catches the failed workspace allocation and falls back to another algorithm,
# which rounds differently (as with the native allocator under a memory cap). Convolutions
# without cuDNN use fixed workspaces, so the comparison isolates what pyalloc does.
GPU_SETUP = """
torch.backends.cudnn.enabled = False
"""
# CUDA backward runs on autograd's device thread: the registry's per-op path must run there
# too (the dispatch key travels in the graph task's thread-local state), or backward ops
# would read storages the registry could evict under them. The registry counts the threads
# other than the one that started it that ran ops through it ("backward_threads").
GPU_REPORT = ""
# Half the peak, not the 35% of the simulated-device tests: on the GPU more must stay
# resident (cuDNN workspaces; cuBLAS's, one per handle, so per thread: the forward's and
# the backward's). The small cuBLAS workspace setting keeps the latter from dominating
# these small models.
GPU_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}


def train_on_gpu(task: str, batch: int, budget, **options) -> dict:
    return train(task, budget, steps=10, batch=batch, device="cuda", setup=GPU_SETUP,
                 report=GPU_REPORT, env=GPU_ENV, **options)


@pytest.mark.parametrize("task,batch", [("cnn", 64), ("transformer", 32)])
def test_recompute_on_gpu_is_bit_identical_at_half_the_peak(task, batch):
    free = train_on_gpu(task, batch, "8GiB")
    budget = int(0.5 * free["peak"])
    tight = train_on_gpu(task, batch, budget, policy="recompute")
    assert tight["record"] == free["record"]
    assert tight["peak"] <= budget and tight["recomputes"] > 0, tight
    assert tight["backward_threads"] == 1, tight   # the backward thread went through the registry


@pytest.mark.parametrize("policy", ["swap", "hybrid"])
@pytest.mark.parametrize("task,batch", [("cnn", 64), ("transformer", 32)])
def test_swap_on_gpu_is_bit_identical_at_half_the_peak(task, batch, policy):
    free = train_on_gpu(task, batch, "8GiB")
    budget = int(0.5 * free["peak"])
    tight = train_on_gpu(task, batch, budget, policy=policy, host_pool="2GiB")
    assert tight["record"] == free["record"]
    assert tight["peak"] <= budget, tight
    assert tight["swap_ins"] > 0 or policy == "hybrid", tight
    assert tight["backward_threads"] == 1, tight


def test_swap_copies_on_gpu_are_stream_ordered():
    # The engine alone on CUDA: pinned host pool, copies on its own streams. The swapped-out
    # block is freed at once and its memory reused by the next tensor, which is written at
    # once: the swap-out must still have copied the old bytes.
    out = run_in_subprocess("""
        import time, torch, pyalloc
        pyalloc.install(device="cuda", budget="300MiB")   # room for one 256 MiB tensor
        engine = pyalloc._engine(None)
        engine.set_host_pool(512 << 20)
        stream = torch.cuda.current_stream().cuda_stream
        n = 256 << 20
        x = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        want = x.cpu()
        slot = engine.swap_out(x.data_ptr(), n, stream)
        x.untyped_storage().resize_(0)              # free now; reuse only after the copy
        y = torch.zeros(n, dtype=torch.uint8, device="cuda")
        y.fill_(7)
        engine.swap_in(slot, y.data_ptr(), stream)
        engine.swap_wait(slot, stream)
        assert torch.equal(y.cpu(), want)
        engine.swap_release(slot)
        # Throughput, for the log (tools/bench_swap.py measures it properly).
        torch.cuda.synchronize()
        t = time.perf_counter()
        slot = engine.swap_out(y.data_ptr(), n, stream)
        engine.synchronize()
        out_s = time.perf_counter() - t
        t = time.perf_counter()
        engine.swap_in(slot, y.data_ptr(), stream)
        engine.swap_wait(slot, stream)
        torch.cuda.synchronize()
        print("ok", "out GB/s", n / out_s / 1e9, "in GB/s", n / (time.perf_counter() - t) / 1e9)
    """)
    assert out.startswith("ok")


def test_inplace_update_on_gpu_trains_identically_with_no_allocation_in_step():
    # On CUDA PyTorch's Adam defaults to its foreach kernels; the in-place step uses the
    # single-tensor arithmetic. This checks that the two agree bit for bit on a GPU, and
    # that nothing is allocated inside step() in steady state (CPU scalars do not reach
    # the CUDA allocator).
    script = """
        import torch, pyalloc
        pyalloc.install(device="cuda", budget="4GiB", inplace_update={mode})
        from pyalloc.bench.models import TASKS
        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.enabled = False
        task = TASKS["transformer"]
        model = task.build().cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = task.batch(16, torch.Generator().manual_seed(1))
        x, y = x.cuda(), y.cuda()
        engine = pyalloc._engine(None)
        counts = []
        for step in range(5):
            opt.zero_grad(set_to_none=True)
            loss = task.loss(model, x, y)
            loss.backward()
            before = pyalloc.memory_stats()["allocation.all.allocated"]
            opt.step()
            counts.append(pyalloc.memory_stats()["allocation.all.allocated"] - before)
            print("loss", loss.item().hex())
        print("allocations in step", counts)
    """
    env = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    off = run_in_subprocess(script.format(mode=False), env=env)
    on = run_in_subprocess(script.format(mode=True), env=env)
    assert training_record(on) == training_record(off)
    counts = eval(on.split("allocations in step")[1].splitlines()[0])
    assert all(c == 0 for c in counts[1:]), counts


def test_stitching_on_gpu_maps_free_chunks_of_several_segments_and_keeps_data():
    # As tests/test_frag.py does on the simulated device, through PyTorch on a GPU: fill the
    # budget with 4 MiB tensors, free every other one, then ask for 12 MiB, which no hole
    # holds. Stitching maps the free chunks into one range (a handle per 2 MiB chunk, Note
    # [One handle per chunk] in cuda_backend.cpp); what is written through it must land in
    # the pieces, leave the survivors alone, and outlive the range.
    out = run_in_subprocess("""
        import torch, pyalloc
        pyalloc.install(device="cuda", budget="40MiB")
        MiB = 1 << 20

        def at(address, size):   # the device bytes at an address, without a copy
            class View:
                __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                            "data": (address, False), "version": 3}
            return torch.as_tensor(View(), device="cuda")

        blocks = [torch.full((4 * MiB,), i, dtype=torch.uint8, device="cuda") for i in range(10)]
        survivors = blocks[0::2]
        del blocks
        big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
        big.fill_(99)
        torch.cuda.synchronize()
        s = pyalloc.memory_stats()
        assert s["num_stitches"] == 1 and s["reserved_bytes.all.peak"] <= 40 * MiB, s
        ranges = pyalloc.snapshot()["stitched"]
        assert len(ranges) == 1 and ranges[0]["address"] == big.data_ptr(), ranges
        assert sum(size for _, size in ranges[0]["pieces"]) == 12 * MiB
        for address, size in ranges[0]["pieces"]:     # the same pages, seen at home
            assert bool((at(address, size) == 99).all())
        for i, t in enumerate(survivors):
            assert bool((t == 2 * i).all()), i
        pyalloc.check_invariants()
        del big                                       # waits for the stream, then unmaps
        assert pyalloc.snapshot()["stitched"] == []
        again = [torch.full((4 * MiB,), 7, dtype=torch.uint8, device="cuda") for _ in range(3)]
        torch.cuda.synchronize()
        for i, t in enumerate(survivors):
            assert bool((t == 2 * i).all()), i
        assert all(bool((t == 7).all()) for t in again)
        pyalloc.check_invariants()
        print("ok")
    """)
    assert out.startswith("ok")


def test_no_request_fails_on_gpu_while_free_chunks_would_hold_it():
    # The randomized patterns replayed through the CUDA backend itself (real mappings).
    from pyalloc.bench.patterns import PATTERNS
    from pyalloc.replay import replay

    for name, generate in sorted(PATTERNS.items()):
        trace = generate(seed=0)
        stitched = replay(trace, device="cuda", check_every=50)
        assert stitched.covered_failures == 0, name
        if name != "growing_batches":
            assert replay(trace, {"stitch": "false"}, device="cuda").covered_failures > 0, name
            assert stitched.num_stitches > 0, name


def test_expandable_segment_on_gpu_grows_trims_and_stitches_with_data_intact():
    # Option expandable through PyTorch on a GPU: tensors land back to back in one segment
    # that grows a 2 MiB chunk (one cuMemCreate handle) at a time; empty_cache unmaps the free
    # chunks at its end with the rest still mapped and intact; holes are stitched by their
    # per-chunk handles; the whole segment goes once nothing in it is live.
    out = run_in_subprocess("""
        import torch, pyalloc
        pyalloc.install(device="cuda", budget="40MiB", expandable=True)
        MiB = 1 << 20
        blocks = [torch.full((4 * MiB,), i, dtype=torch.uint8, device="cuda") for i in range(10)]
        large = [s for s in pyalloc.snapshot()["segments"] if s["segment_type"] == "large"]
        assert len(large) == 1 and large[0]["expandable"], large
        offsets = [b.data_ptr() - blocks[0].data_ptr() for b in blocks]
        assert offsets == [i * 4 * MiB for i in range(10)], offsets
        survivors = blocks[0::2]
        del blocks
        big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")   # no hole holds it
        big.fill_(99)
        torch.cuda.synchronize()
        assert pyalloc.memory_stats()["num_stitches"] == 1
        for i, t in enumerate(survivors):
            assert bool((t == 2 * i).all()), i
        del big, survivors[-1]
        torch.cuda.synchronize()
        pyalloc.empty_cache()
        s = pyalloc.memory_stats()
        assert s["num_segment_trims"] == 1, s
        seg = [s for s in pyalloc.snapshot()["segments"] if s["segment_type"] == "large"][0]
        tail = seg["blocks"][-1]     # live, or free but less than a chunk
        assert tail["state"] != "inactive" or tail["size"] < 2 * MiB, seg
        for i, t in enumerate(survivors):
            assert bool((t == 2 * i).all()), i
        more = torch.full((10 * MiB,), 5, dtype=torch.uint8, device="cuda")   # grows again
        torch.cuda.synchronize()
        assert bool((more == 5).all()) and pyalloc.memory_stats()["num_segment_grows"] > 0
        pyalloc.check_invariants()
        del more, survivors, t       # (the loops' variable holds a survivor too)
        pyalloc.empty_cache()
        assert pyalloc.memory_stats()["reserved_bytes.large_pool.current"] == 0
        print("ok")
    """)
    assert out.startswith("ok")


def test_compaction_on_gpu_moves_frozen_storages_with_their_contents_and_views():
    # tests/test_frag.py's case on CUDA: frozen storages between 1.5 MiB holes are moved
    # device to device (a storage copy on the current stream, the CUDA DataPtr and its
    # deleter context swapped into the storage) so that a 4 MiB request fits; contents,
    # views and version counters kept. Off, the same request is an OOM.
    from test_frag import check_compaction_moves_frozen_storages

    check_compaction_moves_frozen_storages("cuda")
