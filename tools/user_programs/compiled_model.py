# Untuned: torch.compile (inductor on the CPU) on parts of a small pre-norm transformer LM, after
# install() as common.py arranges: every other block compiled on its own (torch.compile(block)),
# the rest eager; the first compiled block has a graph break (a `.item()` check that clamps the
# residual stream when it blows up, and a Python-side counter); a compiled head that also reads an
# eager block's output through a dict the model shares with it (self.taps["mid"], set in forward:
# a tensor the compiled region reads but is not passed); eager embedding and loss; AdamW, 4 steps.
# WHOLE=1: torch.compile(model) on the whole model instead (the dict read and graph break inside).
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, D, H, T, B, L = 256, 64, 4, 64, 32, 6
clamps = [0]

class Block(nn.Module):
    def __init__(s, d, h, check=False):
        super().__init__()
        s.h, s.check = h, check
        s.n1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d)
        s.n2 = nn.LayerNorm(d); s.fc1 = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.n1(x)).view(B, T, 3, s.h, D // s.h).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (D // s.h) ** -0.5
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        x = x + s.o((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))
        if s.check and x.abs().max().item() > 50.0:   # graph break
            clamps[0] += 1
            x = x.clamp(-50.0, 50.0)
        return x + s.fc2(F.gelu(s.fc1(s.n2(x))))

class Head(nn.Module):
    def __init__(s, d, V, taps):
        super().__init__()
        s.taps = taps; s.norm = nn.LayerNorm(d); s.mix = nn.Parameter(torch.tensor(0.1)); s.out = nn.Linear(d, V, bias=False)
    def forward(s, x):
        return s.out(s.norm(x + s.mix * s.taps["mid"]))

class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.taps = {}
        s.emb = nn.Embedding(V, D); s.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        s.blocks = nn.ModuleList(Block(D, H, check=(i == 0)) for i in range(L))
        s.head = Head(D, V, s.taps)
    def forward(s, t):
        x = s.emb(t) + s.pos[: t.shape[1]]
        for i, b in enumerate(s.blocks):
            x = b(x)
            if i == 3: s.taps["mid"] = x
        return s.head(x)

model = LM()
if os.environ.get("WHOLE") == "1":
    cmodel = torch.compile(model)
else:
    for i in range(0, L, 2): model.blocks[i] = torch.compile(model.blocks[i])
    model.head = torch.compile(model.head)
    cmodel = model
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    t = torch.randint(0, V, (B, T + 1), generator=g)
    logits = cmodel(t[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, V), t[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
model.taps.clear()
report(policy, [model], losses)
