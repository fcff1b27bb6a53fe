"""PyTorch on the simulated device: install(), training equivalence, stats vs live tensors, OOM.

install() is one-way per process, so every test that installs runs in a subprocess.
"""
from __future__ import annotations

import pytest
import torch

import pyalloc
from conftest import PARAM_DIGEST, run_in_subprocess, training_record

TRAIN = """
import sys, torch
from torch import nn
if {install}:
    import pyalloc
    pyalloc.install(device="cpu", budget="512MiB")
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
    nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
x = torch.randn(16, 3, 24, 24); y = torch.randint(0, 10, (16,))
for step in range(6):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print("loss", loss.item().hex())
{digest}
if {install}:
    s = pyalloc.memory_stats()
    assert s["num_device_alloc"] > 0 and s["allocation.all.allocated"] > 100, s
    pyalloc.check_invariants()
    print("served", s["allocation.all.allocated"])
"""


@pytest.mark.slow
def test_training_is_bit_identical_with_and_without_pyalloc():
    with_pyalloc = run_in_subprocess(TRAIN.format(digest=PARAM_DIGEST, install=True))
    without = run_in_subprocess(TRAIN.format(digest=PARAM_DIGEST, install=False))
    assert len(training_record(with_pyalloc)) == 7
    assert training_record(with_pyalloc) == training_record(without)
    assert "served" in with_pyalloc  # the engine really served the run's tensors


def test_memory_stats_agree_with_live_tensors():
    run_in_subprocess("""
        import torch, pyalloc
        pyalloc.install(device="cpu", budget="256MiB")
        base = pyalloc.memory_stats()
        sizes = [1, 100, 4096, 300_000, 3 << 20, 12 << 20]   # small and large pool
        tensors = [torch.empty(n, dtype=torch.uint8) for n in sizes]
        s = pyalloc.memory_stats()
        assert s["requested_bytes.all.current"] - base["requested_bytes.all.current"] == sum(sizes)
        assert s["allocation.all.current"] - base["allocation.all.current"] == len(sizes)
        # allocated bytes are the sizes of exactly the blocks these tensors sit in
        blocks = {b["address"]: b for seg in pyalloc.snapshot()["segments"] for b in seg["blocks"]}
        mine = [blocks[t.data_ptr()] for t in tensors]
        assert all(b["state"] == "active_allocated" for b in mine)
        assert [b["requested_size"] for b in mine] == sizes
        assert (s["allocated_bytes.all.current"] - base["allocated_bytes.all.current"]
                == sum(b["size"] for b in mine))
        del tensors
        s = pyalloc.memory_stats()
        for key in ("requested_bytes.all.current", "allocated_bytes.all.current", "allocation.all.current"):
            assert s[key] == base[key], key
        pyalloc.check_invariants()
        print("ok")
    """)


@pytest.mark.slow
def test_oom_is_a_torch_oom_with_a_report_and_training_continues():
    out = run_in_subprocess("""
        import torch, pyalloc
        from torch import nn
        pyalloc.install(device="cpu", budget="96MiB")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(batch):
            x = torch.randn(batch, 512); y = torch.randint(0, 10, (batch,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        before = [p.detach().clone() for p in model.parameters()]
        batch = 16384
        while True:
            try:
                step(batch)
                break
            except torch.OutOfMemoryError as e:
                msg = str(e)
                assert "out of memory" in msg and "budget 96.00 MiB" in msg, msg
                assert "allocated" in msg and "cached free" in msg and "hint:" in msg, msg
                print("oom at batch", batch)
                batch //= 2
        pyalloc.check_invariants()
        assert pyalloc.memory_stats()["num_ooms"] >= 1
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        for _ in range(3):
            step(batch)
        print("trained at batch", batch)
    """)
    assert "oom at batch 16384" in out and "trained at batch" in out


@pytest.mark.slow
def test_pyalloc_conf_and_keyword_arguments():
    out = run_in_subprocess("""
        import pyalloc
        pyalloc.install(device="cpu")
        print(pyalloc.memory_stats()["budget_bytes"])
    """, env={"PYALLOC_CONF": "budget:96MiB,sim_capacity:1GiB"})
    assert out.strip() == str(96 << 20)
    out = run_in_subprocess("""
        import pyalloc
        pyalloc.install(device="cpu", budget="50%")
        s = pyalloc.memory_stats()
        print(s["budget_bytes"], s["device_total_bytes"])
    """, env={"PYALLOC_CONF": "budget:96MiB,sim_capacity:1GiB"})
    assert out.split() == [str(512 << 20), str(1 << 30)]


def test_second_install_and_auto_notice():
    out = run_in_subprocess("""
        import logging, torch, pyalloc
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        assert pyalloc.install() == ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            pyalloc.install(device="cpu")
        except RuntimeError as e:
            print("second:", e)
    """)
    assert "second: pyalloc is already installed" in out


@pytest.mark.parametrize("kwargs, match", [
    (dict(device="gpu"), 'device must be "auto", "cuda" or "cpu"'),
    (dict(bogus=1), "unknown pyalloc option 'bogus'; known options are: .*budget"),
    (dict(budget="abc"), "invalid value 'abc' for pyalloc option 'budget'"),
    (dict(budget="150%"), "invalid value '150%' for pyalloc option 'budget'"),
    (dict(budget=-5), "budget must be positive"),
    (dict(budget=1.5), r"fraction of device memory and must be in \(0, 1\]"),
    (dict(max_split_size="12 parsecs"), "expected a size such as"),
    (dict(check_invariants="maybe"), "expected true or false"),
    (dict(max_split_size="1,2"), "',' and ':' are not allowed"),
])
def test_bad_install_arguments_raise_before_installing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pyalloc.install(**kwargs)
    assert not pyalloc.is_installed()


def test_malformed_pyalloc_conf(monkeypatch):
    monkeypatch.setenv("PYALLOC_CONF", "budget8GiB")
    with pytest.raises(ValueError, match="malformed PYALLOC_CONF entry 'budget8GiB'"):
        pyalloc.install(device="cpu")
    assert not pyalloc.is_installed()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu_names_the_fix():
    with pytest.raises(RuntimeError, match='device="cpu" for the simulated device'):
        pyalloc.install(device="cuda")
    assert not pyalloc.is_installed()


def test_stats_before_install_raise():
    with pytest.raises(pyalloc.PyallocError, match="not installed"):
        pyalloc.memory_stats()
