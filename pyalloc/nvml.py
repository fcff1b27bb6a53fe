"""The device-wide picture from NVML: memory of the whole GPU, other processes' use, and
PCIe throughput (what swapping moves), next to pyalloc's own figures.

NVML comes from nvidia-ml-py (imported as ``pynvml``), the ``gpu`` extra
(``pip install 'pyalloc[gpu]'``). Without it, or without a driver, :func:`device_view`
returns ``None`` and a line saying why, and everything that shows the view says that line
instead. No torch: ``pyalloc-stats`` imports this.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

MISSING = "NVML unavailable: pynvml is not installed (pip install 'pyalloc[gpu]', which brings nvidia-ml-py)"

_init_lock = threading.Lock()
_initialized = False


@dataclass
class DeviceView:
    """One GPU as NVML sees it. Bytes, except PCIe throughput (KiB/s, NVML's unit)."""
    index: int
    name: str
    total: int
    used: int
    free: int
    processes: List[Tuple[int, Optional[int]]] = field(default_factory=list)  # (pid, bytes)
    pcie_tx_kib_s: Optional[int] = None
    pcie_rx_kib_s: Optional[int] = None


def _nvml() -> Any:
    global _initialized
    import pynvml  # ImportError: the caller says MISSING

    with _init_lock:
        if not _initialized:
            pynvml.nvmlInit()
            _initialized = True
    return pynvml


def device_view(index: int = 0) -> Tuple[Optional[DeviceView], str]:
    """The view of GPU ``index``, or ``(None, why)`` when NVML cannot give it."""
    try:
        nvml = _nvml()
    except ImportError:
        return None, MISSING
    except Exception as error:  # pynvml.NVMLError: no driver, no device
        return None, f"NVML unavailable: {error}"
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        view = DeviceView(index=index, name=name.decode() if isinstance(name, bytes) else str(name),
                          total=int(memory.total), used=int(memory.used), free=int(memory.free))
    except Exception as error:
        return None, f"NVML: device {index}: {error}"
    try:
        view.processes = [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                          for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except Exception:
        pass  # not permitted in some containers; the memory figures stand alone
    try:
        view.pcie_tx_kib_s = int(nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES))
        view.pcie_rx_kib_s = int(nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES))
    except Exception:
        pass  # not on every GPU
    return view, ""


def view_rows(view: Optional[DeviceView], why: str, own_pid: Optional[int],
              format_bytes: Any) -> List[Tuple[str, str]]:
    """Rows for a report: the GPU's memory, the other processes on it, PCIe throughput."""
    if view is None:
        return [("device (NVML)", why)]
    others = [(pid, used) for pid, used in view.processes if pid != own_pid]
    rows = [("device (NVML)", f"{view.name} #{view.index}: {format_bytes(view.used)} used, "
                              f"{format_bytes(view.free)} free of {format_bytes(view.total)}"),
            ("other processes", ", ".join(
                f"pid {pid} {format_bytes(used) if used is not None else '(use not reported)'}"
                for pid, used in others) or "none")]
    if view.pcie_tx_kib_s is not None and view.pcie_rx_kib_s is not None:
        rows.append(("PCIe to host / to device",
                     f"{format_bytes(view.pcie_tx_kib_s * 1024)}/s / "
                     f"{format_bytes(view.pcie_rx_kib_s * 1024)}/s"))
    return rows
