"""torch.cuda's memory functions report pyalloc's figures when pyalloc is installed.

tests/test_gpu.py runs it as ``python tests/programs/gpu_torch_cuda_memory_functions.py``
(needs a GPU). Prints ``ok`` at the end.
"""
from __future__ import annotations

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cuda", budget="2GiB")
    x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    s = pyalloc.memory_stats()
    assert torch.cuda.memory_allocated() == s["allocated_bytes.all.current"] >= 100 << 20
    assert torch.cuda.memory_reserved() == s["reserved_bytes.all.current"]
    assert torch.cuda.max_memory_allocated(0) == s["allocated_bytes.all.peak"]
    assert (torch.cuda.max_memory_reserved(torch.device("cuda:0"))
            == s["reserved_bytes.all.peak"])
    assert torch.cuda.memory_stats()["num_ooms"] == 0
    del x
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    summary = torch.cuda.memory_summary()
    assert "Allocated memory" in summary and "pyalloc: utilization" in summary
    print("ok")


if __name__ == "__main__":
    main()
