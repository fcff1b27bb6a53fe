"""Under INPLACE_UPDATE an optimizer the mode does not mirror runs PyTorch's own step, in place.

tests/test_inplace.py runs it as ``python tests/programs/inplace_other_optimizers.py``. It
trains a linear layer three steps with RMSprop and prints ``state persistent <bool>``
(the optimizer's state sits in persistent segments) and ``grad kept <bool>``.
"""
from __future__ import annotations

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", budget="2GiB", inplace_update=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    segments = pyalloc.snapshot()["segments"]
    persistent = [(s["address"], s["address"] + s["total_size"]) for s in segments
                  if s["segment_type"] == "persistent"]
    state = [t for s in opt.state.values() for t in s.values()
             if isinstance(t, torch.Tensor) and t.dim()]
    print("state persistent",
          all(any(lo <= t.data_ptr() < hi for lo, hi in persistent) for t in state))
    print("grad kept", model.weight.grad is not None)


if __name__ == "__main__":
    main()
