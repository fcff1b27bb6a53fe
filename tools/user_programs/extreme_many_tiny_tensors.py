# Untuned: a "patch-wise" model written the way someone avoiding one big matmul writes it: the
# activation (16,384 rows of 64 features) is cut into many small pieces each round, every piece goes
# through one small shared MLP (Linear 64->128, GELU, Linear 128->64, a residual and a per-piece
# LayerNorm) in a Python loop, and the pieces are torch.cat back together. Rounds alternate how they
# cut: torch.split into 64-row pieces (16 KiB each), torch.chunk into 128 pieces, and torch.split
# with uneven sizes (32 to 160 rows). Every piece also adds its own loss term (a squared mean against
# a target slice, and a small weighted abs term on odd pieces), summed in a Python float-free loop.
# About 25,000 aten ops per step of forward, tens of thousands of small tensors alive at once.
# AdamW, three steps. (ROUNDS=N: N rounds instead of 8.)
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
N, D, HID, ROUNDS = 16384, 64, 128, int(os.environ.get("ROUNDS", "8"))
class PieceMLP(nn.Module):
    def __init__(s):
        super().__init__()
        s.up = nn.Linear(D, HID)
        s.down = nn.Linear(HID, D)
        s.norm = nn.LayerNorm(D)
    def forward(s, p):
        return s.norm(p + s.down(F.gelu(s.up(p))))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Linear(32, D)
        s.blocks = nn.ModuleList(PieceMLP() for _ in range(3))   # shared across rounds
        s.mix = nn.Linear(D, D)
        s.head = nn.Linear(D, 1)
    def forward(s, x, tgt):
        h = torch.tanh(s.stem(x))
        aux = []
        uneven = [32 + 16 * (i % 9) for i in range(200)]
        for r in range(ROUNDS):
            if r % 3 == 0:
                pieces = torch.split(h, 64)
            elif r % 3 == 1:
                pieces = torch.chunk(h, 128)
            else:
                sizes, tot = [], 0
                for u in uneven:
                    if tot + u >= N: break
                    sizes.append(u); tot += u
                sizes.append(N - tot)
                pieces = torch.split(h, sizes)
            blk = s.blocks[r % 3]
            outs, start = [], 0
            for i, p in enumerate(pieces):
                o = blk(p)
                t = tgt[start:start + p.shape[0]]
                start += p.shape[0]
                aux.append((o - t).square().mean())
                if i % 2:
                    aux.append(0.01 * o.abs().mean())
                outs.append(o)
            h = torch.cat(outs, 0)
            if r % 2:
                h = h + 0.5 * s.mix(h)
        return s.head(h).squeeze(1), torch.stack(aux)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(N, 32, generator=g)
    y = torch.randn(N, generator=g)
    tgt = torch.randn(N, D, generator=g) * 0.5
    pred, aux = model(x, tgt)
    loss = F.mse_loss(pred, y) + aux.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), aux.detach().max(), pred.detach().sum()]
report(policy, [model], losses)
