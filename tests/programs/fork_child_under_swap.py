"""os.fork() under policy swap on the simulated device: the child swaps on streams of its
own. A fork copies only the calling thread, so the child had none of the streams' workers,
and its first wait for a copy (a swap, a fence) waited for ever (found by
tools/user_programs/hogwild_share_memory.py: Note [The simulated device after fork] in
allocator/src/host_backend.cpp). Parent and child train the same three steps from the same
state, each evicting under the budget, and must get the same bits. Prints "ok"."""
import os
import struct

import torch

import pyalloc

pyalloc.install(device="cpu", budget="40MiB", policy="swap", host_pool="256MiB")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
x = torch.randn(2048, 512)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train(steps: int) -> list:
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


train(1)   # swaps under the budget: the streams have done work before the fork
read, write = os.pipe()
pid = os.fork()
if pid == 0:                             # the child
    swaps = pyalloc.memory_stats()["remat.swap_outs"]
    losses = train(3)
    moved = pyalloc.memory_stats()["remat.swap_outs"] - swaps
    os.write(write, struct.pack("<3dq", *losses, moved))
    os._exit(0)
ours = train(3)
os.waitpid(pid, 0)
*theirs, moved = struct.unpack("<3dq", os.read(read, 32))
assert moved > 0, "the child swapped nothing: the test does not exercise its streams"
assert theirs == ours, f"the child trained to other bits: {theirs} against {ours}"
print("ok")
