# Untuned: an energy-based image model trained by contrastive divergence with SGLD samples (Du &
# Mordatch style). A small conv energy net, every conv and the head under nn.utils.spectral_norm
# (its power iteration writing the u buffer in place at every call, in train mode throughout); a
# replay buffer of samples (a preallocated tensor, a batch indexed by randint, 5% replaced by fresh
# uniform noise through torch.where on a rand mask); 20 Langevin steps per training step written as
# a user writes them (x.detach().requires_grad_(), autograd.grad of the summed energy w.r.t. x,
# a step against the gradient plus randn_like noise, clamp), the samples written back into the
# buffer under no_grad; the loss E(pos).mean() - E(neg).mean() with an L2 energy regulariser.
# Positive images are synthetic Gaussian blobs. Adam with beta1 = 0, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
SN = nn.utils.spectral_norm
B, C, S, BUF, K, STEP, NOISE, ALPHA = 48, 3, 32, 512, 20, 10.0, 0.005, 1.0
class Energy(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1 = SN(nn.Conv2d(C, 64, 3, padding=1))
        s.c2 = SN(nn.Conv2d(64, 64, 3, padding=1))
        s.c3 = SN(nn.Conv2d(64, 128, 3, stride=2, padding=1))
        s.c4 = SN(nn.Conv2d(128, 128, 3, padding=1))
        s.c5 = SN(nn.Conv2d(128, 256, 3, stride=2, padding=1))
        s.head = SN(nn.Linear(256, 1))
    def forward(s, x):
        h = F.leaky_relu(s.c1(x), 0.2)
        h = h + F.leaky_relu(s.c2(h), 0.2)
        h = F.leaky_relu(s.c3(h), 0.2)
        h = h + F.leaky_relu(s.c4(h), 0.2)
        h = F.leaky_relu(s.c5(h), 0.2)
        return s.head(h.mean(dim=(2, 3))).squeeze(-1)
g = torch.Generator().manual_seed(11)
yy, xx = torch.meshgrid(torch.linspace(-1, 1, S), torch.linspace(-1, 1, S), indexing="ij")
def data(n):
    cx, cy = torch.rand(n, 1, 1, generator=g) * 1.2 - 0.6, torch.rand(n, 1, 1, generator=g) * 1.2 - 0.6
    r = torch.rand(n, 1, 1, generator=g) * 0.3 + 0.15
    col = torch.rand(n, C, 1, 1, generator=g) * 2 - 1
    blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r ** 2))[:, None]
    return (col * blob + 0.05 * torch.randn(n, C, S, S, generator=g)).clamp(-1, 1)
E = Energy()
opt = torch.optim.Adam(E.parameters(), lr=1e-4, betas=(0.0, 0.999))
buffer = torch.rand(BUF, C, S, S) * 2 - 1
losses = []
for step in range(3):
    pos = data(B)
    idx = torch.randint(0, BUF, (B,))
    fresh = torch.rand(B, C, S, S) * 2 - 1
    x = torch.where((torch.rand(B) < 0.05)[:, None, None, None], fresh, buffer[idx])
    for k in range(K):
        x = x.detach().requires_grad_()
        gr, = torch.autograd.grad(E(x).sum(), x)
        x = x - STEP * gr + NOISE * torch.randn_like(x)
        x = x.clamp(-1, 1)
    neg = x.detach()
    with torch.no_grad():
        buffer[idx] = neg
    e_pos, e_neg = E(pos), E(neg)
    cd = e_pos.mean() - e_neg.mean()
    reg = ALPHA * (e_pos ** 2 + e_neg ** 2).mean()
    loss = cd + reg
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [cd.detach(), reg.detach(), neg.abs().mean()]
report(policy, [E], losses + [buffer.sum()])
