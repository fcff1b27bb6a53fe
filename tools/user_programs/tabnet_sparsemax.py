# Untuned: TabNet (Arik & Pfister) on synthetic tabular data. A few categorical columns through
# nn.Embedding joined by cat with the numeric ones; ghost batch norm (the batch cut by chunk into
# virtual batches, each through the same BatchNorm1d, cat back); sparsemax written by hand (sort
# descending, cumsum, the support size by a comparison and sum, the threshold by gather,
# clamp(min=0)); an attentive transformer whose prior scales are multiplied across 4 decision
# steps (prior = prior * (gamma - mask); INPLACE=1: into a clone by mul_); shared and
# step-specific GLU blocks with sqrt(0.5) residual scaling; an entropy sparsity loss beside the
# cross-entropy; Adam with a StepLR, 4 steps.
import math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, NUM, CATS, CARD, EMB, ND, NA, STEPS, VBS, CLASSES = 4096, 32, 4, 12, 3, 32, 32, 4, 512, 5
GAMMA, LSPARSE = 1.3, 1e-3
INPLACE = os.environ.get("INPLACE") == "1"
FEAT = NUM + CATS * EMB
class GBN(nn.Module):
    def __init__(s, d):
        super().__init__(); s.bn = nn.BatchNorm1d(d, momentum=0.02)
    def forward(s, x):
        return torch.cat([s.bn(c) for c in x.chunk(max(1, x.shape[0] // VBS), 0)], 0)
class GLU(nn.Module):
    def __init__(s, din, dout, fc=None):
        super().__init__(); s.fc = fc if fc is not None else nn.Linear(din, 2 * dout, bias=False); s.bn = GBN(2 * dout)
    def forward(s, x):
        return F.glu(s.bn(s.fc(x)), dim=-1)
class FeatTransformer(nn.Module):
    def __init__(s, shared):
        super().__init__()
        s.shared = nn.ModuleList(GLU(FEAT if i == 0 else ND + NA, ND + NA, fc) for i, fc in enumerate(shared))
        s.spec = nn.ModuleList(GLU(ND + NA, ND + NA) for _ in range(2))
    def forward(s, x):
        x = s.shared[0](x)
        for blk in list(s.shared[1:]) + list(s.spec):
            x = (x + blk(x)) * math.sqrt(0.5)
        return x
def sparsemax(z):
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cs = zs.cumsum(-1) - 1
    support = k * zs > cs
    ksz = support.sum(-1, keepdim=True)
    tau = cs.gather(-1, ksz - 1) / ksz.to(z.dtype)
    return (z - tau).clamp(min=0)
class Attentive(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(NA, FEAT, bias=False); s.bn = GBN(FEAT)
    def forward(s, a, prior):
        return sparsemax(s.bn(s.fc(a)) * prior)
class TabNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.embs = nn.ModuleList(nn.Embedding(CARD, EMB) for _ in range(CATS))
        s.bn0 = nn.BatchNorm1d(FEAT, momentum=0.01)
        shared = [nn.Linear(FEAT, 2 * (ND + NA), bias=False), nn.Linear(ND + NA, 2 * (ND + NA), bias=False)]
        s.initial = FeatTransformer(shared)
        s.steps = nn.ModuleList(FeatTransformer(shared) for _ in range(STEPS))
        s.att = nn.ModuleList(Attentive() for _ in range(STEPS))
        s.head = nn.Linear(ND, CLASSES)
    def forward(s, xnum, xcat):
        x = torch.cat([xnum] + [e(xcat[:, i]) for i, e in enumerate(s.embs)], 1)
        x = s.bn0(x)
        a = s.initial(x)[:, ND:]
        prior = torch.ones_like(x)
        agg, ent = 0, 0
        for ft, att in zip(s.steps, s.att):
            m = att(a, prior)
            ent = ent + (-m * torch.log(m + 1e-10)).sum(-1).mean() / STEPS
            if INPLACE:
                prior = prior.clone(); prior.mul_(GAMMA - m)
            else:
                prior = prior * (GAMMA - m)
            out = ft(m * x)
            agg = agg + F.relu(out[:, :ND])
            a = out[:, ND:]
        return s.head(agg), ent
model = TabNet()
opt = torch.optim.Adam(model.parameters(), lr=2e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
g = torch.Generator().manual_seed(7)
wtrue = torch.randn(NUM, CLASSES, generator=g)
losses = []
for step in range(4):
    xnum = torch.randn(B, NUM, generator=g)
    xcat = torch.randint(0, CARD, (B, CATS), generator=g)
    y = ((xnum[:, :8] @ wtrue[:8]) + (xcat[:, :1] == torch.arange(CLASSES)).float() * 2).argmax(1)
    logits, ent = model(xnum, xcat)
    loss = F.cross_entropy(logits, y) + LSPARSE * ent
    opt.zero_grad()
    loss.backward()
    opt.step(); sched.step()
    losses += [loss.detach(), ent.detach(), logits.detach().std()]
report(policy, [model], losses)
