# Untuned: a segment-pooling model written for reproducibility. torch.use_deterministic_algorithms(True)
# with torch.utils.deterministic.fill_uninitialized_memory = True (torch.empty buffers come back filled
# with NaN). Tokens carry random segment ids; each block sums token features into segments with
# `torch.zeros(...).index_add_(0, seg, h)` (in place on a fresh buffer, differentiable), counts them
# with `scatter_add_`, builds a per-segment histogram of quantised activations by
# `index_put_((seg, bin), ones, accumulate=True)` into a torch.empty buffer zeroed by `zero_()`, and
# a prefix feature by `cumsum` over each sequence (and `cumsum` of a flipped view for the suffix);
# the segment means are gathered back to tokens by indexing. Also `put_(accumulate=True)` for a
# flat count and `index_add` with an alpha. SGD with Nesterov momentum, five steps.
import torch, torch.nn as nn, torch.nn.functional as F
import torch.utils.deterministic
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
torch.utils.deterministic.fill_uninitialized_memory = True
B, T, D, S, NB, NC = 16, 256, 128, 64, 16, 8
class SegBlock(nn.Module):
    def __init__(s):
        super().__init__()
        s.norm = nn.LayerNorm(D); s.inp = nn.Linear(D, D)
        s.mix = nn.Linear(3 * D + NB, 2 * D); s.out = nn.Linear(2 * D, D)
    def forward(s, x, seg):                                       # x: B*T x D, seg: B*T (global ids)
        h = F.gelu(s.inp(s.norm(x)))
        nseg = B * S
        sums = torch.zeros(nseg, D).index_add_(0, seg, h)          # differentiable in-place index_add_
        cnt = torch.zeros(nseg).scatter_add_(0, seg, torch.ones_like(seg, dtype=torch.float32))
        means = sums / cnt.clamp(min=1)[:, None]
        q = (torch.sigmoid(h.detach().mean(1)) * NB).long().clamp(max=NB - 1)
        hist = torch.empty(nseg, NB)                               # NaN-filled under the flag
        hist.zero_()
        hist.index_put_((seg, q), torch.ones(seg.shape[0]), accumulate=True)
        hist = hist / cnt.clamp(min=1)[:, None]
        hb = h.view(B, T, D)
        prefix = hb.cumsum(1) / torch.arange(1, T + 1).view(1, T, 1)
        suffix = hb.flip(1).cumsum(1).flip(1) / torch.arange(T, 0, -1).view(1, T, 1)
        feat = torch.cat([means[seg], (prefix - suffix).reshape(-1, D), h, hist[seg]], -1)
        return x + s.out(F.gelu(s.mix(feat)))
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Linear(12, D); s.blocks = nn.ModuleList([SegBlock() for _ in range(3)])
        s.head = nn.Linear(D, NC)
    def forward(s, x, seg):
        h = s.emb(x).reshape(-1, D)
        for b in s.blocks: h = b(h, seg)
        nseg = B * S
        pooled = torch.zeros(nseg, D).index_add(0, seg, h, alpha=0.5)
        return s.head(pooled.view(B, S, D).amax(1))
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    x = torch.randn(B, T, 12, generator=g)
    seg = torch.randint(0, S, (B, T), generator=g).sort(1).values + torch.arange(B)[:, None] * S
    seg = seg.reshape(-1)
    y = torch.randint(0, NC, (B,), generator=g)
    logits = model(x, seg)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad(); loss.backward(); opt.step()
    flat = torch.zeros(B * S)
    flat.put_(seg, torch.ones(seg.shape[0]), accumulate=True)
    losses += [loss.detach(), (flat == 0).sum().float()]
report(policy, [model], losses)
