# Untuned: DLRM-style recommender. Several EmbeddingBag(sum) tables (one with sparse grads and
# per_sample_weights), bottom MLP on dense features, pairwise dot interaction (bmm + triu indices),
# top MLP, BCEWithLogits. Two optimizers: SGD for sparse params, Adam for dense ones. 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
D, NDENSE, B = 64, 13, 2048
ROWS = [5000, 2000, 1000, 500, 300, 100]
class DLRM(nn.Module):
    def __init__(s):
        super().__init__()
        s.embs = nn.ModuleList(nn.EmbeddingBag(r, D, mode="sum", sparse=(i == 0)) for i, r in enumerate(ROWS))
        s.bot = nn.Sequential(nn.Linear(NDENSE, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, D), nn.ReLU())
        nf = len(ROWS) + 1
        s.register_buffer("li", torch.triu_indices(nf, nf, offset=1)[0], persistent=False)
        s.register_buffer("lj", torch.triu_indices(nf, nf, offset=1)[1], persistent=False)
        s.top = nn.Sequential(nn.Linear(D + nf * (nf - 1) // 2, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))
    def forward(s, dense, idx, offs, psw):
        x = s.bot(dense)
        es = [e(idx[i], offs[i], per_sample_weights=psw if i == 1 else None) for i, e in enumerate(s.embs)]
        T = torch.stack([x] + es, dim=1)                # B, nf, D
        Z = torch.bmm(T, T.transpose(1, 2))             # B, nf, nf
        zf = Z[:, s.li, s.lj]
        return s.top(torch.cat([x, zf], dim=1)).squeeze(1)
model = DLRM()
sparse_p = [p for n, p in model.named_parameters() if n.startswith("embs.0.")]
dense_p = [p for n, p in model.named_parameters() if not n.startswith("embs.0.")]
opt_s = torch.optim.SGD(sparse_p, lr=0.05)
opt_d = torch.optim.Adam(dense_p, lr=1e-3)
g = torch.Generator().manual_seed(1)
def batch():
    dense = torch.randn(B, NDENSE, generator=g).abs().log1p()
    idx, offs = [], []
    for r in ROWS:
        n = torch.randint(1, 6, (B,), generator=g)
        offs.append(torch.cat([torch.zeros(1, dtype=torch.long), n.cumsum(0)[:-1]]))
        idx.append(torch.randint(0, r, (int(n.sum()),), generator=g))
    psw = torch.rand(idx[1].numel(), generator=g)
    y = (torch.rand(B, generator=g) < 0.3).float()
    return dense, idx, offs, psw, y
data = [batch() for _ in range(3)]
losses = []
for step in range(3):
    dense, idx, offs, psw, y = data[step]
    opt_s.zero_grad(); opt_d.zero_grad()
    logit = model(dense, idx, offs, psw)
    loss = F.binary_cross_entropy_with_logits(logit, y)
    loss.backward()
    opt_s.step(); opt_d.step()
    losses.append(loss.detach())
report(policy, [model], losses)
