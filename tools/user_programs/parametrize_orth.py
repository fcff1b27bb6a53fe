# Untuned: small CNN classifier using the new parametrize API: weight_norm on convs,
# orthogonal on square Linear layers, spectral_norm on another Linear; some forwards run
# inside parametrize.cached(); Adam, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import orthogonal, weight_norm, spectral_norm
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, C, H = 32, 32, 32
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1 = weight_norm(nn.Conv2d(3, C, 3, padding=1))
        s.c2 = weight_norm(nn.Conv2d(C, C, 3, padding=1))
        s.c3 = weight_norm(nn.Conv2d(C, 2 * C, 3, padding=1, stride=2))
        s.c4 = weight_norm(nn.Conv2d(2 * C, 2 * C, 3, padding=1))
        s.proj = nn.Linear(2 * C * 4 * 4, 256)
        s.o1 = orthogonal(nn.Linear(256, 256))
        s.o2 = orthogonal(nn.Linear(256, 256))
        s.sn = spectral_norm(nn.Linear(256, 128))
        s.head = nn.Linear(128, 10)
    def forward(s, x):
        x = F.gelu(s.c1(x)); x = x + F.gelu(s.c2(x))
        x = F.gelu(s.c3(x)); x = x + F.gelu(s.c4(x))
        x = F.avg_pool2d(x, 4).flatten(1)
        h = torch.tanh(s.proj(x))
        for _ in range(2):  # reuse the orthogonal layers: cached() makes this one weight computation
            h = h + torch.tanh(s.o2(torch.tanh(s.o1(h))))
        return s.head(F.relu(s.sn(h)))
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
xs = torch.randn(3, B, 3, H, H, generator=g); ys = torch.randint(0, 10, (3, B), generator=g)
losses = []
for step in range(3):
    opt.zero_grad()
    if step % 2 == 1:
        with parametrize.cached():
            out = model(xs[step])
            loss = F.cross_entropy(out, ys[step])
    else:
        out = model(xs[step]); loss = F.cross_entropy(out, ys[step])
    loss.backward(); losses.append(loss.detach())
    opt.step()
    # state that must match: spectral-norm power-iteration vectors, materialised weights, grad norm
    losses.append(model.sn.parametrizations.weight[0]._u.sum()); losses.append(model.sn.parametrizations.weight[0]._v.sum())
with torch.no_grad():
    W = model.o1.weight; losses.append((W @ W.T - torch.eye(256)).abs().max())
    losses.append(model.c2.weight.sum()); losses.append(model.sn.weight.sum())
    model.eval(); losses.append(model(xs[0]).sum())
report(policy, [model], losses)
