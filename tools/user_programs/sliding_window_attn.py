# Untuned: Longformer-style local attention on a long sequence (B=2, T=384, D=64, 4 heads, window 17).
# Keys and values are padded and windowed into overlapping views of the same storage, by
# Tensor.unfold in even layers and by as_strided in odd layers; a band mask (unfolded from a padded
# ones vector) masks the padding; the first 2 tokens are global (every query also scores them, and they
# attend to the whole sequence, written back by torch.cat). Data-dependent control in forward: if
# x.abs().max().item() exceeds a threshold the residual stream is rescaled. A learned gate picks
# tokens by a boolean mask (x[mask], which calls nonzero), refines them with an MLP and scatters them
# back with index_put_ on a clone in even layers and masked_scatter in odd ones. After layer 2 a
# learned score keeps the top 3/4 of the tokens (torch.topk, gather, scaled by the sigmoid of the
# score), restored to sequence order by argsort; per-token targets are gathered the same way.
# AdamW, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, H, W, G, C, L = 2, 384, 64, 4, 17, 2, 12, 4
dh, w2 = D // H, W // 2
class Layer(nn.Module):
    def __init__(s, i):
        super().__init__()
        s.i = i; s.ln = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
        s.gate = nn.Linear(D, 1); s.ref = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        s.ln2 = nn.LayerNorm(D); s.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
    def windows(s, t):
        tp = F.pad(t, (0, 0, w2, w2))                       # (B, H, T + 2 w2, dh)
        if s.i % 2 == 0: return tp.unfold(2, W, 1).transpose(-1, -2)   # (B, H, T, W, dh)
        st = tp.stride()
        return tp.as_strided((tp.shape[0], H, tp.shape[2] - W + 1, W, dh), (st[0], st[1], st[2], st[2], st[3]))
    def forward(s, x):
        Bn, Tn, _ = x.shape
        q, k, v = s.qkv(s.ln(x)).view(Bn, Tn, 3, H, dh).permute(2, 0, 3, 1, 4)
        q = q * dh ** -0.5
        kw, vw = s.windows(k), s.windows(v)
        sl = torch.einsum("bhtd,bhtwd->bhtw", q, kw)
        valid = F.pad(torch.ones(Tn, dtype=torch.bool), (w2, w2)).unfold(0, W, 1)
        sl = sl.masked_fill(~valid, float("-inf"))
        sg = q @ k[:, :, :G].transpose(-1, -2)
        p = torch.softmax(torch.cat([sl, sg], -1), -1)
        out = torch.einsum("bhtw,bhtwd->bhtd", p[..., :W], vw) + p[..., W:] @ v[:, :, :G]
        og = torch.softmax(q[:, :, :G] @ k.transpose(-1, -2), -1) @ v
        out = torch.cat([og, out[:, :, G:]], 2)
        x = x + s.o(out.transpose(1, 2).reshape(Bn, Tn, D))
        if x.abs().max().item() > 6.0:
            x = x * (6.0 / x.abs().amax(-1, keepdim=True)).clamp(max=1.0)
        mask = s.gate(x).squeeze(-1) > 0
        sel = x[mask]
        upd = sel + s.ref(sel) * torch.sigmoid(s.gate(sel))
        if s.i % 2 == 0:
            x = x.clone(); x.index_put_((mask,), upd)
        else:
            x = x.masked_scatter(mask[..., None].expand_as(x), upd)
        return x + s.ff(s.ln2(x)), mask.sum()
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Linear(16, D); s.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        s.layers = nn.ModuleList([Layer(i) for i in range(L)]); s.score = nn.Linear(D, 1)
        s.head = nn.Linear(D, C)
    def forward(s, x, y):
        h = s.emb(x) + s.pos
        counts = []
        for i, l in enumerate(s.layers):
            h, c = l(h); counts.append(c)
            if i == 1:
                sc = s.score(h).squeeze(-1)
                sc = torch.cat([sc[:, :G] + 100.0, sc[:, G:]], 1)   # keep the global tokens
                top = torch.topk(sc, T * 3 // 4, dim=1)
                order = top.indices.argsort(dim=1)
                idx = top.indices.gather(1, order)
                h = h.gather(1, idx[..., None].expand(-1, -1, D)) * torch.sigmoid(top.values.gather(1, order))[..., None]
                y = y.gather(1, idx)
        return s.head(h), y, torch.stack(counts)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, T, 16, generator=g); y = torch.randint(0, C, (B, T), generator=g)
    logits, yk, counts = model(x, y)
    loss = F.cross_entropy(logits.reshape(-1, C), yk.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), counts.sum(), yk.sum()]
report(policy, [model], losses)
