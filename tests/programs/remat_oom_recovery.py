"""An out-of-memory error in a step under recompute leaves the training state as it was.

tests/test_remat.py runs it as ``python tests/programs/remat_oom_recovery.py``. It trains
the CNN two steps under ``policy="recompute"`` with Adam, lowers the budget to 2 MiB above
what is allocated, and tries a step: ``oom: <first line of the error>`` (or ``no error``).
The model and the optimizer must be unchanged by the failed step and no node left pinned;
with the budget back it trains two more steps (``recovered True`` when the loss is finite),
and a snapshot carries the registry's counters (``snapshot has remat counters True``).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile

import torch

import pyalloc


def main() -> None:
    pyalloc.install(device="cpu", budget="2GiB", policy="recompute")
    from pyalloc import registry
    from pyalloc.bench.models import TASKS

    task = TASKS["cnn"]
    torch.manual_seed(0)
    model = task.build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = task.batch(64, torch.Generator().manual_seed(1))

    def digest():
        h = hashlib.sha256()
        for t in list(model.state_dict().values()) + [
                v for s in opt.state_dict()["state"].values() for v in s.values()]:
            h.update(t.detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    for _ in range(2):
        opt.zero_grad()
        task.loss(model, x, y).backward()
        opt.step()
    before = digest()
    engine = pyalloc._engine(None)
    engine.set_budget(int(pyalloc.memory_stats()["allocated_bytes.all.current"]) + (2 << 20))
    try:
        opt.zero_grad()
        task.loss(model, x, y).backward()
        opt.step()
        print("no error")
    except torch.OutOfMemoryError as e:
        print("oom:", str(e).splitlines()[0])
    assert digest() == before, "the failed step changed the model or the optimizer"
    assert all(n.pins == 0 for n in registry.active().nodes.values()), "pins leaked"
    pyalloc.check_invariants()
    engine.set_budget(2 << 30)
    for _ in range(2):
        opt.zero_grad()
        loss = task.loss(model, x, y)
        loss.backward()
        opt.step()
    print("recovered", torch.isfinite(loss).item())
    path = pyalloc.save_snapshot(os.path.join(tempfile.mkdtemp(), "snap.json"))
    with open(path) as f:
        print("snapshot has remat counters", "remat.recomputes" in json.load(f)["stats"])


if __name__ == "__main__":
    main()
