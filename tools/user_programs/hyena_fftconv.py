# Untuned: a Hyena-style language model. Each operator projects the input to three streams
# (a causal depthwise short conv on them), makes a long implicit filter per channel from an MLP
# over sinusoidal positions times an exponential decay window, convolves by FFT (rfft of the
# zero-padded signal and filter, product, irfft, cut to the sequence), and gates elementwise;
# two orders of recurrence per operator, residual blocks with RMSNorm written by hand, a tied
# output projection, cross-entropy. AdamW with a warmup schedule by LambdaLR, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
V, D, L, B, LAYERS, ORDER, FEMB = 256, 96, 512, 4, 3, 2, 17
class Filter(nn.Module):
    def __init__(s):
        super().__init__()
        s.mlp = nn.Sequential(nn.Linear(FEMB, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, ORDER * D))
        s.decay = nn.Parameter(torch.linspace(0.3, 3.0, D).repeat(ORDER))
    def forward(s):
        t = torch.linspace(0, 1, L)[:, None]
        freqs = torch.arange(1, (FEMB - 1) // 2 + 1)[None] * math.pi
        z = torch.cat([t, torch.sin(freqs * t), torch.cos(freqs * t)], -1)        # (L, FEMB)
        h = s.mlp(z) * torch.exp(-t * s.decay.abs())                             # (L, ORDER*D)
        return h.t().reshape(ORDER, D, L)
class Hyena(nn.Module):
    def __init__(s):
        super().__init__()
        s.proj = nn.Linear(D, (ORDER + 1) * D); s.short = nn.Conv1d((ORDER + 1) * D, (ORDER + 1) * D, 3, padding=2, groups=(ORDER + 1) * D)
        s.filt = Filter(); s.bias = nn.Parameter(torch.zeros(ORDER, D)); s.out = nn.Linear(D, D)
    def forward(s, x):
        u = s.short(s.proj(x).transpose(1, 2))[..., :L]                           # causal
        v, *gates = u.split(D, dim=1)
        k = s.filt()
        kf = torch.fft.rfft(k, n=2 * L)
        for o in range(ORDER):
            vf = torch.fft.rfft(v, n=2 * L)
            y = torch.fft.irfft(vf * kf[o], n=2 * L)[..., :L]
            v = gates[o] * (y + v * s.bias[o][:, None])
        return s.out(v.transpose(1, 2))
class RMSNorm(nn.Module):
    def __init__(s):
        super().__init__(); s.w = nn.Parameter(torch.ones(D))
    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * s.w
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D)
        s.blocks = nn.ModuleList(nn.ModuleList([RMSNorm(), Hyena(), RMSNorm(), nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))]) for _ in range(LAYERS))
        s.norm = RMSNorm()
    def forward(s, idx):
        x = s.emb(idx)
        for n1, mix, n2, mlp in s.blocks:
            x = x + mix(n1(x))
            x = x + mlp(n2(x))
        return s.norm(x) @ s.emb.weight.t()
model = LM()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 2))
g = torch.Generator().manual_seed(5)
losses = []
for step in range(3):
    seq = torch.randint(0, V, (B, L + 1), generator=g)
    seq[:, 1::3] = seq[:, 0:-1:3]          # something to learn: every third token repeats
    logits = model(seq[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step()
    losses += [loss.detach(), logits.detach().std()]
report(policy, [model], losses)
