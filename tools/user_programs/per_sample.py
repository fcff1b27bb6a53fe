# Untuned: DP-SGD style per-sample gradients with torch.func (functional_call + vmap(grad(loss)))
# on a small conv net: per-sample clipping, seeded Gaussian noise, averaged result written into
# p.grad, SGD step. Plus an ordinary loss.backward() step on a small MLP each iteration. 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.func import functional_call, vmap, grad
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, C, B2, F2 = 8, 10, 2048, 3 * 16 * 16
net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                    nn.MaxPool2d(2), nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.Tanh(),
                    nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, C))
mlp = nn.Sequential(nn.Linear(F2, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 512), nn.GELU(), nn.LayerNorm(512),
                    nn.Linear(512, 512), nn.GELU(), nn.Dropout(0.1), nn.Linear(512, C))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
opt2 = torch.optim.Adam(mlp.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
ng = torch.Generator().manual_seed(2)
MAXN, SIGMA = 1.0, 0.5
def loss_fn(params, buffers, x, y):
    out = functional_call(net, (params, buffers), (x.unsqueeze(0),))
    return F.cross_entropy(out, y.unsqueeze(0))
psg = vmap(grad(loss_fn), in_dims=(None, None, 0, 0))
losses = []
for step in range(3):
    X = torch.randn(B, 3, 32, 32, generator=g); Y = torch.randint(0, C, (B,), generator=g)
    X2 = torch.randn(B2, F2, generator=g); Y2 = torch.randint(0, C, (B2,), generator=g)
    params = {k: v.detach() for k, v in net.named_parameters()}
    buffers = {k: v.detach() for k, v in net.named_buffers()}
    grads = psg(params, buffers, X, Y)
    norms = torch.stack([gr.reshape(B, -1).norm(dim=1) for gr in grads.values()], dim=1).norm(dim=1)
    scale = (MAXN / (norms + 1e-6)).clamp(max=1.0)
    opt.zero_grad()
    for k, p in net.named_parameters():
        gsum = (grads[k] * scale.view(-1, *[1] * (grads[k].dim() - 1))).sum(0)
        noise = torch.randn(p.shape, generator=ng) * SIGMA * MAXN
        p.grad = (gsum + noise) / B
    opt.step()
    with torch.no_grad(): losses.append(F.cross_entropy(net(X), Y))
    opt2.zero_grad()
    l2 = F.cross_entropy(mlp(X2), Y2)
    l2.backward()
    opt2.step()
    losses.append(l2.detach())
report(policy, [net, mlp], losses)
