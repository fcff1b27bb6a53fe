# Untuned: a small StyleGAN2 on random 32x32 "images", written after rosinality's stylegan2-pytorch. A
# mapping MLP (pixel norm, 4 equalized-lr-free Linear + LeakyReLU) gives w; the synthesis net starts
# from a learned constant and runs modulated 3x3 convolutions: per-sample weights w_conv * style
# (style = affine(w) + 1), demodulated by torch.rsqrt of the sum of squares over (Cin, k, k), reshaped
# to (B * Cout, Cin, k, k) and applied as one grouped conv (groups=B) to x viewed as (1, B * Cin, H, W);
# noise injection by torch.randn (the global generator) times a learned per-layer strength, bias +
# LeakyReLU, bilinear upsampling by F.interpolate, and toRGB layers (modulated 1x1, no demodulation)
# summed into an upsampled skip image. Discriminator: conv + LeakyReLU + avg_pool2d, a minibatch
# stddev channel, Linear out. Non-saturating logistic loss (softplus); lazy R1 on real images every
# 2nd step (autograd.grad(create_graph=True), gamma/2 * r1 * interval); lazy path-length regulariser
# every 2nd step with the mean path length an EMA buffer on the generator updated in place; an EMA
# copy of the generator (copy.deepcopy, lerp_ of parameters). Adam (0, 0.99). 4 steps; the EMA
# generator's samples are reported.
import copy, math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, ZD, WD, CH, RES = 8, 64, 64, 48, 32
R1_GAMMA, PL_W, REG_EVERY, EMA = 10.0, 2.0, 2, 0.99
class Mapping(nn.Module):
    def __init__(s):
        super().__init__()
        layers = []
        for i in range(4): layers += [nn.Linear(ZD if i == 0 else WD, WD), nn.LeakyReLU(0.2)]
        s.net = nn.Sequential(*layers)
    def forward(s, z): return s.net(z * torch.rsqrt(z.pow(2).mean(1, keepdim=True) + 1e-8))
class ModConv(nn.Module):
    def __init__(s, cin, cout, k, demod=True):
        super().__init__()
        s.weight = nn.Parameter(torch.randn(cout, cin, k, k) / math.sqrt(cin * k * k))
        s.affine = nn.Linear(WD, cin)
        s.demod, s.k = demod, k
    def forward(s, x, w):
        b, cin, h, wd = x.shape
        style = s.affine(w) + 1
        weight = s.weight[None] * style[:, None, :, None, None]
        if s.demod:
            d = torch.rsqrt(weight.pow(2).sum([2, 3, 4]) + 1e-8)
            weight = weight * d[:, :, None, None, None]
        weight = weight.view(b * weight.shape[1], cin, s.k, s.k)
        out = F.conv2d(x.reshape(1, b * cin, h, wd), weight, padding=s.k // 2, groups=b)
        return out.view(b, -1, h, wd)
class StyledLayer(nn.Module):
    def __init__(s, cin, cout):
        super().__init__()
        s.conv = ModConv(cin, cout, 3)
        s.noise_strength = nn.Parameter(torch.zeros(1))
        s.bias = nn.Parameter(torch.zeros(1, cout, 1, 1))
    def forward(s, x, w):
        out = s.conv(x, w)
        b, _, h, wd = out.shape
        out = out + s.noise_strength * torch.randn(b, 1, h, wd, device=out.device)
        return F.leaky_relu(out + s.bias, 0.2) * math.sqrt(2)
class ToRGB(nn.Module):
    def __init__(s, cin):
        super().__init__()
        s.conv = ModConv(cin, 3, 1, demod=False)
        s.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))
    def forward(s, x, w, skip=None):
        out = s.conv(x, w) + s.bias
        if skip is not None: out = out + F.interpolate(skip, scale_factor=2, mode="bilinear", align_corners=False)
        return out
class Generator(nn.Module):
    def __init__(s):
        super().__init__()
        s.mapping = Mapping()
        s.const = nn.Parameter(torch.randn(1, CH, 4, 4))
        s.layers = nn.ModuleList(); s.rgbs = nn.ModuleList()
        s.layers.append(StyledLayer(CH, CH)); s.rgbs.append(ToRGB(CH))
        res = 4
        while res < RES:
            s.layers.append(StyledLayer(CH, CH)); s.layers.append(StyledLayer(CH, CH)); s.rgbs.append(ToRGB(CH))
            res *= 2
        s.register_buffer("mean_path_length", torch.zeros(()))
    def forward(s, z, return_w=False):
        w = s.mapping(z)
        x = s.const.expand(z.shape[0], -1, -1, -1)
        x = s.layers[0](x, w)
        img = s.rgbs[0](x, w)
        i = 1
        for rgb in s.rgbs[1:]:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            x = s.layers[i](x, w); x = s.layers[i + 1](x, w); i += 2
            img = rgb(x, w, img)
        return (img, w) if return_w else img
