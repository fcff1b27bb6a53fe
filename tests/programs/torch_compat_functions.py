"""pyalloc.torch_compat's torch.cuda-style memory functions on the simulated device.

tests/test_trace_replay.py runs it as ``python tests/programs/torch_compat_functions.py``:
each function must report the installed engine's figure. Prints ``ok`` at the end.
"""
from __future__ import annotations

import torch

import pyalloc
from pyalloc import torch_compat as tc


def main() -> None:
    pyalloc.install(device="cpu", budget="256MiB")
    x = torch.empty(5 << 20, dtype=torch.uint8)
    s = pyalloc.memory_stats()
    assert tc.memory_allocated() == s["allocated_bytes.all.current"] >= 5 << 20
    assert tc.memory_reserved() == s["reserved_bytes.all.current"]
    assert tc.max_memory_allocated() == s["allocated_bytes.all.peak"]
    assert tc.max_memory_reserved() == s["reserved_bytes.all.peak"]
    assert list(tc.memory_stats()) == sorted(s)
    del x
    tc.reset_peak_memory_stats()
    assert tc.max_memory_allocated() == tc.memory_allocated()
    summary = tc.memory_summary()
    assert "Allocated memory" in summary and "pyalloc: utilization" in summary
    print("ok")


if __name__ == "__main__":
    main()
