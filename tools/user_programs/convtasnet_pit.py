# Untuned: Conv-TasNet-style speech separation. Waveforms framed by a strided Conv1d encoder,
# a temporal convolutional network of dilated depthwise blocks with PReLU and a hand-written
# global layer norm (mean and variance over channels and time), skip connections summed in
# place into an accumulator, sigmoid masks per speaker, a decoder that overlap-adds frames by
# F.fold, and a permutation-invariant SI-SNR loss (both speaker orders scored, the better one
# per example taken by min and gather). Adam with gradient clipping, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, T, L, N, HID, SPK, BLOCKS, REPEATS = 4, 8000, 16, 64, 128, 2, 5, 2
class GLN(nn.Module):
    def __init__(s, c):
        super().__init__(); s.g = nn.Parameter(torch.ones(1, c, 1)); s.b = nn.Parameter(torch.zeros(1, c, 1))
    def forward(s, x):
        mean = x.mean(dim=(1, 2), keepdim=True)
        var = ((x - mean) ** 2).mean(dim=(1, 2), keepdim=True)
        return s.g * (x - mean) / torch.sqrt(var + 1e-8) + s.b
class Block(nn.Module):
    def __init__(s, dil):
        super().__init__()
        s.inp = nn.Conv1d(N, HID, 1); s.act1 = nn.PReLU(); s.n1 = GLN(HID)
        s.dw = nn.Conv1d(HID, HID, 3, padding=dil, dilation=dil, groups=HID)
        s.act2 = nn.PReLU(); s.n2 = GLN(HID)
        s.res = nn.Conv1d(HID, N, 1); s.skip = nn.Conv1d(HID, N, 1)
    def forward(s, x):
        h = s.n1(s.act1(s.inp(x)))
        h = s.n2(s.act2(s.dw(h)))
        return x + s.res(h), s.skip(h)
class TasNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.enc = nn.Conv1d(1, N, L, stride=L // 2, bias=False)
        s.norm = GLN(N); s.bottleneck = nn.Conv1d(N, N, 1)
        s.blocks = nn.ModuleList(Block(2 ** i) for _ in range(REPEATS) for i in range(BLOCKS))
        s.mask = nn.Sequential(nn.PReLU(), nn.Conv1d(N, SPK * N, 1))
        s.dec = nn.Linear(N, L, bias=False)
    def forward(s, mix):
        w = F.relu(s.enc(mix[:, None]))                    # (B, N, frames)
        x = s.bottleneck(s.norm(w))
        acc = torch.zeros_like(x)
        for blk in s.blocks:
            x, sk = blk(x)
            acc += sk                                       # in place on an activation
        m = torch.sigmoid(s.mask(acc)).view(B, SPK, N, -1)
        frames = s.dec((w[:, None] * m).transpose(2, 3))    # (B, SPK, frames, L)
        nf = frames.shape[2]
        cols = frames.reshape(B * SPK, nf, L).transpose(1, 2)
        out = F.fold(cols, output_size=(1, (nf - 1) * (L // 2) + L), kernel_size=(1, L), stride=(1, L // 2))
        return out.view(B, SPK, -1)[..., :T]
def si_snr(est, ref):
    est = est - est.mean(-1, keepdim=True); ref = ref - ref.mean(-1, keepdim=True)
    proj = (est * ref).sum(-1, keepdim=True) * ref / (ref.pow(2).sum(-1, keepdim=True) + 1e-8)
    noise = est - proj
    return 10 * torch.log10(proj.pow(2).sum(-1) / (noise.pow(2).sum(-1) + 1e-8) + 1e-8)
model = TasNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
t = torch.arange(T) / 8000.0
losses = []
for step in range(3):
    f0 = 100 + 300 * torch.rand(B, SPK, 1, generator=g)
    src = torch.sin(2 * torch.pi * f0 * t) * (0.5 + torch.rand(B, SPK, 1, generator=g)) + 0.05 * torch.randn(B, SPK, T, generator=g)
    mix = src.sum(1)
    est = model(mix)
    perms = torch.stack([si_snr(est, src).mean(-1), si_snr(est.flip(1), src).mean(-1)], -1)   # (B, 2)
    best = perms.max(-1)
    loss = -best.values.mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    losses += [loss.detach(), best.indices.sum(), est.detach().abs().mean()]
report(policy, [model], losses)
