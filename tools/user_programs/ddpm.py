# Untuned: DDPM training step. Small UNet with sinusoidal timestep embeddings added per block,
# GroupNorm, SiLU, one self-attention block at the lowest resolution (SDPA), skip connections via
# torch.cat, nearest upsampling. Timesteps/noise from the global RNG. MSE, Adam, EMA via _foreach_lerp_.
import math, copy, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, C, H, T = 16, 3, 32, 1000
def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    a = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=-1)
class ResBlock(nn.Module):
    def __init__(s, cin, cout, tdim):
        super().__init__()
        s.n1 = nn.GroupNorm(8, cin); s.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        s.t = nn.Linear(tdim, cout)
        s.n2 = nn.GroupNorm(8, cout); s.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        s.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
    def forward(s, x, temb):
        h = s.c1(F.silu(s.n1(x)))
        h = h + s.t(F.silu(temb))[:, :, None, None]
        h = s.c2(F.silu(s.n2(h)))
        return h + s.skip(x)
class Attn(nn.Module):
    def __init__(s, c, heads=4):
        super().__init__(); s.n = nn.GroupNorm(8, c); s.qkv = nn.Linear(c, 3 * c); s.o = nn.Linear(c, c); s.h = heads
    def forward(s, x):
        b, c, h, w = x.shape
        t = s.n(x).reshape(b, c, h * w).transpose(1, 2)
        q, k, v = s.qkv(t).reshape(b, h * w, 3, s.h, c // s.h).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v)
        a = a.transpose(1, 2).reshape(b, h * w, c)
        return x + s.o(a).transpose(1, 2).reshape(b, c, h, w)
class UNet(nn.Module):
    def __init__(s, ch=(32, 64, 96), tdim=128):
        super().__init__()
        s.tdim = tdim
        s.temb = nn.Sequential(nn.Linear(tdim, tdim * 2), nn.SiLU(), nn.Linear(tdim * 2, tdim))
        s.inp = nn.Conv2d(C, ch[0], 3, padding=1)
        s.down = nn.ModuleList(); s.pool = nn.ModuleList()
        cin = ch[0]
        for i, c in enumerate(ch):
            s.down.append(ResBlock(cin, c, tdim)); cin = c
            s.pool.append(nn.Conv2d(c, c, 3, stride=2, padding=1) if i < len(ch) - 1 else nn.Identity())
        s.mid1 = ResBlock(cin, cin, tdim); s.attn = Attn(cin); s.mid2 = ResBlock(cin, cin, tdim)
        s.up = nn.ModuleList()
        for i, c in reversed(list(enumerate(ch))):
            s.up.append(ResBlock(cin + c, c, tdim)); cin = c
        s.outn = nn.GroupNorm(8, cin); s.out = nn.Conv2d(cin, C, 3, padding=1)
    def forward(s, x, t):
        temb = s.temb(timestep_embedding(t, s.tdim))
        h = s.inp(x); skips = []
        for blk, pool in zip(s.down, s.pool):
            h = blk(h, temb); skips.append(h); h = pool(h)
        h = s.mid2(s.attn(s.mid1(h, temb)), temb)
        for i, blk in enumerate(s.up):
            sk = skips.pop()
            if h.shape[-1] != sk.shape[-1]: h = F.interpolate(h, scale_factor=2, mode="nearest")
            h = blk(torch.cat([h, sk], dim=1), temb)
        return s.out(F.silu(s.outn(h)))
model = UNet()
ema = copy.deepcopy(model).requires_grad_(False)
opt = torch.optim.Adam(model.parameters(), lr=2e-4)
betas = torch.linspace(1e-4, 0.02, T)
alphas_cum = torch.cumprod(1 - betas, 0)
g = torch.Generator().manual_seed(1)
data = torch.rand(3, B, C, H, H, generator=g) * 2 - 1
losses = []
torch.manual_seed(123)
for step in range(3):
    x0 = data[step]
    t = torch.randint(0, T, (B,))
    noise = torch.randn_like(x0)
    a = alphas_cum[t][:, None, None, None]
    noisy = a.sqrt() * x0 + (1 - a).sqrt() * noise
    pred = model(noisy, t)
    loss = F.mse_loss(pred, noise)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    with torch.no_grad():
        ep, mp = list(ema.parameters()), list(model.parameters())
        torch._foreach_lerp_(ep, mp, 1 - 0.999)
        for eb, mb in zip(ema.buffers(), model.buffers()): eb.copy_(mb)
report(policy, [model, ema], losses)
