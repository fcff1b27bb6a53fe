# Untuned: a hand-written gated RNN cell (GRU-style: update and reset gates from one Linear on
# [x_t, h], a candidate from Linear + tanh on [x_t, r * h]) unrolled over a very long sequence, 4,000
# timesteps in a Python loop, with a small batch (16) and hidden size (256; each step's state is
# 16 KiB, pyalloc's default min_evictable): someone modelling a long sensor trace without truncating
# backpropagation through time. A readout Linear on every step's
# hidden state and a squared error against the next sample on every step (summed, divided by T at the
# end), plus a small penalty on the hidden state's norm every 16th step. The state starts at zero each
# step (no carry), so every backward walks the whole 4,000-step chain. Adam, three steps.
# (T=N: N timesteps instead; B=, H=: batch and hidden size. B=8 H=48 makes every activation 1.5 KiB,
# below min_evictable, so nothing can be evicted: every policy fails cleanly below the peak unless
# PYALLOC_MIN_EVICTABLE is lowered too.)
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
T, B, I, H = int(os.environ.get("T", "4000")), int(os.environ.get("B", "16")), 6, int(os.environ.get("H", "256"))
class GatedCell(nn.Module):
    def __init__(s):
        super().__init__()
        s.gates = nn.Linear(I + H, 2 * H)
        s.cand = nn.Linear(I + H, H)
    def forward(s, x, h):
        zr = torch.sigmoid(s.gates(torch.cat([x, h], 1)))
        z, r = zr.chunk(2, 1)
        c = torch.tanh(s.cand(torch.cat([x, r * h], 1)))
        return (1 - z) * h + z * c
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.cell = GatedCell()
        s.read = nn.Linear(H, I)
model = Model()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(1)
t_axis = torch.arange(T + 1, dtype=torch.float32)
freqs = torch.rand(B, I, generator=g) * 0.05 + 0.01
series = torch.sin(t_axis[:, None, None] * freqs[None]) + 0.1 * torch.randn(T + 1, B, I, generator=g)
losses = []
for step in range(3):
    h = torch.zeros(B, H)
    loss = 0.0
    for t in range(T):
        h = model.cell(series[t], h)
        pred = model.read(h)
        loss = loss + (pred - series[t + 1]).square().mean()
        if t % 16 == 15:
            loss = loss + 1e-3 * h.square().sum(1).mean()
    loss = loss / T
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), h.detach().abs().mean()]
report(policy, [model], losses)
