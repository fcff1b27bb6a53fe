# Untuned: SimCLR on random 3x32x32 images with augmentations done on the device, batched, as users
# write them to avoid a CPU data pipeline: per-sample random resized crops by F.affine_grid +
# F.grid_sample with scales and offsets from torch.rand, horizontal flips by torch.where on a
# per-sample torch.rand mask against x.flip(3), colour jitter (brightness and contrast by per-sample
# factors, x.mean over pixels), random greyscale by a weighted channel sum expanded back, clamp_
# in place. A small ResNet encoder (BatchNorm, ReLU(inplace=True)), a projection MLP with a BatchNorm1d;
# the NT-Xent loss over 2N: F.normalize, z @ z.T / tau, the diagonal removed by masked_fill(eye,
# -inf) (FILL=1: fill_diagonal_ on a clone), positives at i +- N, F.cross_entropy over the 2N rows;
# top-1 accuracy of the positive logged. LARS-like SGD: momentum SGD whose per-parameter trust ratio
# is written into each grad in place (g.mul_(ratio)) before opt.step(), 3 steps.
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
N, S, TAU, FILL = 48, 32, 0.2, os.environ.get("FILL") == "1"
def augment(x, g):
    n = x.shape[0]
    scale = 0.5 + 0.5 * torch.rand(n, generator=g)
    off = (1 - scale)[:, None] * (torch.rand(n, 2, generator=g) * 2 - 1)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = scale; theta[:, 1, 1] = scale; theta[:, :, 2] = off
    x = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)
    flip = torch.rand(n, 1, 1, 1, generator=g) < 0.5
    x = torch.where(flip, x.flip(3), x)
    b = 1 + (torch.rand(n, 1, 1, 1, generator=g) - 0.5) * 0.8
    c = 1 + (torch.rand(n, 1, 1, 1, generator=g) - 0.5) * 0.8
    m = x.mean((1, 2, 3), keepdim=True)
    x = (x * b - m) * c + m
    grey = torch.rand(n, 1, 1, 1, generator=g) < 0.2
    gx = (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]).expand_as(x)
    x = torch.where(grey, gx, x)
    return x.clamp_(0, 1)
class Block(nn.Module):
    def __init__(s, cin, cout, stride):
        super().__init__()
        s.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False); s.b1 = nn.BatchNorm2d(cout)
        s.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False); s.b2 = nn.BatchNorm2d(cout)
        s.sc = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        s.relu = nn.ReLU(inplace=True)
    def forward(s, x):
        out = s.relu(s.b1(s.c1(x)))
        out = s.b2(s.c2(out))
        out += s.sc(x)
        return s.relu(out)
class SimCLR(nn.Module):
    def __init__(s):
        super().__init__()
        s.enc = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
                              Block(32, 32, 1), Block(32, 64, 2), Block(64, 64, 1), Block(64, 128, 2),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten())
        s.proj = nn.Sequential(nn.Linear(128, 256), nn.BatchNorm1d(256), nn.ReLU(inplace=True), nn.Linear(256, 64))
    def forward(s, x): return s.proj(s.enc(x))
def nt_xent(z1, z2, tau):
    z = F.normalize(torch.cat([z1, z2], 0), dim=1)
    sim = z @ z.t() / tau
    n = z1.shape[0]
    if FILL: sim = sim.clone(); sim.fill_diagonal_(float("-inf"))
    else: sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, target), (sim.argmax(1) == target).float().mean()
model = SimCLR()
opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, weight_decay=1e-6)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.rand(N, 3, S, S, generator=g)
    z1, z2 = model(augment(x, g)), model(augment(x, g))
    loss, acc = nt_xent(z1, z2, TAU)
    opt.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                wn, gn = p.norm(), p.grad.norm()
                p.grad.mul_(torch.where((wn > 0) & (gn > 0), 0.001 * wn / gn, torch.ones_like(wn)))
    opt.step()
    losses += [loss.detach(), acc]
report(policy, [model], losses)
