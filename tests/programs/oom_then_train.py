"""An out-of-memory error on the simulated device is a torch OOM with a report; training goes on.

tests/test_torch_sim.py runs it as ``python tests/programs/oom_then_train.py``. Under a
96 MiB budget it trains an MLP at a batch of 16384, halving the batch after each OOM
(``oom at batch <n>``, each error checked for the report's parts) until a step succeeds,
then trains three more steps at that batch (``trained at batch <n>``).
"""
from __future__ import annotations

import torch
from torch import nn

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", budget="96MiB")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        x = torch.randn(batch, 512)
        y = torch.randint(0, 10, (batch,))
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


if __name__ == "__main__":
    main()
