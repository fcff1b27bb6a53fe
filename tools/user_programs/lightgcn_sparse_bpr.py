# Untuned: a LightGCN-style recommender. User and item tables propagated (Adam), per-item
# biases in nn.Embedding(sparse=True) read only by lookup (SparseAdam), a dense MLP
# re-ranker (AdamW); three rounds of propagation over a
# normalised bipartite adjacency by torch.sparse.mm, layer outputs joined by torch.cat,
# an in-place LeakyReLU and dropout in the re-ranker, a BPR loss over sampled negatives plus
# an L2 term on the rows a batch touched. Not in the zoo (twenty-fifth session).
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
NU, NI, D, L, B = 600, 900, 64, 3, 512
g = torch.Generator().manual_seed(1)
# A random bipartite graph: each user rates 12 items.
u = torch.arange(NU).repeat_interleave(12)
i = torch.randint(0, NI, (NU * 12,), generator=g)
rows = torch.cat([u, i + NU]); cols = torch.cat([i + NU, u])
deg = torch.zeros(NU + NI).index_add_(0, rows, torch.ones(rows.numel()))
val = (deg[rows] * deg[cols]).rsqrt()
adj = torch.sparse_coo_tensor(torch.stack([rows, cols]), val, (NU + NI, NU + NI)).coalesce()
class Rec(nn.Module):
    def __init__(s):
        super().__init__()
        s.users = nn.Embedding(NU, D); s.items = nn.Embedding(NI, D)
        s.item_bias = nn.Embedding(NI, 1, sparse=True); nn.init.zeros_(s.item_bias.weight)
        nn.init.normal_(s.users.weight, std=0.1); nn.init.normal_(s.items.weight, std=0.1)
        s.rerank = nn.Sequential(nn.Linear(2 * D * (L + 1), 256), nn.LeakyReLU(0.1, inplace=True),
                                 nn.Dropout(0.2), nn.Linear(256, 1))
    def propagate(s):
        h = torch.cat([s.users.weight, s.items.weight])
        layers = [h]
        for _ in range(L):
            h = torch.sparse.mm(adj, h)
            layers.append(h)
        return torch.cat(layers, dim=1)          # (NU + NI) x D(L+1)
    def score(s, z, users, items):
        zu, zi = z[users], z[items + NU]
        return (zu * zi).sum(-1) + s.item_bias(items).squeeze(-1) + s.rerank(torch.cat([zu, zi], dim=-1)).squeeze(-1)
model = Rec()
opt_sparse = torch.optim.SparseAdam(model.item_bias.parameters(), lr=1e-2)
opt_dense = torch.optim.AdamW([{"params": list(model.users.parameters()) + list(model.items.parameters()), "lr": 1e-2},
                               {"params": model.rerank.parameters()}], lr=1e-3)
losses = []
for step in range(4):
    users = torch.randint(0, NU, (B,), generator=g)
    pos = i[users * 12 + torch.randint(0, 12, (B,), generator=g)]
    neg = torch.randint(0, NI, (B,), generator=g)
    opt_sparse.zero_grad(set_to_none=True); opt_dense.zero_grad(set_to_none=True)
    z = model.propagate()
    margin = model.score(z, users, pos) - model.score(z, users, neg)
    reg = (model.users(users).pow(2).sum() + model.items(pos).pow(2).sum() + model.items(neg).pow(2).sum()) / B
    loss = -F.logsigmoid(margin).mean() + 1e-4 * reg
    loss.backward()
    opt_sparse.step(); opt_dense.step()
    losses.append(loss.detach())
report(policy, [model], losses)
