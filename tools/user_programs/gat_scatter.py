# Untuned: a graph attention network written in plain torch (no torch_geometric): full-batch node
# classification on a random graph. Layer 1 (GAT): per-edge logits from gathered node scores,
# leaky_relu, in-place masked_fill_(-inf) of dropped edges (edge dropout from torch.rand in the
# forward), per-destination softmax via scatter_reduce_("amax", include_self=False) then
# gather/exp/index_add_ of the sums, messages summed with index_add_. Layer 2 (GraphSAGE-like):
# edges dropped by boolean indexing (data-dependent edge count), mean aggregation with
# scatter_reduce_("mean", include_self=True) into the node's own features, and a max aggregation
# with scatter_reduce("amax", include_self=False). Layer 3: torch_scatter-style segment_csr sum
# over edges sorted by destination (argsort, bincount, cumsum of messages, differences at the
# row pointers via index_select). Readout: gather of per-class scores; a node-level
# cross-entropy on a boolean train mask. Adam, 4 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
N, E, FIN, HID, HEADS, C = 6000, 48000, 64, 64, 4, 8
g = torch.Generator().manual_seed(1)
src = torch.randint(0, N, (E,), generator=g); dst = torch.randint(0, N, (E,), generator=g)
loop = torch.arange(N); src = torch.cat([src, loop]); dst = torch.cat([dst, loop]); E = src.numel()
x = torch.randn(N, FIN, generator=g)
labels = torch.randint(0, C, (N,), generator=g)
train_mask = torch.rand(N, generator=g) < 0.5
class GAT(nn.Module):
    def __init__(s, i, o, heads):
        super().__init__(); s.h, s.o = heads, o
        s.lin = nn.Linear(i, heads * o, bias=False)
        s.a_src = nn.Parameter(torch.randn(heads, o) * 0.1); s.a_dst = nn.Parameter(torch.randn(heads, o) * 0.1)
    def forward(s, x, src, dst, p_drop):
        hx = s.lin(x).view(-1, s.h, s.o)
        es = (hx * s.a_src).sum(-1); ed = (hx * s.a_dst).sum(-1)          # (N, H)
        logit = F.leaky_relu(es[src] + ed.index_select(0, dst), 0.2)      # (E, H)
        if s.training:
            drop = torch.rand(logit.shape[0], 1) < p_drop
            drop &= (src != dst).unsqueeze(1)                              # keep self loops
            logit.masked_fill_(drop, float("-inf"))
        mx = torch.full((x.shape[0], s.h), float("-inf")).scatter_reduce_(
            0, dst.unsqueeze(1).expand(-1, s.h), logit, "amax", include_self=False)
        ex = torch.exp(logit - mx.gather(0, dst.unsqueeze(1).expand(-1, s.h)))
        den = torch.zeros(x.shape[0], s.h).index_add_(0, dst, ex)
        alpha = ex / den[dst]
        msg = hx[src] * alpha.unsqueeze(-1)
        out = torch.zeros(x.shape[0], s.h, s.o).index_add_(0, dst, msg)
        return out.flatten(1)
class Sage(nn.Module):
    def __init__(s, i, o):
        super().__init__(); s.self_l = nn.Linear(i, o); s.mean_l = nn.Linear(i, o); s.max_l = nn.Linear(i, o)
    def forward(s, x, src, dst, p_drop):
        if s.training:
            keep = torch.rand(src.shape[0]) >= p_drop
            src, dst = src[keep], dst[keep]
        idx = dst.unsqueeze(1).expand(-1, x.shape[1])
        mean = x.clone().scatter_reduce_(0, idx, x[src], "mean", include_self=True)
        mx = torch.zeros_like(x).scatter_reduce(0, idx, x[src], "amax", include_self=False)
        return s.self_l(x) + s.mean_l(mean) + s.max_l(mx)
class Segment(nn.Module):
    def __init__(s, i, o): super().__init__(); s.lin = nn.Linear(i, o); s.gate = nn.Linear(i, 1)
    def forward(s, x, src, dst):
        order = torch.argsort(dst, stable=True)
        s_src, s_dst = src[order], dst[order]
        counts = torch.bincount(s_dst, minlength=x.shape[0])
        ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        msg = s.lin(x).index_select(0, s_src) * torch.sigmoid(s.gate(x))[s_src]
        cs = torch.cat([torch.zeros(1, msg.shape[1]), msg.cumsum(0)])
        return cs.index_select(0, ptr[1:]) - cs.index_select(0, ptr[:-1])   # segment_csr sum
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.g1 = GAT(FIN, HID, HEADS); s.g2 = Sage(HID * HEADS, HID); s.g3 = Segment(HID, HID)
        s.norm = nn.LayerNorm(HID); s.out = nn.Linear(HID, C)
    def forward(s, x, src, dst):
        h = F.elu(s.g1(F.dropout(x, 0.2, s.training), src, dst, 0.2))
        h = F.relu(s.g2(h, src, dst, 0.3))
        h = s.norm(h + s.g3(h, src, dst))
        return s.out(h)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
losses = []
for step in range(4):
    model.train()
    logits = model(x, src, dst)
    scores = logits.log_softmax(-1).gather(1, labels.unsqueeze(1)).squeeze(1)
    loss = -scores[train_mask].mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), (logits.argmax(-1) == labels)[~train_mask].float().mean()]
model.eval()
with torch.no_grad(): losses.append(model(x, src, dst).square().sum())
report(policy, [model], losses)
