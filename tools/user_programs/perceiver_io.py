# Untuned: a Perceiver IO on variable-length point sets. A learned latent array (nn.Parameter,
# expanded over the batch) cross-attends to a long input (B, M, C) of features plus Fourier
# position encodings, padded to M with a key_padding_mask from per-sample lengths. The first
# cross-attention has its own weights; iterations 2-3 reuse one shared cross-attention module and
# one shared latent self-attention block that is called twice per iteration (the same modules run
# several times per forward, Perceiver's weight sharing). Cross-attention is nn.MultiheadAttention
# (kdim/vdim != embed_dim, dropout 0.1, need_weights=False); the latent block is hand-written with
# F.scaled_dot_product_attention, an additive float attn_mask (a learned relative bias over latent
# pairs) and dropout_p, GELU MLP, pre-LN. Outputs: a classification token from the mean latent,
# and Perceiver IO decoding where per-position output queries (position encodings) cross-attend to
# the latents to regress a per-point target (masked mean over valid points). AdamW, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, M, CIN, NF, NL, D, H, NCLS = 12, 1024, 16, 8, 64, 128, 4, 10
PE = 2 * 2 * NF + 2
def fourier(pos):                                   # pos (B, M, 2) in [-1, 1]
    f = torch.linspace(1.0, 16.0, NF)
    a = pos.unsqueeze(-1) * f * math.pi              # (B, M, 2, NF)
    return torch.cat([pos, a.sin().flatten(2), a.cos().flatten(2)], -1)
class Cross(nn.Module):
    def __init__(s, kv_dim):
        super().__init__()
        s.lnq = nn.LayerNorm(D); s.lnkv = nn.LayerNorm(kv_dim)
        s.attn = nn.MultiheadAttention(D, H, dropout=0.1, kdim=kv_dim, vdim=kv_dim, batch_first=True)
        s.ln2 = nn.LayerNorm(D); s.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * D, D))
    def forward(s, q, kv, pad=None):
        kvn = s.lnkv(kv)
        a, _ = s.attn(s.lnq(q), kvn, kvn, key_padding_mask=pad, need_weights=False)
        q = q + a
        return q + s.mlp(s.ln2(q))
class LatentSelf(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1 = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
        s.rel = nn.Parameter(torch.zeros(H, NL, NL))
        s.ln2 = nn.LayerNorm(D); s.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        s.drop = nn.Dropout(0.1)
    def forward(s, z):
        b = z.shape[0]
        q, k, v = s.qkv(s.ln1(z)).view(b, NL, 3, H, D // H).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=s.rel, dropout_p=0.1 if s.training else 0.0)
        z = z + s.drop(s.o(a.transpose(1, 2).reshape(b, NL, D)))
        return z + s.drop(s.mlp(s.ln2(z)))
class PerceiverIO(nn.Module):
    def __init__(s):
        super().__init__()
        s.latents = nn.Parameter(torch.randn(NL, D) * 0.02)
        s.cross0 = Cross(CIN + PE); s.cross = Cross(CIN + PE); s.selfb = LatentSelf()
        s.head = nn.Linear(D, NCLS)
        s.qproj = nn.Linear(PE, D); s.dec = Cross(D); s.out = nn.Linear(D, 1)
    def forward(s, x, pos, pad):
        pe = fourier(pos)
        inp = torch.cat([x, pe], -1)
        z = s.latents.unsqueeze(0).expand(x.shape[0], -1, -1)
        for it in range(3):
            z = (s.cross0 if it == 0 else s.cross)(z, inp, pad)
            for _ in range(2): z = s.selfb(z)
        logits = s.head(z.mean(1))
        per_point = s.out(s.dec(s.qproj(pe), z)).squeeze(-1)          # (B, M)
        return logits, per_point
model = PerceiverIO()
opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    lens = torch.randint(M // 2, M + 1, (B,), generator=g)
    pad = torch.arange(M).unsqueeze(0) >= lens.unsqueeze(1)              # True = padding
    pos = torch.rand(B, M, 2, generator=g) * 2 - 1
    x = torch.randn(B, M, CIN, generator=g).masked_fill(pad.unsqueeze(-1), 0.0)
    y = torch.randint(0, NCLS, (B,), generator=g)
    tgt = torch.sin(3 * pos[..., 0]) * torch.cos(2 * pos[..., 1]) + x[..., 0]
    logits, per_point = model(x, pos, pad)
    valid = (~pad).float()
    rec = ((per_point - tgt).pow(2) * valid).sum() / valid.sum()
    loss = F.cross_entropy(logits, y) + rec
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), rec.detach()]
model.eval()
with torch.no_grad(): losses.append(model(x, pos, pad)[1].square().sum())
report(policy, [model], losses)
