# Untuned: a small language model with tied input/output embeddings whose embedding uses max_norm
# (each forward renormalises, in place and under no_grad, the weight rows it looks up), with
# padding_idx=0 for right-padded variable-length sequences and scale_grad_by_freq=True. The inputs
# and the shifted targets are both looked up before the tied output layer (logits = h @ W.T, so the
# renormalised weight is read after the in-place renorm); a second table by F.embedding with
# max_norm and norm_type=1 for positions; a cosine loss between the predicted hidden state and the
# target embedding, the cross-entropy over non-pad tokens (ignore_index=0), and the fraction of
# rows at the max norm logged. A GRU layer and two MLP blocks in between. Adam, five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, V = 48, 48, 128, 1500
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D, padding_idx=0, max_norm=1.0, scale_grad_by_freq=True)
        s.pos = nn.Parameter(torch.randn(T, D) * 2.0)
        s.gru = nn.GRU(D, D, batch_first=True)
        s.mlp = nn.ModuleList([nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.GELU(), nn.Linear(3 * D, D)) for _ in range(2)])
        s.out_norm = nn.LayerNorm(D)
        s.bias = nn.Parameter(torch.zeros(V))
    def forward(s, x, tgt):
        e = s.emb(x)                                               # renorm x's rows in place
        te = s.emb(tgt).detach()                                   # renorm tgt's rows, before W is read
        pos = F.embedding(torch.arange(x.shape[1]).expand_as(x), s.pos, max_norm=4.0, norm_type=1.0)
        h, _ = s.gru(e + 0.1 * pos)
        for m in s.mlp: h = h + m(h)
        h = s.out_norm(h)
        logits = h @ s.emb.weight.t() + s.bias                     # tied output layer
        return logits, h, te
model = LM()
with torch.no_grad(): model.emb.weight.mul_(3.0); model.emb.weight[0].zero_()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    lens = torch.randint(T // 3, T + 1, (B,), generator=g)
    seq = torch.randint(1, V, (B, T + 1), generator=g)
    seq[:, 1:] = torch.where(torch.rand(B, T, generator=g) < 0.3, seq[:, :-1], seq[:, 1:])  # repeats for freq scaling
    pad = torch.arange(T + 1)[None, :] >= lens[:, None] + 1
    seq = seq.masked_fill(pad, 0)
    x, tgt = seq[:, :-1], seq[:, 1:]
    logits, h, te = model(x, tgt)
    ce = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), ignore_index=0)
    nonpad = (tgt != 0)
    cos = (1 - F.cosine_similarity(h[nonpad], te[nonpad], dim=-1)).mean()
    loss = ce + 0.1 * cos
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        at_max = (model.emb.weight.norm(dim=1) > 0.999).float().mean()
    losses += [loss.detach(), ce.detach(), at_max]
report(policy, [model], losses)
