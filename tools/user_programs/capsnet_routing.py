# Untuned: a CapsNet (Sabour et al.) on random 28x28 "digits" with labels. A stem of two 3x3 convs
# with BatchNorm, Conv1 (9x9, ReLU), primary
# capsules by a 9x9 stride-2 conv reshaped (view/permute/reshape) into 8-d vectors and squashed
# (squash(s) = |s|^2 / (1 + |s|^2) * s / |s|); prediction vectors u_hat = W @ u for every (primary,
# digit) pair, with a large per-pair weight (1, N, 10, 16, 8), by torch.einsum over the batch;
# three iterations of dynamic routing by agreement: c = softmax(b) over digit capsules,
# s = (c * u_hat).sum over primaries, v = squash(s), b = b + (u_hat * v).sum(-1) -- the first
# iterations on u_hat.detach() as in the paper, only the last one differentiable. Margin loss on
# the lengths |v| (relu(0.9 - |v|)^2 and 0.5 * relu(|v| - 0.1)^2 with one_hot targets) plus 0.0005 x
# a reconstruction MSE from a decoder MLP fed with the digit capsules masked by the true class.
# Adam, 3 steps; the accuracy by argmax of the lengths is logged.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, NTYPE, PD, DD, NCLS, ITERS = 24, 8, 8, 16, 10, 3
def squash(s, dim=-1, eps=1e-8):
    n2 = (s ** 2).sum(dim, keepdim=True)
    return n2 / (1 + n2) * s / torch.sqrt(n2 + eps)
class CapsNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                               nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        s.conv1 = nn.Conv2d(32, 32, 9)
        s.primary = nn.Conv2d(32, NTYPE * PD, 9, stride=2)
        s.N = NTYPE * 6 * 6
        s.W = nn.Parameter(0.01 * torch.randn(1, s.N, NCLS, DD, PD))
        s.decoder = nn.Sequential(nn.Linear(NCLS * DD, 256), nn.ReLU(),
                                  nn.Linear(256, 28 * 28), nn.Sigmoid())
    def forward(s, x, y):
        h = F.relu(s.conv1(s.stem(x)))
        p = s.primary(h)                                                    # (B, NTYPE*PD, 6, 6)
        b_, _, hh, ww = p.shape
        u = p.view(b_, NTYPE, PD, hh, ww).permute(0, 1, 3, 4, 2).reshape(b_, -1, PD)
        u = squash(u)
        u_hat = torch.einsum("nkdp,bnp->bnkd", s.W[0], u)                   # (B, N, 10, 16)
        logits = torch.zeros(b_, s.N, NCLS)
        u_det = u_hat.detach()
        for it in range(ITERS):
            c = F.softmax(logits, dim=2)
            if it < ITERS - 1:
                v = squash((c.unsqueeze(-1) * u_det).sum(1))                  # (B, 10, 16)
                logits = logits + (u_det * v.unsqueeze(1)).sum(-1)
            else:
                v = squash((c.unsqueeze(-1) * u_hat).sum(1))
        onehot = F.one_hot(y, NCLS).float()
        rec = s.decoder((v * onehot.unsqueeze(-1)).flatten(1))
        return v, rec
def margin_loss(lengths, onehot):
    l = onehot * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - onehot) * F.relu(lengths - 0.1) ** 2
    return l.sum(1).mean()
model = CapsNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    y = torch.randint(0, NCLS, (B,), generator=g)
    x = torch.rand(B, 1, 28, 28, generator=g) * 0.3
    x[torch.arange(B), 0, 4 + 2 * y, 4:24] = 1.0                             # a class-dependent stroke
    v, rec = model(x, y)
    lengths = v.norm(dim=-1)
    loss = margin_loss(lengths, F.one_hot(y, NCLS).float()) + 0.0005 * F.mse_loss(rec, x.flatten(1), reduction="sum") / B
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), (lengths.argmax(1) == y).float().mean()]
report(policy, [model], losses)
