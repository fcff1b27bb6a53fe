"""os.fork() with pyalloc on the simulated device: the child gets memory of its own with
the parent's contents at fork time, as with PyTorch's allocator (Note [The simulated device
after fork] in allocator/src/host_backend.cpp). Before, the child's allocator copy handed out
the blocks the parent's did, in the same shared pages. Prints "ok"."""
import os
import sys

import torch

import pyalloc

pyalloc.install(device="cpu", budget="1GiB")
kept = torch.full((1 << 18,), 3.0)      # made before the fork: the child must see it
gone = torch.zeros(1 << 20)
del gone                                 # a free block in both allocators after the fork
read, write = os.pipe()
pid = os.fork()
if pid == 0:                             # the child
    ok = kept.sum().item() == 3.0 * (1 << 18)
    mine = torch.full((1 << 20,), 5.0)   # takes the free block in its copy of the allocator
    kept.mul_(2)                         # in place on an inherited tensor: the child's alone
    os.write(write, b"1" if ok and mine.sum().item() == 5.0 * (1 << 20) else b"0")
    os._exit(0)
ours = torch.zeros(1 << 20)              # the parent takes the same block
os.waitpid(pid, 0)
child_ok = os.read(read, 1) == b"1"
assert child_ok, "the child did not see the parent's tensor, or its own tensor was overwritten"
assert ours.sum().item() == 0.0, f"the child's tensor landed in the parent's: sum {ours.sum().item()}"
assert kept.sum().item() == 3.0 * (1 << 18), "the child's in-place write reached the parent"
print("ok")
