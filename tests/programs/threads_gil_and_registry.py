"""A trainer thread beside a thread that makes tensors from Python lists, under hybrid at a
budget that evicts: Note [Python's references under the registry's mutex] in
registry/src/backward.cpp. Before the fix, backward's final callback held the registry's
mutex while it waited for the GIL, and `torch.tensor(list)`, which keeps the GIL while its
lift_fresh waits for the mutex, closed the cycle: the process hung (in 2 of 4 runs of 100
steps; the race is not certain to show in a short run). Prints "finished" when the trainer
ends in time."""
import sys
import threading

import torch
import torch.nn as nn

import pyalloc

pyalloc.install(device="cpu", budget="10MiB", policy="hybrid", host_pool="1GiB")
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(8)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
stop = threading.Event()
data = [float(i) for i in range(200_000)]


def train():
    try:
        for _ in range(steps):
            out = model(torch.randn(1024, 256))
            opt.zero_grad()
            out.square().mean().backward()
            opt.step()
    finally:
        stop.set()


def make_tensors():
    while not stop.is_set():
        torch.tensor(data)


threads = [threading.Thread(target=train, daemon=True), threading.Thread(target=make_tensors, daemon=True)]
for t in threads:
    t.start()
threads[0].join(timeout=150)
finished = not threads[0].is_alive()
# The tensor maker stops once the trainer has: joined, so that no daemon thread is inside
# torch's C++ when the interpreter shuts down (a thread made to exit there while it waits
# for the GIL aborts the process: "terminate called without an active exception").
threads[1].join(timeout=60)
print("finished" if finished and not threads[1].is_alive() else "hung", flush=True)
