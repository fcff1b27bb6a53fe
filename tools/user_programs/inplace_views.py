# Untuned: in-place ops on views and on the metadata of activations, as users sometimes write them:
# h[:, :k].mul_(0.5) and h.transpose(1, 2).add_(1.0) on a non-leaf activation, unsqueeze_/squeeze_
# around a LayerNorm, clamp_ under torch.no_grad() on an activation used afterwards,
# masked_scatter_ and index_add_ into an activation, detach_() on a statistics branch then used as
# a constant, requires_grad_() on a detached activation (a second leaf, whose .grad is logged),
# torch.where written back with copy_ into a slice of another activation, t_() on a 2D activation
# (in-batch similarity). Adam, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()

class Net(nn.Module):
    def __init__(self, D=256, T=64, n_cls=10):
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.mix = nn.Linear(T, T)
        self.l2 = nn.Linear(D, D)
        self.l3 = nn.Linear(D, D)
        self.l4 = nn.Linear(D, D)
        self.gate = nn.Linear(D, D)
        self.side = nn.Linear(D, D)
        self.proj = nn.Linear(D, D)
        self.head = nn.Linear(D, n_cls)
    def forward(self, x, mask, idx):
        B, T, D = x.shape
        h = F.gelu(self.inp(x))
        h[:, : T // 4].mul_(0.5)                 # damp the first quarter of the sequence
        h.transpose(1, 2).add_(1.0)              # shift, written through a transposed view
        h.unsqueeze_(1)                          # (B, 1, T, D)
        h = self.norm(h)
        h.squeeze_(1)                            # back to (B, T, D)
        t = self.mix(h.transpose(1, 2)).transpose(1, 2)   # mix over time
        z = self.l2(t)
        with torch.no_grad():
            z.clamp_(-2.0, 2.0)                  # clip pre-activations, "not part of the graph"
        z = z * torch.sigmoid(z)
        y = self.l4(z)
        y.masked_scatter_(mask, self.l3(h))      # overwrite masked positions
        y.index_add_(1, idx, self.gate(h[:, : idx.numel()]), alpha=0.5)
        stats = h.mean(1, keepdim=True)
        stats.detach_()                          # centre with constant statistics
        y = y - stats
        leaf = h.detach()
        leaf.requires_grad_()                    # a second "leaf" input mid-forward
        o = self.side(leaf)
        w = torch.where(y > 0, y, 0.1 * t)
        o[:, : T // 2].copy_(w[:, : T // 2])
        pooled = o.mean(1)
        p = self.proj(pooled)
        p.t_()                                   # (D, B)
        sim = F.normalize(pooled, dim=1) @ F.normalize(p, dim=0)
        return self.head(pooled), sim, leaf

model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
B, T, D = 32, 64, 256
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, T, D, generator=g)
    lab = torch.randint(0, 10, (B,), generator=g)
    mask = torch.rand(B, T, 1, generator=g) < 0.2
    idx = torch.randint(0, T, (16,), generator=g)
    logits, sim, leaf = model(x, mask, idx)
    loss = F.cross_entropy(logits, lab) + F.cross_entropy(sim / 0.1, torch.arange(B))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    losses.append(leaf.grad.square().sum())
report(policy, [model], losses)
