# Untuned: a very deep, narrow residual MLP, the way someone probing depth writes it (deep
# signal-propagation studies, "how deep can a plain residual stack train"): 4,000 blocks of
# h = h + 0.1 * tanh(Linear(h)), in an nn.ModuleList walked by a Python loop, a squared-norm
# loss, plain SGD, three steps. Under recompute at a tight budget the replay of an early
# gradient runs back through thousands of evicted activations: before Note [Deep replays]
# (registry/src/restore.cpp) the recursion overflowed the stack at 0.55 of the peak (a crash).
# (DEPTH=N: N blocks instead.)
import os, torch, torch.nn as nn
from common import setup, report
policy = setup()
DEPTH, B, W = int(os.environ.get("DEPTH", "4000")), 64, 64
layers = nn.ModuleList(nn.Linear(W, W) for _ in range(DEPTH))
opt = torch.optim.SGD(layers.parameters(), lr=1e-3)
x = torch.randn(B, W)
losses = []
for step in range(3):
    h = x
    for layer in layers:
        h = h + torch.tanh(layer(h)) * 0.1
    loss = h.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [layers], losses)
