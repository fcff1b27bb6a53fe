"""A ViT with nn.MultiheadAttention, stochastic depth (per-sample bernoulli mask, in-place
div_), mixup of inputs and soft targets, LayerScale, cosine schedule, SGD."""
from common import *
from torch import nn
from torch.nn import functional as F
policy = setup()
def drop_path(x, p, training):
    if not training or p == 0: return x
    keep = x.new_empty(x.shape[0], 1, 1).bernoulli_(1 - p)
    return x * keep.div_(1 - p)
class Blk(nn.Module):
    def __init__(s, d, p):
        super().__init__()
        s.n1 = nn.LayerNorm(d); s.att = nn.MultiheadAttention(d, 4, dropout=0.1, batch_first=True); s.n2 = nn.LayerNorm(d)
        s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)); s.g1 = nn.Parameter(1e-1 * torch.ones(d)); s.g2 = nn.Parameter(1e-1 * torch.ones(d)); s.p = p
    def forward(s, x):
        h = s.n1(x)
        x = x + drop_path(s.g1 * s.att(h, h, h, need_weights=False)[0], s.p, s.training)
        return x + drop_path(s.g2 * s.mlp(s.n2(x)), s.p, s.training)
class ViT(nn.Module):
    def __init__(s, d=192, L=4):
        super().__init__()
        s.pe = nn.Conv2d(3, d, 4, 4); s.cls = nn.Parameter(torch.zeros(1, 1, d)); s.pos = nn.Parameter(torch.randn(1, 65, d) * .02)
        s.b = nn.ModuleList(Blk(d, 0.1 * i / L) for i in range(L)); s.n = nn.LayerNorm(d); s.h = nn.Linear(d, 10)
    def forward(s, x):
        x = s.pe(x).flatten(2).transpose(1, 2)
        x = torch.cat([s.cls.expand(x.size(0), -1, -1), x], 1) + s.pos
        for b in s.b: x = b(x)
        return s.h(s.n(x[:, 0]))
m = ViT(); opt = torch.optim.SGD(m.parameters(), 0.05, momentum=0.9, weight_decay=5e-4)
sch = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 3)
g = torch.Generator().manual_seed(1); losses = []
for step in range(3):
    x = torch.randn(64, 3, 32, 32, generator=g); y = torch.randint(0, 10, (64,), generator=g)
    lam = 0.7; perm = torch.randperm(64, generator=g)
    x = lam * x + (1 - lam) * x[perm]; yt = lam * F.one_hot(y, 10).float() + (1 - lam) * F.one_hot(y[perm], 10).float()
    loss = torch.sum(-yt * F.log_softmax(m(x), -1), -1).mean()
    opt.zero_grad(); loss.backward(); opt.step(); sch.step(); losses.append(loss.item())
report(policy, [m], losses)
