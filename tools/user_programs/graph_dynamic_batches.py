# Untuned: a message-passing GNN trained on a fresh batch of random graphs every step, so every
# shape changes every step (node and edge counts). Graphs are concatenated with node offsets;
# torch.repeat_interleave builds the node->graph segment ids; edges are deduplicated by
# torch.unique(dim=0) and the node degrees by torch.unique(return_inverse=True,
# return_counts=True); messages gather sources by index_select, aggregate by index_add_ (sum, in
# place into a zeros buffer) and by scatter_reduce(reduce="amax", include_self=False) (max), and
# readout is a per-graph mean by index_add_ plus a per-graph max by scatter_reduce. Graph
# classification with cross entropy, Adam. Five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
D, NG = 128, 24
class Layer(nn.Module):
    def __init__(s):
        super().__init__()
        s.msg = nn.Sequential(nn.Linear(2 * D, D), nn.ReLU(), nn.Linear(D, D))
        s.upd = nn.Sequential(nn.Linear(3 * D, D), nn.ReLU(), nn.Linear(D, D)); s.norm = nn.LayerNorm(D)
    def forward(s, h, src, dst, deg):
        N = h.shape[0]
        m = s.msg(torch.cat([h.index_select(0, src), h.index_select(0, dst)], 1))
        agg_sum = torch.zeros(N, D).index_add_(0, dst, m) / deg.clamp(min=1).unsqueeze(1)
        agg_max = torch.zeros(N, D).scatter_reduce(0, dst.unsqueeze(1).expand(-1, D), m, reduce="amax", include_self=False)
        return s.norm(h + s.upd(torch.cat([h, agg_sum, agg_max], 1)))
class GNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(16, D); s.layers = nn.ModuleList(Layer() for _ in range(4))
        s.head = nn.Sequential(nn.Linear(2 * D, D), nn.ReLU(), nn.Linear(D, 5))
    def forward(s, x, src, dst, batch, sizes):
        _, inv, counts = torch.unique(dst, return_inverse=True, return_counts=True)
        deg = torch.zeros(x.shape[0], dtype=torch.long).index_put_((dst,), torch.ones_like(dst), accumulate=True)
        assert int(counts.sum()) == dst.numel() and inv.numel() == dst.numel()
        h = F.relu(s.inp(x))
        for l in s.layers: h = l(h, src, dst, deg)
        mean = torch.zeros(NG, D).index_add_(0, batch, h) / sizes.unsqueeze(1)
        mx = torch.zeros(NG, D).scatter_reduce(0, batch.unsqueeze(1).expand(-1, D), h, reduce="amax", include_self=False)
        return s.head(torch.cat([mean, mx], 1))
model = GNN()
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    sizes = torch.randint(40, 160, (NG,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]])
    batch = torch.repeat_interleave(torch.arange(NG), sizes)
    N = int(sizes.sum())
    E = N * 6
    eg = torch.randint(0, NG, (E,), generator=g)                    # graph of each edge
    u = (torch.rand(E, generator=g) * sizes[eg]).long() + offsets[eg]
    v = (torch.rand(E, generator=g) * sizes[eg]).long() + offsets[eg]
    edges = torch.unique(torch.stack([torch.cat([u, v]), torch.cat([v, u])], 1), dim=0)
    edges = edges[edges[:, 0] != edges[:, 1]]                        # no self loops
    src, dst = edges[:, 0].contiguous(), edges[:, 1].contiguous()
    x = torch.randn(N, 16, generator=g)
    y = (sizes // 25 - 1).clamp(0, 4)                                 # label: size class
    logits = model(x, src, dst, batch, sizes.float())
    loss = F.cross_entropy(logits, y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [loss.detach(), torch.tensor(float(N)), torch.tensor(float(src.numel()))]
report(policy, [model], losses)
