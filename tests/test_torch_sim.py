"""PyTorch on the simulated device: install(), training equivalence, stats vs live tensors, OOM.

install() is one-way per process, so every test that installs runs in a subprocess.
"""
from __future__ import annotations

import pytest
import torch

import pyalloc
from conftest import run_program, training_record


@pytest.mark.slow
def test_training_is_bit_identical_with_and_without_pyalloc():
    with_pyalloc = run_program("sim_training", "--pyalloc")
    without = run_program("sim_training")
    assert len(training_record(with_pyalloc)) == 7
    assert training_record(with_pyalloc) == training_record(without)
    assert "served" in with_pyalloc  # the engine really served the run's tensors


def test_memory_stats_agree_with_live_tensors():
    run_program("memory_stats_vs_tensors")


@pytest.mark.slow
def test_oom_is_a_torch_oom_with_a_report_and_training_continues():
    out = run_program("oom_then_train")
    assert "oom at batch 16384" in out and "trained at batch" in out


@pytest.mark.slow
def test_pyalloc_conf_and_keyword_arguments():
    conf = {"PYALLOC_CONF": "budget:96MiB,sim_capacity:1GiB"}
    out = run_program("print_budget", env=conf)
    assert out.split() == [str(96 << 20), str(1 << 30)]
    out = run_program("print_budget", "--budget", "50%", env=conf)
    assert out.split() == [str(512 << 20), str(1 << 30)]


def test_second_install_and_auto_notice():
    out = run_program("install_twice")
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
    (dict(device="cpu", policy="recompute", spill=False, host_pool="1GiB"),
     "host_pool is 1073741824 bytes but spill is false.*leave host_pool unset"),
    (dict(spill="sometimes"), "expected true or false"),
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


def test_a_gpu_without_a_cuda_backend_is_an_error_not_the_simulated_device(monkeypatch):
    # Only a build configured with -DPYALLOC_CUDA=OFF lacks the backend (Note [Declaring the
    # driver API ourselves] in allocator/src/cuda_driver.h). On a GPU, "auto" once installed
    # the simulated device there, which serves none of the model's CUDA tensors, silently.
    from pyalloc import _lib, installer

    real = _lib.lib()

    class NoBackend:  # the library, but for the one question
        def __getattr__(self, name):
            return (lambda: 0) if name == "pyalloc_has_cuda_backend" else getattr(real, name)

    monkeypatch.setattr(_lib, "lib", NoBackend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for device in ("auto", "cuda"):
        with pytest.raises(RuntimeError, match="-DPYALLOC_CUDA=OFF.*needs no CUDA toolkit"):
            pyalloc.install(device=device)
        assert not pyalloc.is_installed()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert installer._resolve_device("auto") == "cpu"


def test_every_build_has_a_cuda_backend():
    # It needs no toolkit, so a GPU machine without one still gets it.
    from pyalloc import _lib
    assert _lib.lib().pyalloc_has_cuda_backend()


def test_stats_before_install_raise():
    with pytest.raises(pyalloc.PyallocError, match="not installed"):
        pyalloc.memory_stats()


def test_a_forked_child_gets_simulated_device_memory_of_its_own():
    # Found by tools/user_programs/dataloader_workers.py (DataLoader workers, fork): Note
    # [The simulated device after fork] in allocator/src/host_backend.cpp.
    assert run_program("fork_children_own_memory", env={"OMP_NUM_THREADS": "1"}).strip().endswith("ok")


def test_a_forked_child_swaps_on_streams_of_its_own():
    # Found by tools/user_programs/hogwild_share_memory.py: a child forked under hybrid
    # waited for ever for a copy on a stream whose worker thread the fork had not copied.
    out = run_program("fork_child_under_swap", timeout=180, env={"OMP_NUM_THREADS": "1"})
    assert out.strip().endswith("ok")
