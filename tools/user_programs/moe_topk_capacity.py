# Untuned: a hand-written mixture-of-experts transformer-ish token model. Each MoE layer: router
# logits, softmax, topk(k=2) with renormalised gates; assignments flattened and sorted with
# argsort(stable=True); per-expert counts from bincount and a capacity limit: the position of each
# assignment within its expert (cumsum of a one-hot) compared with the capacity gives a boolean keep
# mask, kept assignments found with nonzero() (data-dependent shapes); tokens gathered with
# index_select, split per expert with torch.split(x, counts.tolist()), each expert an MLP, results
# concatenated, scaled by their gates and scattered back with index_add_; the dropped tokens'
# residual rows are overwritten through index_copy on a fresh tensor. Switch-style load-balancing
# aux loss (fraction routed x mean router prob) plus a router z-loss; per-expert counts logged
# with .tolist(). Two MoE layers between attention blocks (matmul + softmax), AdamW, 4 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, NE, K, C = 16, 64, 192, 6, 2, 32
class Expert(nn.Module):
    def __init__(s): super().__init__(); s.w1 = nn.Linear(D, 2 * D); s.w2 = nn.Linear(2 * D, D)
    def forward(s, x): return s.w2(F.gelu(s.w1(x)))
class MoE(nn.Module):
    def __init__(s, cap_factor=1.25):
        super().__init__()
        s.router = nn.Linear(D, NE, bias=False); s.experts = nn.ModuleList([Expert() for _ in range(NE)])
        s.cap_factor = cap_factor; s.ln = nn.LayerNorm(D)
    def forward(s, h):
        x = s.ln(h).reshape(-1, D); n = x.shape[0]
        logits = s.router(x)
        probs = logits.softmax(-1)
        gate, eid = probs.topk(K, dim=-1)
        gate = gate / gate.sum(-1, keepdim=True)
        flat_e = eid.reshape(-1); flat_g = gate.reshape(-1)
        flat_tok = torch.arange(n).repeat_interleave(K)
        onehot = F.one_hot(flat_e, NE)
        pos = (onehot.cumsum(0) - 1).gather(1, flat_e.unsqueeze(1)).squeeze(1)
        cap = int(s.cap_factor * n * K / NE)
        keep = pos < cap
        kept = keep.nonzero().squeeze(1)
        e_k, tok_k, g_k = flat_e[kept], flat_tok[kept], flat_g.index_select(0, kept)
        order = torch.argsort(e_k, stable=True)
        e_s, tok_s, g_s = e_k[order], tok_k[order], g_k[order]
        counts = torch.bincount(e_s, minlength=NE)
        xs = x.index_select(0, tok_s)
        outs = [s.experts[i](chunk) for i, chunk in enumerate(torch.split(xs, counts.tolist()))]
        y = torch.cat(outs) * g_s.unsqueeze(1)
        out = torch.zeros_like(x).index_add_(0, tok_s, y)
        routed = torch.zeros(n, dtype=torch.bool); routed[tok_s] = True
        dropped = (~routed).nonzero().squeeze(1)
        if dropped.numel():   # dropped tokens: half their normed input instead
            out = out.index_copy(0, dropped, 0.5 * x.index_select(0, dropped))
        frac = F.one_hot(eid[:, 0], NE).float().mean(0)
        aux = NE * (frac * probs.mean(0)).sum() + 1e-3 * torch.logsumexp(logits, -1).square().mean()
        return h + out.view_as(h), aux, counts
class Attn(nn.Module):
    def __init__(s): super().__init__(); s.ln = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
    def forward(s, h):
        q, k, v = s.qkv(s.ln(h)).view(h.shape[0], T, 3, 4, D // 4).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (D // 4) ** 0.5, -1)
        return h + s.o((a @ v).transpose(1, 2).reshape(h.shape))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(C, D); s.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        s.a1 = Attn(); s.m1 = MoE(); s.a2 = Attn(); s.m2 = MoE(1.0); s.head = nn.Linear(D, C)
    def forward(s, ids):
        h = s.emb(ids) + s.pos
        h = s.a1(h); h, aux1, c1 = s.m1(h); h = s.a2(h); h, aux2, c2 = s.m2(h)
        return s.head(h), aux1 + aux2, (c1, c2)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    ids = torch.randint(0, C, (B, T), generator=g)
    tgt = torch.roll(ids, -1, 1)
    logits, aux, counts = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, C), tgt.reshape(-1)) + 0.01 * aux
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), aux.detach()] + [torch.tensor(float(v)) for c in counts for v in c.tolist()]
report(policy, [model], losses)
