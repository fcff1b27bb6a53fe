# Untuned: quantile regression with order statistics inside the forward. Each sample is a set of
# 64 noisy readings; the net embeds every reading, then pools order statistics over the set and
# over hidden features: torch.sort values (gradients through the permutation) and argsort used
# to gather a second projection, kthvalue (the 10th smallest), torch.quantile at (0.1, 0.5,
# 0.9) with linear interpolation, median (values and indices), cummin over the sorted readings,
# logcumsumexp along the set, and a "soft top-k" of 8 by torch.topk values weighted by a softmax
# of themselves. The raw mean reading is binned by torch.bucketize into 16 learned bins
# (an embedding). The head predicts five quantiles, made monotone by a cumsum of softplus
# increments, trained with the pinball loss; OneCycleLR and clip_grad_norm_(foreach=True) over
# AdamW. Four steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, N, D, K, NBIN = 256, 64, 128, 8, 16
QS = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95])
class QNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Sequential(nn.Linear(2, D), nn.GELU(), nn.Linear(D, D), nn.GELU())
        s.val = nn.Linear(D, D)
        s.bins = nn.Embedding(NBIN + 1, D)
        s.register_buffer("edges", torch.linspace(-2, 2, NBIN))
        s.mix = nn.Sequential(nn.Linear(10 * D, 2 * D), nn.GELU(), nn.Linear(2 * D, D), nn.GELU())
        s.head = nn.Linear(D, len(QS))
    def forward(s, r):                                          # r: B x N readings
        t = torch.linspace(0, 1, N).expand_as(r)
        h = s.emb(torch.stack([r, t], -1))                      # B x N x D
        srt, order = torch.sort(h, dim=1)                      # per feature over the set
        vals = s.val(h)
        first = vals.gather(1, torch.argsort(r, dim=1)[:, :, None].expand(-1, -1, D))  # by reading order
        kth = torch.kthvalue(h, 10, dim=1).values
        q = torch.quantile(h, torch.tensor([0.1, 0.5, 0.9]), dim=1, interpolation="linear")   # 3 x B x D
        med, medi = torch.median(vals, dim=1)
        cm = torch.cummin(srt.flip(1), dim=1).values.mean(1)
        lcse = torch.logcumsumexp(h * 0.5, dim=1)[:, -1] - torch.logcumsumexp(h * 0.5, dim=1)[:, N // 2]
        tk = torch.topk(vals, K, dim=1).values                 # B x K x D
        soft_tk = (tk * tk.softmax(1)).sum(1)
        b = torch.bucketize(r.mean(1).detach(), s.edges)        # B bins
        feats = torch.cat([srt[:, 0], srt[:, -1], first[:, :4].mean(1), kth, q[0], q[1], q[2],
                           med + cm, lcse + soft_tk, s.bins(b)], -1)
        z = s.mix(feats)
        raw = s.head(z)
        inc = torch.cumsum(F.softplus(raw[:, 1:]), 1)          # monotone quantiles
        return raw[:, :1] + F.pad(inc, (1, 0))
def pinball(pred, y):
    e = y[:, None] - pred
    return torch.maximum(QS * e, (QS - 1) * e).mean()
net = QNet()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=4, pct_start=0.5)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    loc = torch.randn(B, generator=g); scale = torch.rand(B, generator=g) + 0.2
    r = loc[:, None] + scale[:, None] * torch.randn(B, N, generator=g).pow(3)
    y = loc + scale * torch.randn(B, generator=g)
    pred = net(r)
    loss = pinball(pred, y)
    opt.zero_grad(); loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0, foreach=True)
    opt.step(); sched.step()
    losses += [loss.detach(), gn, pred.detach().diff(dim=1).min()]
report(policy, [net], losses)
