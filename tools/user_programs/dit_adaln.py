# Untuned: a small diffusion transformer (DiT) on random 4x16x16 "latents" with class labels.
# Patchify by reshape/permute (patch 2: 64 tokens) and a Linear, learned positional embedding;
# sinusoidal timestep embedding (exp/arange frequencies, cat of cos and sin) through an MLP; label
# embedding with an extra "null" class and label dropout for classifier-free guidance (torch.rand <
# p, torch.where). Blocks with adaLN-Zero: SiLU + Linear on the conditioning, .chunk(6) into
# shift/scale/gate for attention and MLP, LayerNorm without affine, x * (1 + scale) + shift,
# attention by F.scaled_dot_product_attention on qkv split with reshape/permute, gated residuals,
# GELU(tanh) MLP; zero-initialised modulation and final layer. The noising: t by randint, the
# alphas_cumprod buffer (cosine schedule, computed once) indexed by t, x_t = sqrt(a) x0 + sqrt(1-a)
# eps; MSE on the predicted noise after unpatchify. AdamW, and an EMA copy (copy.deepcopy,
# requires_grad_(False)) updated each step with torch._foreach_lerp_ (EMA=swa: a
# torch.optim.swa_utils.AveragedModel with a custom avg_fn and use_buffers=True). 3 steps; the EMA
# model's prediction at the end is reported too. CKPT=1: every block under torch.utils.checkpoint
# (use_reentrant=False), as diffusion codebases offer.
import copy, math, os, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from common import setup, report
CKPT = os.environ.get("CKPT") == "1"
policy = setup()
torch.use_deterministic_algorithms(True)
B, C, S, P, Dm, H, DEPTH, NCLS, T = 16, 4, 16, 2, 96, 4, 4, 10, 1000
def timestep_embedding(t, dim, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)
def modulate(x, shift, scale): return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.norm1 = nn.LayerNorm(Dm, elementwise_affine=False, eps=1e-6)
        s.qkv = nn.Linear(Dm, 3 * Dm); s.proj = nn.Linear(Dm, Dm)
        s.norm2 = nn.LayerNorm(Dm, elementwise_affine=False, eps=1e-6)
        s.mlp = nn.Sequential(nn.Linear(Dm, 4 * Dm), nn.GELU(approximate="tanh"), nn.Linear(4 * Dm, Dm))
        s.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(Dm, 6 * Dm))
        nn.init.zeros_(s.adaLN[-1].weight); nn.init.zeros_(s.adaLN[-1].bias)
    def attn(s, x):
        b, n, _ = x.shape
        q, k, v = s.qkv(x).reshape(b, n, 3, H, Dm // H).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v)
        return s.proj(o.transpose(1, 2).reshape(b, n, Dm))
    def forward(s, x, c):
        sh1, sc1, g1, sh2, sc2, g2 = s.adaLN(c).chunk(6, dim=1)
        x = x + g1.unsqueeze(1) * s.attn(modulate(s.norm1(x), sh1, sc1))
        x = x + g2.unsqueeze(1) * s.mlp(modulate(s.norm2(x), sh2, sc2))
        return x
class DiT(nn.Module):
    def __init__(s):
        super().__init__()
        s.patch = nn.Linear(C * P * P, Dm)
        s.pos = nn.Parameter(torch.randn(1, (S // P) ** 2, Dm) * 0.02)
        s.t_mlp = nn.Sequential(nn.Linear(256, Dm), nn.SiLU(), nn.Linear(Dm, Dm))
        s.y_emb = nn.Embedding(NCLS + 1, Dm)
        s.blocks = nn.ModuleList([Block() for _ in range(DEPTH)])
        s.norm_f = nn.LayerNorm(Dm, elementwise_affine=False, eps=1e-6)
        s.ada_f = nn.Sequential(nn.SiLU(), nn.Linear(Dm, 2 * Dm))
        s.out = nn.Linear(Dm, C * P * P)
        for m in (s.ada_f[-1], s.out): nn.init.zeros_(m.weight); nn.init.zeros_(m.bias)
    def forward(s, x, t, y):
        b = x.shape[0]; g = S // P
        x = x.reshape(b, C, g, P, g, P).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, C * P * P)
        x = s.patch(x) + s.pos
        c = s.t_mlp(timestep_embedding(t, 256)) + s.y_emb(y)
        for blk in s.blocks:
            x = checkpoint(blk, x, c, use_reentrant=False) if CKPT and s.training else blk(x, c)
        sh, sc = s.ada_f(c).chunk(2, dim=1)
        x = s.out(modulate(s.norm_f(x), sh, sc))
        return x.reshape(b, g, g, C, P, P).permute(0, 3, 1, 4, 2, 5).reshape(b, C, S, S)
class Diffusion(nn.Module):
    def __init__(s):
        super().__init__()
        steps = torch.arange(T + 1, dtype=torch.float64) / T
        f = torch.cos((steps + 0.008) / 1.008 * math.pi / 2) ** 2
        betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
        s.register_buffer("alphas_cumprod", torch.cumprod(1 - betas, 0).float())
diff = Diffusion()
model = DiT()
SWA = os.environ.get("EMA") == "swa"
if SWA:
    from torch.optim.swa_utils import AveragedModel
    ema = AveragedModel(model, avg_fn=lambda avg, cur, n: avg + 0.1 * (cur - avg), use_buffers=True)
else:
    ema = copy.deepcopy(model).requires_grad_(False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x0 = torch.randn(B, C, S, S, generator=g)
    y = torch.randint(0, NCLS, (B,), generator=g)
    y = torch.where(torch.rand(B, generator=g) < 0.1, torch.full_like(y, NCLS), y)   # CFG label dropout
    t = torch.randint(0, T, (B,), generator=g)
    eps = torch.randn(x0.shape, generator=g)
    a = diff.alphas_cumprod[t].view(B, 1, 1, 1)
    xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
    loss = F.mse_loss(model(xt, t, y), eps)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if SWA:
        ema.update_parameters(model)
    else:
        with torch.no_grad():
            torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1 - 0.9)
    losses.append(loss.detach())
with torch.no_grad(): losses.append(ema(xt, t, y).square().sum())
report(policy, [model, ema, diff], losses)
