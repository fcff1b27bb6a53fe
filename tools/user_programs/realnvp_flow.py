# Untuned: a Glow/RealNVP normalizing flow on random 3x32x32 "images". Squeeze (reshape/permute,
# 2x2 space-to-depth) then per level K steps of: ActNorm with data-dependent initialisation on the
# first batch (loc/log-scale written in place under no_grad inside forward, an `initialized` buffer
# flag filled to 1), an invertible 1x1 convolution (F.conv2d with the weight viewed to (C, C, 1, 1),
# log|det| by torch.linalg.slogdet times H*W; the last step of each level by an LU parametrisation:
# P fixed buffer, L = tril(-1) masked + eye, U = triu(1) masked + diag(sign * exp(log_s)), logdet
# = sum(log_s) H*W), and an affine coupling (half the channels through a small conv net, log-scale
# = tanh-scaled, y = (x + t) * exp(s), zero-initialised last conv). Half the channels are factored
# out between levels (a standard-normal prior on them). The logdet is accumulated across layers;
# NLL in bits per dim with Adam, 3 steps (the first one also initialises ActNorm).
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, C0, HW, K, HID = 32, 3, 32, 4, 64
def squeeze(x):
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return x.reshape(b, c * 4, h // 2, w // 2)
class ActNorm(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.loc = nn.Parameter(torch.zeros(1, c, 1, 1)); s.logs = nn.Parameter(torch.zeros(1, c, 1, 1))
        s.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))
    def forward(s, x, logdet):
        if s.initialized.item() == 0:
            with torch.no_grad():
                mean = x.mean(dim=(0, 2, 3), keepdim=True)
                std = x.std(dim=(0, 2, 3), keepdim=True)
                s.loc.data.copy_(-mean)
                s.logs.data.copy_(torch.log(1.0 / (std + 1e-6)))
                s.initialized.fill_(1)
        y = (x + s.loc) * torch.exp(s.logs)
        return y, logdet + s.logs.sum() * x.shape[2] * x.shape[3]
class InvConv(nn.Module):
    def __init__(s, c):
        super().__init__()
        w, _ = torch.linalg.qr(torch.randn(c, c))
        s.weight = nn.Parameter(w)
    def forward(s, x, logdet):
        _, ld = torch.linalg.slogdet(s.weight)
        return F.conv2d(x, s.weight.view(*s.weight.shape, 1, 1)), logdet + ld * x.shape[2] * x.shape[3]
class InvConvLU(nn.Module):
    def __init__(s, c):
        super().__init__()
        w, _ = torch.linalg.qr(torch.randn(c, c))
        P, L, U = torch.linalg.lu(w)
        d = torch.diagonal(U)
        s.register_buffer("P", P); s.register_buffer("sign_s", torch.sign(d))
        s.register_buffer("lmask", torch.tril(torch.ones(c, c), -1)); s.register_buffer("eye", torch.eye(c))
        s.L = nn.Parameter(L); s.U = nn.Parameter(torch.triu(U, 1)); s.log_s = nn.Parameter(torch.log(d.abs()))
    def forward(s, x, logdet):
        L = s.L * s.lmask + s.eye
        U = s.U * s.lmask.t() + torch.diag(s.sign_s * torch.exp(s.log_s))
        w = s.P @ L @ U
        return F.conv2d(x, w.view(*w.shape, 1, 1)), logdet + s.log_s.sum() * x.shape[2] * x.shape[3]
class Coupling(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.net = nn.Sequential(nn.Conv2d(c // 2, HID, 3, padding=1), nn.ReLU(), nn.Conv2d(HID, HID, 1), nn.ReLU(),
                              nn.Conv2d(HID, c, 3, padding=1))
        nn.init.zeros_(s.net[-1].weight); nn.init.zeros_(s.net[-1].bias)
        s.scale = nn.Parameter(torch.ones(1, c // 2, 1, 1))
    def forward(s, x, logdet):
        xa, xb = x.chunk(2, 1)
        h = s.net(xa)
        t, ls = h[:, 0::2], h[:, 1::2]
        ls = s.scale * torch.tanh(ls)
        yb = (xb + t) * torch.exp(ls)
        return torch.cat([xa, yb], 1), logdet + ls.flatten(1).sum(1)
class Flow(nn.Module):
    def __init__(s):
        super().__init__()
        s.levels = nn.ModuleList(); c = C0
        for lvl in range(2):
            c *= 4; steps = nn.ModuleList()
            for k in range(K):
                steps.append(nn.ModuleList([ActNorm(c), InvConvLU(c) if k == K - 1 else InvConv(c), Coupling(c)]))
            s.levels.append(steps); c //= 2
    def forward(s, x):
        logdet = torch.zeros(x.shape[0]); logp = torch.zeros(x.shape[0])
        for i, steps in enumerate(s.levels):
            x = squeeze(x)
            for step in steps:
                for layer in step: x, logdet = layer(x, logdet)
            if i < len(s.levels) - 1:
                x, z = x.chunk(2, 1)
                logp = logp + (-0.5 * (z ** 2 + math.log(2 * math.pi))).flatten(1).sum(1)
        logp = logp + (-0.5 * (x ** 2 + math.log(2 * math.pi))).flatten(1).sum(1)
        return logp + logdet
flow = Flow()
opt = torch.optim.Adam(flow.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
D = C0 * HW * HW
losses = []
for step in range(3):
    x = torch.sigmoid(F.interpolate(torch.randn(B, C0, 4, 4, generator=g), size=HW, mode="bilinear", align_corners=False) * 2)
    x = x + torch.rand(x.shape, generator=g) / 256.0             # dequantise
    ll = flow(x) - D * math.log(256.0)
    loss = (-ll / (D * math.log(2.0))).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach()]
with torch.no_grad(): losses.append(flow(x).sum())
report(policy, [flow], losses)
