# Untuned: ConvMixer-style network (patch embedding, depthwise conv + GELU + BN residual, pointwise conv)
# plus a local-attention block built with F.unfold/F.fold: im2col 3x3 neighbourhoods, attention within
# each neighbourhood via einsum, folded back. AdamW, label smoothing.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, D, P, K, NC = 16, 96, 2, 5, 10
class Residual(nn.Module):
    def __init__(s, fn): super().__init__(); s.fn = fn
    def forward(s, x): return s.fn(x) + x
class LocalAttn(nn.Module):
    def __init__(s, dim, heads=4, k=3):
        super().__init__(); s.h, s.k = heads, k
        s.qkv = nn.Conv2d(dim, 3 * dim, 1); s.out = nn.Conv2d(dim, dim, 1); s.bn = nn.BatchNorm2d(dim)
    def forward(s, x):
        Bn, C, H, W = x.shape
        q, k, v = s.qkv(x).chunk(3, dim=1)
        dh = C // s.h
        q = q.reshape(Bn, s.h, dh, 1, H * W)
        kp = F.unfold(k, s.k, padding=s.k // 2).reshape(Bn, s.h, dh, s.k * s.k, H * W)
        vp = F.unfold(v, s.k, padding=s.k // 2).reshape(Bn, s.h, dh, s.k * s.k, H * W)
        att = torch.einsum("bhdql,bhdkl->bhqkl", q, kp) * dh ** -0.5
        att = att.softmax(dim=3)
        # weight each neighbour's value and overlap-add the weighted patches back (fold)
        o = torch.einsum("bhqkl,bhdkl->bhdkl", att, vp)                # b h d k L
        o = F.fold(o.reshape(Bn, C * s.k * s.k, H * W), (H, W), s.k, padding=s.k // 2)
        return x + s.bn(s.out(F.gelu(o)))
def mixer_layer(dim):
    return nn.Sequential(
        Residual(nn.Sequential(nn.Conv2d(dim, dim, K, groups=dim, padding="same"), nn.GELU(), nn.BatchNorm2d(dim))),
        nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, D, P, stride=P), nn.GELU(), nn.BatchNorm2d(D))
        s.layers = nn.Sequential(mixer_layer(D), LocalAttn(D), mixer_layer(D), mixer_layer(D), LocalAttn(D), mixer_layer(D))
        s.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(D, NC))
    def forward(s, x): return s.head(s.layers(s.stem(x)))
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
g = torch.Generator().manual_seed(1)
xs = torch.randn(3, B, 3, 32, 32, generator=g); ys = torch.randint(0, NC, (3, B), generator=g)
losses = []
for step in range(3):
    opt.zero_grad()
    loss = F.cross_entropy(model(xs[step]), ys[step], label_smoothing=0.1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); losses.append(loss.detach())
report(policy, [model], losses)
