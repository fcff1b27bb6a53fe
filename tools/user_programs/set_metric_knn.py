# Untuned: metric learning over variable-size sets. Each example is a padded set of up to 48
# 32-d elements; a set transformer of nn.MultiheadAttention layers (batch_first, key_padding_mask,
# need_weights=True with average_attn_weights=False, the weights used by an entropy regulariser)
# and PReLU feed-forwards, pooled by a learned seed query attending with the same padding mask
# (need_weights=True, averaged). Embeddings are L2-normalised; losses on the batch's distance matrix
# by torch.cdist: batch-hard triplet mining (the hardest positive by masked max, the hardest
# negative by topk(largest=False) on a masked matrix), MarginRankingLoss on those, a kNN
# soft-neighbour loss (kthvalue for a per-anchor radius, a soft mask below it), and
# CosineEmbeddingLoss on random pairs. Rprop-free: ASGD, then gradient clipping, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, S, DIN, D, H, NCLS = 96, 48, 32, 128, 4, 12
class SAB(nn.Module):
    def __init__(s):
        super().__init__()
        s.att = nn.MultiheadAttention(D, H, batch_first=True)
        s.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.PReLU(), nn.Linear(4 * D, D))
        s.n1, s.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
    def forward(s, x, pad):
        a, w = s.att(x, x, x, key_padding_mask=pad, need_weights=True, average_attn_weights=False)
        x = s.n1(x + a)
        return s.n2(x + s.ff(x)), w
class SetNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(DIN, D)
        s.layers = nn.ModuleList(SAB() for _ in range(3))
        s.seed = nn.Parameter(torch.randn(1, 1, D) * 0.1)
        s.pool = nn.MultiheadAttention(D, H, batch_first=True)
        s.out = nn.Linear(D, 64)
    def forward(s, x, pad):
        h = s.inp(x)
        ents = []
        for l in s.layers:
            h, w = l(h, pad)
            ents.append(-(w * (w + 1e-9).log()).sum(-1)[~pad.unsqueeze(1).expand(-1, H, -1)].mean())
        p, pw = s.pool(s.seed.expand(x.shape[0], -1, -1), h, h, key_padding_mask=pad, need_weights=True)
        return F.normalize(s.out(p.squeeze(1)), dim=-1), torch.stack(ents).mean(), pw
model = SetNet()
opt = torch.optim.ASGD(model.parameters(), lr=0.05, t0=1)
rank = nn.MarginRankingLoss(margin=0.3)
cosl = nn.CosineEmbeddingLoss(margin=0.2)
g = torch.Generator().manual_seed(1)
protos = torch.randn(NCLS, DIN, generator=g)
def batch():
    y = torch.randint(0, NCLS, (B,), generator=g)
    n = torch.randint(8, S + 1, (B,), generator=g)
    x = 0.3 * protos[y].unsqueeze(1) + torch.randn(B, S, DIN, generator=g)
    pad = torch.arange(S)[None, :] >= n[:, None]
    x = x.masked_fill(pad.unsqueeze(-1), 0.0)
    return x, pad, y
losses = []
for step in range(3):
    x, pad, y = batch()
    emb, ent, pw = model(x, pad)
    dist = torch.cdist(emb, emb)
    same = y[:, None] == y[None, :]
    eye = torch.eye(B, dtype=torch.bool)
    hard_pos = dist.masked_fill(~same | eye, float("-inf")).max(1).values
    hard_neg = dist.masked_fill(same, float("inf")).topk(3, dim=1, largest=False).values
    valid = torch.isfinite(hard_pos)
    trip = rank(hard_neg[valid, 0], hard_pos[valid], torch.ones(int(valid.sum())))
    radius = dist.detach().kthvalue(6, dim=1).values
    soft = torch.sigmoid((radius[:, None] - dist) * 10) * (~eye)
    knn = -((soft * same).sum(1) / soft.sum(1).clamp(min=1e-6)).clamp(min=1e-6).log().mean()
    i = torch.randperm(B, generator=g); j = torch.randperm(B, generator=g)
    pair = cosl(emb[i], emb[j], (same[i, j].float() * 2 - 1))
    loss = trip + knn + pair + 0.01 * ent + 0.01 * hard_neg[:, 1:].mean()
    opt.zero_grad()
    loss.backward()
    gn = nn.utils.clip_grad_norm_(model.parameters(), 2.0)
    opt.step()
    losses += [loss.detach(), trip.detach(), knn.detach(), pair.detach(), ent.detach(), gn, pw.detach().sum()]
report(policy, [model], losses)
