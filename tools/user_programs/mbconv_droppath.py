# Untuned: an EfficientNet-style classifier on random 3x64x64 images. A stem conv + BatchNorm +
# SiLU(inplace=True); MBConv blocks as timm writes them: a 1x1 expansion (skipped at ratio 1), a
# depthwise conv (groups=channels, stride 1 or 2, kernel 3 or 5), squeeze-excitation (adaptive avg
# pool, reduce conv, SiLU, expand conv, sigmoid, x * gate), a 1x1 projection with BatchNorm and no
# activation; DropPath on the residual branch by a per-sample keep mask (x.new_empty(shape).
# bernoulli_(keep)), x.div(keep) * mask (DIVIN=1: div_ in place on the branch), the survival
# probability growing linearly with depth; the residual added in place (x += shortcut) when shapes
# match. Head: 1x1 conv to 320 channels, SiLU, global average pool, flatten, Dropout(0.2), Linear.
# Label-smoothed cross entropy, RMSprop (alpha 0.9, eps 1e-3) with weight decay, an EMA of the
# weights by a loop of p.mul_(decay).add_(q, alpha=1-decay) under no_grad, 3 steps; the EMA model
# evaluated in eval mode at the end.
import copy, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, DIVIN = 32, os.environ.get("DIVIN") == "1"
def drop_path(x, p, training):
    if p == 0.0 or not training: return x
    keep = 1 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    if DIVIN: return x.div_(keep) * mask
    return x.div(keep) * mask
class SE(nn.Module):
    def __init__(s, c, r):
        super().__init__(); s.reduce = nn.Conv2d(c, r, 1); s.expand = nn.Conv2d(r, c, 1); s.act = nn.SiLU(inplace=True)
    def forward(s, x):
        g = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(s.expand(s.act(s.reduce(g))))
class MBConv(nn.Module):
    def __init__(s, cin, cout, k, stride, ratio, dp):
        super().__init__(); mid = cin * ratio; s.dp = dp
        s.has_res = stride == 1 and cin == cout
        s.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU(inplace=True)) if ratio != 1 else nn.Identity()
        s.dw = nn.Sequential(nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.SiLU(inplace=True))
        s.se = SE(mid, max(1, cin // 4))
        s.proj = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
    def forward(s, x):
        shortcut = x
        x = s.proj(s.se(s.dw(s.expand(x))))
        if s.has_res:
            x = drop_path(x, s.dp, s.training)
            x += shortcut
        return x
CFG = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 2, 2, 3), (6, 112, 2, 1, 5)]
class EffNet(nn.Module):
    def __init__(s, ncls=100):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU(inplace=True))
        blocks, cin, n, i = [], 32, sum(c[2] for c in CFG), 0
        for ratio, cout, reps, stride, k in CFG:
            for r in range(reps):
                blocks.append(MBConv(cin, cout, k, stride if r == 0 else 1, ratio, 0.2 * i / n)); cin = cout; i += 1
        s.blocks = nn.Sequential(*blocks)
        s.head = nn.Sequential(nn.Conv2d(cin, 320, 1, bias=False), nn.BatchNorm2d(320), nn.SiLU(inplace=True))
        s.drop = nn.Dropout(0.2); s.fc = nn.Linear(320, ncls)
    def forward(s, x):
        x = s.head(s.blocks(s.stem(x)))
        return s.fc(s.drop(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))
model = EffNet()
ema = copy.deepcopy(model).eval()
for p in ema.parameters(): p.requires_grad_(False)
opt = torch.optim.RMSprop(model.parameters(), lr=0.016, alpha=0.9, eps=1e-3, momentum=0.9, weight_decay=1e-5)
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, 3, 64, 64, generator=g)
    y = torch.randint(0, 100, (B,), generator=g)
    loss = crit(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for q, p in zip(model.state_dict().values(), ema.state_dict().values()):
            if p.dtype.is_floating_point: p.mul_(0.99).add_(q, alpha=0.01)
            else: p.copy_(q)
    losses.append(loss.detach())
with torch.no_grad(): losses.append(ema(x).float().square().mean())
report(policy, [model, ema], losses)
