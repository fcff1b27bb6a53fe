# Untuned: 3-layer GCN, full-batch node classification, sparse COO normalized adjacency (coalesced)
# multiplied with torch.sparse.mm, dropout, ReLU, boolean train mask, Adam with weight decay.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
N, FIN, HID, C, E = 20000, 128, 128, 10, 100000
g = torch.Generator().manual_seed(1)
src = torch.randint(0, N, (E,), generator=g); dst = torch.randint(0, N, (E,), generator=g)
loop = torch.arange(N)
row = torch.cat([src, dst, loop]); col = torch.cat([dst, src, loop])
A = torch.sparse_coo_tensor(torch.stack([row, col]), torch.ones(row.numel()), (N, N)).coalesce()
A = torch.sparse_coo_tensor(A.indices(), torch.ones_like(A.values()), (N, N)).coalesce()
deg = torch.sparse.sum(A, 1).to_dense()
dinv = deg.pow(-0.5)
i = A.indices()
adj = torch.sparse_coo_tensor(i, dinv[i[0]] * A.values() * dinv[i[1]], (N, N)).coalesce()
x = torch.randn(N, FIN, generator=g)
labels = torch.randint(0, C, (N,), generator=g)
train_mask = torch.rand(N, generator=g) < 0.3
class GCNLayer(nn.Module):
    def __init__(s, i, o): super().__init__(); s.lin = nn.Linear(i, o, bias=False); s.bias = nn.Parameter(torch.zeros(o))
    def forward(s, x, adj): return torch.sparse.mm(adj, s.lin(x)) + s.bias
class GCN(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = GCNLayer(FIN, HID); s.l2 = GCNLayer(HID, HID); s.l3 = GCNLayer(HID, C)
    def forward(s, x, adj):
        x = F.dropout(x, 0.5, s.training)
        x = F.relu(s.l1(x, adj)); x = F.dropout(x, 0.5, s.training)
        x = F.relu(s.l2(x, adj)); x = F.dropout(x, 0.5, s.training)
        return s.l3(x, adj)
model = GCN()
opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
losses = []
for step in range(3):
    model.train(); opt.zero_grad()
    out = model(x, adj)
    loss = F.cross_entropy(out[train_mask], labels[train_mask])
    loss.backward(); opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
