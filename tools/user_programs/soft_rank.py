# Untuned: learning-to-rank MLP with a ListMLE (Plackett-Luce) loss: targets binned to grades
# with bucketize/searchsorted, lists sorted by grade (torch.sort), scores gathered by the sort
# indices, reverse logcumsumexp; plus a SoftSort NDCG surrogate using argsort/cumsum and a
# pointwise term on masked_select'ed valid items; SGD, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
NQ, L, NF = 48, 128, 136
model = nn.Sequential(nn.Linear(NF, 512), nn.LayerNorm(512), nn.ReLU(), nn.Dropout(0.1),
                      nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
g = torch.Generator().manual_seed(1)
X = torch.randn(3, NQ, L, NF, generator=g)
w_true = torch.randn(NF, generator=g)
Y = (X @ w_true) / math.sqrt(NF) + 0.3 * torch.randn(3, NQ, L, generator=g)
lens = torch.randint(L // 3, L + 1, (3, NQ), generator=g); lens[:, 0] = L
bounds = torch.tensor([-1.0, -0.3, 0.3, 1.0])
losses = []
for step in range(3):
    opt.zero_grad()
    x, y = X[step], Y[step]
    valid = torch.arange(L)[None, :] < lens[step][:, None]            # (NQ, L)
    grade = torch.bucketize(y, bounds)                                # 0..4
    grade2 = torch.searchsorted(bounds, y.contiguous())               # same binning via searchsorted
    assert torch.equal(grade, grade2)
    s = model(x).squeeze(-1)                                          # (NQ, L)
    # ListMLE: order by grade (ties by position), invalid items last
    key = torch.where(valid, grade.float(), torch.full_like(y, -1.0))
    _, order = torch.sort(key, dim=1, descending=True, stable=True)
    s_sorted = torch.gather(s, 1, order)
    v_sorted = torch.gather(valid, 1, order)
    s_masked = s_sorted.masked_fill(~v_sorted, -1e4)
    rev_lse = torch.logcumsumexp(s_masked.flip(1), 1).flip(1)
    listmle = ((rev_lse - s_masked) * v_sorted).sum(1).div(lens[step]).mean()
    # SoftSort NDCG surrogate
    tau = 0.5
    s_m = s.masked_fill(~valid, -1e4)
    srt = torch.sort(s_m, dim=1, descending=True).values
    Pm = torch.softmax(-(srt[:, :, None] - s_m[:, None, :]).abs() / tau, -1)   # (NQ, L, L)
    gains = (2.0 ** grade.float() - 1) * valid
    exp_gain = Pm @ gains.unsqueeze(-1)                               # (NQ, L, 1)
    disc = 1.0 / torch.log2(torch.arange(L, dtype=torch.float) + 2)
    dcg = (exp_gain.squeeze(-1) * disc).sum(1)
    ideal = torch.sort(gains, 1, descending=True).values
    idcg = (ideal * disc).sum(1).clamp_min(1e-6)
    ndcg_soft = (dcg / idcg).mean()
    # hard NDCG@10 via argsort + cumsum (metric, no grad)
    with torch.no_grad():
        ranks = torch.argsort(s_m, dim=1, descending=True, stable=True)
        hard = torch.gather(gains, 1, ranks)[:, :10] * disc[:10]
        ndcg10 = (hard.cumsum(1)[:, -1] / (ideal[:, :10] * disc[:10]).sum(1).clamp_min(1e-6)).mean()
    point = F.mse_loss(torch.masked_select(s, valid), torch.masked_select(y, valid))
    loss = listmle + (1 - ndcg_soft) + 0.1 * point
    loss.backward()
    opt.step()
    losses += [listmle.detach(), ndcg_soft.detach(), ndcg10, point.detach(), grade.sum()]
losses.append(opt.state[model[0].weight]["momentum_buffer"].abs().sum())
report(policy, [model], losses)