class Discriminator(nn.Module):
    def __init__(s):
        super().__init__()
        s.convs = nn.ModuleList([nn.Conv2d(3, CH, 1)] + [nn.Conv2d(CH, CH, 3, padding=1) for _ in range(6)])
        s.final = nn.Conv2d(CH + 1, CH, 3, padding=1)
        s.fc = nn.Sequential(nn.Linear(CH * 4 * 4, CH), nn.LeakyReLU(0.2), nn.Linear(CH, 1))
    def forward(s, x):
        x = F.leaky_relu(s.convs[0](x), 0.2)
        for i in range(1, 7, 2):
            x = F.leaky_relu(s.convs[i](x), 0.2)
            x = F.avg_pool2d(F.leaky_relu(s.convs[i + 1](x), 0.2), 2)
        std = torch.sqrt(x.var(0, unbiased=False) + 1e-8).mean().view(1, 1, 1, 1).expand(x.shape[0], 1, *x.shape[2:])
        x = F.leaky_relu(s.final(torch.cat([x, std], 1)), 0.2)
        return s.fc(x.flatten(1))
G, D = Generator(), Discriminator()
G_ema = copy.deepcopy(G).eval().requires_grad_(False)
g_ratio, d_ratio = REG_EVERY / (REG_EVERY + 1), REG_EVERY / (REG_EVERY + 1)
optG = torch.optim.Adam(G.parameters(), lr=2e-3 * g_ratio, betas=(0.0, 0.99 ** g_ratio))
optD = torch.optim.Adam(D.parameters(), lr=2e-3 * d_ratio, betas=(0.0, 0.99 ** d_ratio))
gen = torch.Generator().manual_seed(1)
def real_batch():
    base = torch.rand(B, 3, 8, 8, generator=gen) * 2 - 1
    return F.interpolate(base, size=RES, mode="bilinear", align_corners=False)
def accumulate(ema, model, decay):
    with torch.no_grad():
        for pe, p in zip(ema.parameters(), model.parameters()): pe.lerp_(p, 1 - decay)
        for be, b in zip(ema.buffers(), model.buffers()): be.copy_(b)
losses = []
sample_z = torch.randn(4, ZD, generator=gen)
for it in range(4):
    real = real_batch()
    # discriminator
    G.requires_grad_(False); D.requires_grad_(True)
    fake = G(torch.randn(B, ZD, generator=gen))
    d_loss = F.softplus(D(fake)).mean() + F.softplus(-D(real)).mean()
    D.zero_grad(set_to_none=True); d_loss.backward(); optD.step()
    losses.append(d_loss.detach())
    if it % REG_EVERY == 0:
        real.requires_grad_()
        real_pred = D(real)
        grad_real, = torch.autograd.grad(real_pred.sum(), real, create_graph=True)
        r1 = grad_real.pow(2).reshape(B, -1).sum(1).mean()
        D.zero_grad(set_to_none=True)
        (R1_GAMMA / 2 * r1 * REG_EVERY + 0 * real_pred[0]).sum().backward()
        optD.step()
        losses.append(r1.detach())
    # generator
    G.requires_grad_(True); D.requires_grad_(False)
    fake = G(torch.randn(B, ZD, generator=gen))
    g_loss = F.softplus(-D(fake)).mean()
    G.zero_grad(set_to_none=True); g_loss.backward(); optG.step()
    losses.append(g_loss.detach())
    if it % REG_EVERY == 0:
        pl_b = B // 2
        fake, w = G(torch.randn(pl_b, ZD, generator=gen), return_w=True)
        noise = torch.randn(fake.shape, generator=gen) / math.sqrt(RES * RES)
        grad_w, = torch.autograd.grad((fake * noise).sum(), w, create_graph=True)
        path_lengths = grad_w.pow(2).sum(1).sqrt()
        path_mean = G.mean_path_length + 0.01 * (path_lengths.mean() - G.mean_path_length)
        path_loss = (path_lengths - path_mean).pow(2).mean()
        G.zero_grad(set_to_none=True)
        (PL_W * REG_EVERY * path_loss + 0 * fake[0, 0, 0, 0]).backward()
        optG.step()
        G.mean_path_length.copy_(path_mean.detach())
        losses += [path_loss.detach(), path_lengths.mean().detach()]
    accumulate(G_ema, G, EMA)
with torch.no_grad(): losses.append(G_ema(sample_z).square().sum())
report(policy, [G, D, G_ema], losses)
