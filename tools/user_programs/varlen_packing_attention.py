# Untuned: pretraining a small Llama-style decoder on packed rows. Each step draws documents of random
# length and packs them greedily into B rows of T tokens (the last document of a row cut to fit). Per
# row: the block-diagonal causal mask by torch.block_diag of per-document tril masks (and checked
# against one built from document ids by repeat_interleave of the lengths), position ids reset per
# document (arange minus the repeat_interleave'd cumsum of lengths), rotary embeddings gathered by
# those position ids. Attention by F.scaled_dot_product_attention with the boolean mask (B, 1, T, T)
# (grouped-query: 2 KV heads repeated by repeat_interleave to 6 query heads). RMSNorm and SwiGLU by
# hand. Labels are the next token with ignore_index (-100) at each document's last position (no
# prediction across a boundary) and at the row's padding; per-token weights 1/len(document) so that
# every document counts the same, loss = sum(w * ce(reduction="none")) / sum(w over valid tokens).
# Tied embeddings, AdamW with a warmup LambdaLR, 5 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, B, T, D, H, KVH, L = 1000, 6, 256, 192, 6, 2, 4
HD = D // H
class RMSNorm(nn.Module):
    def __init__(s, d, eps=1e-6): super().__init__(); s.w = nn.Parameter(torch.ones(d)); s.eps = eps
    def forward(s, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.w
class SwiGLU(nn.Module):
    def __init__(s, d, h): super().__init__(); s.gate = nn.Linear(d, h, bias=False); s.up = nn.Linear(d, h, bias=False); s.down = nn.Linear(h, d, bias=False)
    def forward(s, x): return s.down(F.silu(s.gate(x)) * s.up(x))
def rope_tables(pos):  # pos (B, T) -> cos, sin (B, 1, T, HD/2)
    inv = 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD))
    ang = pos.float()[..., None] * inv
    return ang.cos()[:, None], ang.sin()[:, None]
def rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)
class Layer(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1, s.n2 = RMSNorm(D), RMSNorm(D)
        s.q, s.kv, s.o = nn.Linear(D, D, bias=False), nn.Linear(D, 2 * KVH * HD, bias=False), nn.Linear(D, D, bias=False)
        s.mlp = SwiGLU(D, 512)
    def forward(s, x, mask, cos, sin):
        Bn, Tn, _ = x.shape
        h = s.n1(x)
        q = s.q(h).view(Bn, Tn, H, HD).transpose(1, 2)
        k, v = s.kv(h).view(Bn, Tn, 2, KVH, HD).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = k.repeat_interleave(H // KVH, 1), v.repeat_interleave(H // KVH, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + s.o(a.transpose(1, 2).reshape(Bn, Tn, D))
        return x + s.mlp(s.n2(x))
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); nn.init.normal_(s.emb.weight, std=0.02)
        s.layers = nn.ModuleList(Layer() for _ in range(L)); s.norm = RMSNorm(D)
    def forward(s, ids, mask, pos):
        cos, sin = rope_tables(pos)
        x = s.emb(ids)
        for l in s.layers: x = l(x, mask, cos, sin)
        return F.linear(s.norm(x), s.emb.weight)
def pack(g):
    rows, masks, poss, labels, weights = [], [], [], [], []
    for _ in range(B):
        lens = []
        while sum(lens) < T - 8: lens.append(min(int(torch.randint(8, 120, (1,), generator=g)), T - sum(lens)))
        pad = T - sum(lens)
        L_ = torch.tensor(lens)
        toks = [torch.randint(1, V, (n,), generator=g) for n in lens]
        for t in toks: t[1::2] = (t[0:-1:2] * 13 + 7) % V          # learnable bigram structure
        ids = torch.cat(toks + [torch.zeros(pad, dtype=torch.long)])
        m = torch.block_diag(*[torch.tril(torch.ones(n, n, dtype=torch.bool)) for n in lens] + ([torch.eye(pad, dtype=torch.bool)] if pad else []))
        doc = torch.repeat_interleave(torch.arange(len(lens) + (1 if pad else 0)), torch.tensor(lens + ([pad] if pad else [])))
        m2 = (doc[:, None] == doc[None]) & torch.tril(torch.ones(T, T, dtype=torch.bool))
        if pad: m2[sum(lens):, sum(lens):] = torch.eye(pad, dtype=torch.bool)
        assert torch.equal(m, m2)
        starts = torch.cumsum(L_, 0) - L_
        pos = torch.arange(sum(lens)) - torch.repeat_interleave(starts, L_)
        pos = torch.cat([pos, torch.zeros(pad, dtype=torch.long)])
        lab = torch.cat([ids[1:], ids.new_full((1,), -100)])
        lab[torch.cumsum(L_, 0) - 1] = -100                            # document ends: no target
        lab[sum(lens):] = -100
        w = torch.cat([torch.repeat_interleave(1.0 / L_.float(), L_), torch.zeros(pad)])
        rows.append(ids); masks.append(m); poss.append(pos); labels.append(lab); weights.append(w)
    return torch.stack(rows), torch.stack(masks)[:, None], torch.stack(poss), torch.stack(labels), torch.stack(weights)
model = LM()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    ids, mask, pos, lab, w = pack(g)
    logits = model(ids, mask, pos)
    ce = F.cross_entropy(logits.reshape(-1, V), lab.reshape(-1), ignore_index=-100, reduction="none").view(B, T)
    valid = lab != -100
    loss = (ce * w).sum() / (w * valid).sum()
    opt.zero_grad(); loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); sched.step()
    losses += [loss.detach(), ce[valid].mean().detach(), valid.sum()]
report(policy, [model], losses)
