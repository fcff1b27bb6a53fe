# Untuned: an MLP and a small CNN that use in-place ops on activations everywhere (ReLU/Hardswish/SiLU
# inplace=True, sigmoid_ gating, in-place dropout, clamp_ after a residual add, masked_fill_ on an
# activation). SGD with momentum. The two models are trained jointly on a sum of losses.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, DIN, DH, NC = 64, 256, 512, 10
class GatedBlock(nn.Module):
    def __init__(s, d):
        super().__init__(); s.fc = nn.Linear(d, d); s.gate = nn.Linear(d, d); s.act = nn.Hardswish(inplace=True)
    def forward(s, x):
        h = s.act(s.fc(x))
        g = s.gate(x); g.sigmoid_(); h = h * g
        h = F.dropout(h, 0.1, training=True, inplace=True)
        x = x + h
        x.clamp_(min=-3, max=3)
        return x
class MLP(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(DIN, DH); s.act = nn.ReLU(inplace=True)
        s.blocks = nn.ModuleList(GatedBlock(DH) for _ in range(4))
        s.out = nn.Sequential(nn.Linear(DH, DH), nn.SiLU(inplace=True), nn.Linear(DH, NC))
    def forward(s, x, mask):
        x = s.inp(x)
        x.masked_fill_(mask, 0.0)
        x = s.act(x)
        for b in s.blocks: x = b(x)
        return s.out(x)
class ConvBlock(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False); s.b1 = nn.BatchNorm2d(c); s.a1 = nn.ReLU(inplace=True)
        s.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False); s.b2 = nn.BatchNorm2d(c); s.a2 = nn.Hardswish(inplace=True)
        s.gate = nn.Conv2d(c, c, 1)
    def forward(s, x):
        h = s.a1(s.b1(s.c1(x)))
        h = s.a2(s.b2(s.c2(h)))
        g = s.gate(F.adaptive_avg_pool2d(h, 1)); g.sigmoid_(); h = h * g
        h = F.dropout(h, 0.1, training=True, inplace=True)
        x = x + h
        x.clamp_(min=-3, max=3)
        return x
class CNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.SiLU(inplace=True))
        s.b1 = ConvBlock(32); s.down = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(inplace=True))
        s.b2 = ConvBlock(64); s.b3 = ConvBlock(64)
        s.head = nn.Linear(64, NC)
    def forward(s, x):
        x = s.stem(x)
        x.masked_fill_(x < -0.5, -0.5)
        x = s.b1(x); x = s.down(x); x = s.b2(x); x = s.b3(x)
        return s.head(x.mean((2, 3)))
mlp, cnn = MLP(), CNN()
opt = torch.optim.SGD(list(mlp.parameters()) + list(cnn.parameters()), lr=0.05, momentum=0.9, nesterov=True)
g = torch.Generator().manual_seed(1)
xv = torch.randn(3, B, DIN, generator=g); xi = torch.randn(3, 32, 3, 32, 32, generator=g)
yv = torch.randint(0, NC, (3, B), generator=g); yi = torch.randint(0, NC, (3, 32), generator=g)
losses = []
for step in range(3):
    opt.zero_grad()
    mask = torch.rand(B, DH) < 0.05
    l1 = F.cross_entropy(mlp(xv[step], mask), yv[step])
    l2 = F.cross_entropy(cnn(xi[step]), yi[step])
    loss = l1 + l2
    loss.backward()
    opt.step()
    losses += [l1.detach(), l2.detach()]
report(policy, [mlp, cnn], losses)
