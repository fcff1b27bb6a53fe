# Untuned: a Kim-style text CNN with sparse embedding gradients. nn.Embedding(sparse=True,
# padding_idx=0) for words and a second sparse table for character trigrams (hashed, summed by
# F.embedding_bag with offsets); sequences padded by nn.utils.rnn.pad_sequence; three parallel
# Conv1d widths with Mish, max over time by AdaptiveMaxPool1d(return_indices=True) (the indices
# kept to count which positions fired), a Bilinear interaction of the two views, AlphaDropout and
# SELU in the head. Word-level auxiliary loss by skip-gram negative sampling (negatives shared across the batch) on the same table.
# torch.optim.SparseAdam for the two sparse tables, NAdam (decoupled weight decay) for the rest,
# gradient clipping of the dense parameters only, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, NTRI, D, B, NC, LMAX, NNEG = 8000, 4000, 96, 96, 7, 192, 64
class TextCNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D, padding_idx=0, sparse=True)
        s.tri = nn.Embedding(NTRI, D, sparse=True)
        s.ctx = nn.Embedding(V, D, sparse=True)
        s.convs = nn.ModuleList(nn.Conv1d(D, 192, k, padding=k // 2) for k in (3, 5, 7))
        s.pool = nn.AdaptiveMaxPool1d(1, return_indices=True)
        s.red = nn.Linear(3 * 192, 64)
        s.bil = nn.Bilinear(64, D, 128)
        s.head = nn.Sequential(nn.SELU(), nn.AlphaDropout(0.1), nn.Linear(128, NC))
    def forward(s, words, tri_idx, tri_off):
        e = s.emb(words)                                  # B, L, D
        h = e.transpose(1, 2)
        feats, where = [], []
        for c in s.convs:
            a = F.mish(c(h))
            m, i = s.pool(a)
            feats.append(m.squeeze(-1)); where.append(i)
        f = torch.cat(feats, 1)
        t = F.embedding_bag(tri_idx, s.tri.weight, tri_off, mode="mean", sparse=True)
        return s.head(s.bil(s.red(f), t)), torch.cat(where, 1), e
model = TextCNN()
sparse_p = [model.emb.weight, model.tri.weight, model.ctx.weight]
dense_p = [p for n, p in model.named_parameters() if not n.startswith(("emb.", "tri.", "ctx."))]
opt_s = torch.optim.SparseAdam(sparse_p, lr=3e-3)
opt_d = torch.optim.NAdam(dense_p, lr=1e-3, weight_decay=1e-2, decoupled_weight_decay=True)
g = torch.Generator().manual_seed(1)
def batch():
    lens = torch.randint(LMAX // 4, LMAX + 1, (B,), generator=g)
    seqs = [torch.randint(1, V, (int(n),), generator=g) for n in lens]
    words = pad_sequence(seqs, batch_first=True, padding_value=0)
    ntri = torch.randint(5, 40, (B,), generator=g)
    tri_idx = torch.randint(0, NTRI, (int(ntri.sum()),), generator=g)
    tri_off = torch.cat([torch.zeros(1, dtype=torch.long), ntri.cumsum(0)[:-1]])
    y = (words[:, 0] % NC)
    return words, lens, tri_idx, tri_off, y
losses = []
for step in range(3):
    words, lens, tri_idx, tri_off, y = batch()
    logits, where, e = model(words, tri_idx, tri_off)
    cls = F.cross_entropy(logits, y)
    # skip-gram with negative sampling on (centre, neighbour) pairs inside each sequence
    mask = torch.arange(words.shape[1])[None, :] < (lens[:, None] - 1)
    centre = words[:, :-1][mask[:, :-1]]
    ctxw = words[:, 1:][mask[:, :-1]]
    neg = torch.randint(1, V, (NNEG,), generator=g)      # negatives shared across the batch
    ce = model.emb(centre)
    pos = F.logsigmoid((ce * model.ctx(ctxw)).sum(-1))
    negs = F.logsigmoid(-(ce @ model.ctx(neg).T)).mean(-1) * 5
    sg = -(pos + negs).mean()
    loss = cls + 0.1 * sg
    opt_s.zero_grad(); opt_d.zero_grad()
    loss.backward()
    gn = nn.utils.clip_grad_norm_(dense_p, 1.0)
    opt_s.step(); opt_d.step()
    losses += [loss.detach(), cls.detach(), sg.detach(), gn, where.float().mean(), e.detach().abs().sum()]
report(policy, [model], losses)
