# Untuned: continual learning with elastic weight consolidation (EWC). A small conv net with
# one linear head per task (the head picked per sample by indexing a stacked output) trains on
# task A for 2 steps; then the diagonal Fisher from per-sample gradients by
# torch.func.vmap(grad(...)) over functional_call, 8 samples at a time, with labels sampled from
# the model's own predictions by multinomial, checked on a few samples against a Python loop of
# autograd.grad; a snapshot of the parameters by clone().detach(); then task B for 3 steps with
# the loss plus the penalty sum(F * (p - p_star)**2), a small replay buffer of task A examples
# joined into each batch by torch.cat. SGD with momentum and nesterov.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.func import functional_call, vmap, grad
from common import setup, report
policy = setup()
B, S, C, NFISH, NREPLAY, LAM = 32, 32, 5, 32, 16, 1000.0
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        conv = lambda i, o: [nn.Conv2d(i, o, 3, padding=1), nn.ReLU()]
        s.body = nn.Sequential(*conv(3, 16), *conv(16, 16), *conv(16, 16), *conv(16, 16), nn.MaxPool2d(2),
                               *conv(16, 32), *conv(32, 32), *conv(32, 32), nn.MaxPool2d(2), *conv(32, 48), *conv(48, 48),
                               nn.AdaptiveAvgPool2d(2), nn.Flatten())
        s.heads = nn.ModuleList(nn.Linear(48 * 4, C) for _ in range(2))
    def forward(s, x, task):
        f = s.body(x)
        out = torch.stack([h(f) for h in s.heads], dim=1)                 # (N, tasks, C)
        return out[torch.arange(x.shape[0]), task]
gen = torch.Generator().manual_seed(21)
protoA, protoB = torch.randn(C, 3, S, S, generator=gen), torch.randn(C, 3, S, S, generator=gen)
def batch(proto, n):
    y = torch.randint(0, C, (n,), generator=gen)
    return proto[y] * 0.5 + torch.randn(n, 3, S, S, generator=gen), y
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
losses = []
replay_x, replay_y = [], []
for step in range(2):                                                     # task A
    x, y = batch(protoA, B)
    loss = F.cross_entropy(net(x, torch.zeros(B, dtype=torch.long)), y)
    opt.zero_grad(); loss.backward(); opt.step()
    keep = torch.randperm(B, generator=gen)[:NREPLAY // 2]
    replay_x.append(x[keep]); replay_y.append(y[keep])
    losses.append(loss.detach())
replay_x, replay_y = torch.cat(replay_x), torch.cat(replay_y)
# Fisher: per-sample gradients of log p(y_hat | x) with y_hat drawn from the model.
params = {k: v.detach() for k, v in net.named_parameters()}
xf, _ = batch(protoA, NFISH)
with torch.no_grad():
    yhat = torch.multinomial(F.softmax(net(xf, torch.zeros(NFISH, dtype=torch.long)), -1), 1, generator=gen)[:, 0]
def nll(p, x, y):
    out = functional_call(net, p, (x[None], torch.zeros(1, dtype=torch.long)))
    return F.cross_entropy(out, y[None])
psg = vmap(grad(nll), in_dims=(None, 0, 0))
fisher = {k: torch.zeros_like(v) for k, v in params.items()}
for i in range(0, NFISH, 8):                                              # 8 samples at a time
    g = psg(params, xf[i:i + 8], yhat[i:i + 8])
    for k in fisher: fisher[k] += g[k].pow(2).sum(0) / NFISH
    if i == 0: g0 = g
check = 0.0
for i in range(3):                                                        # the same, one sample at a time
    out = net(xf[i:i + 1], torch.zeros(1, dtype=torch.long))
    gi = torch.autograd.grad(F.cross_entropy(out, yhat[i:i + 1]), list(net.parameters()))
    check = max(check, max((a - g0[k][i]).abs().max().item() for a, (k, _) in zip(gi, net.named_parameters())))
del g, g0
losses += [torch.tensor(check), sum(f.sum() for f in fisher.values())]
p_star = {k: v.clone().detach() for k, v in net.named_parameters()}
for step in range(3):                                                     # task B with EWC and replay
    xb, yb = batch(protoB, B)
    x = torch.cat([xb, replay_x]); y = torch.cat([yb, replay_y])
    task = torch.cat([torch.ones(B, dtype=torch.long), torch.zeros(len(replay_x), dtype=torch.long)])
    ce = F.cross_entropy(net(x, task), y)
    ewc = sum((fisher[k] * (p - p_star[k]) ** 2).sum() for k, p in net.named_parameters())
    loss = ce + LAM / 2 * ewc
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [ce.detach(), ewc.detach()]
with torch.no_grad():
    xa, ya = batch(protoA, B)
    losses.append((net(xa, torch.zeros(B, dtype=torch.long)).argmax(-1) == ya).float().mean())
report(policy, [net], losses)
