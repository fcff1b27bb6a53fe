"""NVML's device-wide view (pyalloc/nvml.py) in pyalloc-stats watch, with a stand-in for
pynvml: the real one needs a driver (the GPU tests run it)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from pyalloc import nvml
from pyalloc.stats_cli.common import format_bytes
from pyalloc.stats_cli.watch import frame_sections

MiB = 1 << 20


def fake_pynvml(processes_fail: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_PCIE_UTIL_TX_BYTES, m.NVML_PCIE_UTIL_RX_BYTES = 0, 1
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=80 * 1024 * MiB, used=30 * 1024 * MiB, free=50 * 1024 * MiB)

    def processes(h):
        if processes_fail:
            raise RuntimeError("NVML_ERROR_NO_PERMISSION")
        return [types.SimpleNamespace(pid=4242, usedGpuMemory=20 * 1024 * MiB),
                types.SimpleNamespace(pid=77, usedGpuMemory=None)]

    m.nvmlDeviceGetComputeRunningProcesses = processes
    m.nvmlDeviceGetPcieThroughput = lambda h, which: 12_000_000 if which == 0 else 3_000
    return m


@pytest.fixture
def pynvml(monkeypatch):
    def install(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        monkeypatch.setattr(nvml, "_initialized", False)
    return install


def test_device_view_reads_memory_processes_and_pcie(pynvml):
    pynvml(fake_pynvml())
    view, why = nvml.device_view(0)
    assert why == "" and view.name == "NVIDIA H100 80GB HBM3"
    assert (view.total, view.used, view.free) == (80 << 30, 30 << 30, 50 << 30)
    assert view.processes == [(4242, 20 << 30), (77, None)]
    assert (view.pcie_tx_kib_s, view.pcie_rx_kib_s) == (12_000_000, 3_000)
    rows = dict(nvml.view_rows(view, why, own_pid=4242, format_bytes=format_bytes))
    assert rows["device (NVML)"].startswith("NVIDIA H100 80GB HBM3 #0: 30.00 GiB used")
    assert rows["other processes"] == "pid 77 (use not reported)"   # its own pid left out
    assert "11.44 GiB/s" in rows["PCIe to host / to device"]


def test_a_process_list_nvml_refuses_leaves_the_memory_figures(pynvml):
    pynvml(fake_pynvml(processes_fail=True))
    view, _ = nvml.device_view(0)
    assert view.processes == [] and view.total == 80 << 30


def test_without_pynvml_the_view_says_how_to_get_it(pynvml):
    pynvml(None)   # import pynvml raises ImportError
    view, why = nvml.device_view(0)
    assert view is None and "pip install 'pyalloc[gpu]'" in why
    assert nvml.view_rows(view, why, None, format_bytes) == [("device (NVML)", why)]


def test_watch_shows_the_device_wide_picture_for_a_cuda_process(pynvml):
    pynvml(fake_pynvml())
    stats = {"allocated_bytes.all.current": 10 * MiB, "budget_bytes": 64 * MiB}
    doc = {"pid": 4242, "device": "cuda", "time": "now", "stats": stats}
    rows = dict(frame_sections(doc, Path("s.json"), [10 * MiB], True, 0.0, 1.0)[0].rows)
    assert rows["device (NVML)"].startswith("NVIDIA H100")
    assert rows["other processes"] == "pid 77 (use not reported)"
    doc["device"] = "cpu"   # the simulated device: no NVML rows
    rows = dict(frame_sections(doc, Path("s.json"), [10 * MiB], True, 0.0, 1.0)[0].rows)
    assert "device (NVML)" not in rows
