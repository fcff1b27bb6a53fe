# Untuned: BYOL self-supervised learning. Online net (conv encoder + projector + predictor MLPs with
# BatchNorm1d), target net = EMA of the online net updated under no_grad with mul_/add_ loops,
# two augmented views made in the step (random flips via torch.where, roll shifts, Gaussian noise),
# symmetric normalized MSE loss, target outputs under no_grad, plain SGD with momentum.
import copy, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, C, H = 32, 3, 32
def mlp(i, h, o): return nn.Sequential(nn.Linear(i, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, o))
class Encoder(nn.Module):
    def __init__(s):
        super().__init__()
        s.f = nn.Sequential(
            nn.Conv2d(C, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
    def forward(s, x): return s.f(x)
class Online(nn.Module):
    def __init__(s):
        super().__init__(); s.enc = Encoder(); s.proj = mlp(128, 256, 64)
    def forward(s, x): return s.proj(s.enc(x))
online = Online()
predictor = mlp(64, 256, 64)
target = copy.deepcopy(online)
for p in target.parameters(): p.requires_grad_(False)
opt = torch.optim.SGD(list(online.parameters()) + list(predictor.parameters()), lr=0.05, momentum=0.9, weight_decay=1e-4)
g = torch.Generator().manual_seed(1)
data = torch.rand(3, B, C, H, H, generator=g)
def augment(x):
    flip = torch.rand(x.shape[0], 1, 1, 1) < 0.5
    x = torch.where(flip, torch.flip(x, dims=[3]), x)
    sh = int(torch.randint(-4, 5, (1,)))
    sw = int(torch.randint(-4, 5, (1,)))
    x = torch.roll(x, shifts=(sh, sw), dims=(2, 3))
    scale = torch.rand(x.shape[0], 1, 1, 1) * 0.4 + 0.8
    x = x * scale + 0.05 * torch.randn_like(x)
    return x
def byol_loss(p, z):
    p = F.normalize(p, dim=-1); z = F.normalize(z, dim=-1)
    return (2 - 2 * (p * z).sum(-1)).mean()
losses = []
m = 0.99
for step in range(3):
    x = data[step]
    v1, v2 = augment(x), augment(x)
    p1 = predictor(online(v1)); p2 = predictor(online(v2))
    with torch.no_grad():
        z1 = target(v1); z2 = target(v2)
    loss = byol_loss(p1, z2) + byol_loss(p2, z1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for o, t in zip(online.parameters(), target.parameters()):
            t.mul_(m).add_(o, alpha=1 - m)
        for o, t in zip(online.buffers(), target.buffers()):
            t.copy_(o)
    losses.append(loss.detach())
    losses.append(z1.sum().detach())
report(policy, [online, predictor, target], losses)
