"""torch.utils.checkpoint with use_reentrant=True (forward under no_grad, a nested backward
in the recomputation) and use_reentrant=False side by side, with dropout inside."""
from common import *
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
policy = setup()
class Block(nn.Module):
    def __init__(s, d=512):
        super().__init__()
        s.a = nn.Linear(d, 2 * d); s.b = nn.Linear(2 * d, d); s.n = nn.LayerNorm(d); s.drop = nn.Dropout(0.1)
    def forward(s, x):
        return x + s.drop(s.b(F.gelu(s.a(s.n(x)))))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(64, 512); s.blocks = nn.ModuleList(Block() for _ in range(6)); s.out = nn.Linear(512, 10)
    def forward(s, x):
        h = s.inp(x)
        for i, b in enumerate(s.blocks):
            if i % 3 == 0: h = checkpoint(b, h, use_reentrant=True)
            elif i % 3 == 1: h = checkpoint(b, h, use_reentrant=False)
            else: h = b(h)
        return s.out(h)
m = Net(); opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1); losses = []
for step in range(4):
    x = torch.randn(6144, 64, generator=g); y = torch.randint(0, 10, (6144,), generator=g)
    loss = F.cross_entropy(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
report(policy, [m], losses)
