# Untuned: a growing neural cellular automaton (Mordvintsev et al.). Perception by fixed
# Sobel and identity filters (a depthwise F.conv2d with groups), a per-cell MLP of 1x1
# convolutions, a stochastic update mask drawn by torch.rand at each of 48 iterations (every
# iterate kept by autograd), alive masking by max_pool2d, an in-place add of the masked update
# into a clone of the state, and a sample pool: batches drawn by randperm from a pool tensor,
# the worst sample reseeded in place, results written back by index_copy_ under no_grad.
# Adam with per-parameter gradient normalisation done by hand, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
CH, HID, S, B, POOL, ITERS = 16, 96, 40, 8, 32, 48
sobel = torch.tensor([[-1., 0., 1.], [-2., 0., 2.], [-1., 0., 1.]]) / 8
ident = torch.zeros(3, 3); ident[1, 1] = 1
kernels = torch.stack([ident, sobel, sobel.T]).repeat(CH, 1, 1)[:, None]   # (3*CH, 1, 3, 3)
class CA(nn.Module):
    def __init__(s):
        super().__init__()
        s.w1 = nn.Conv2d(3 * CH, HID, 1); s.w2 = nn.Conv2d(HID, CH, 1, bias=False)
        with torch.no_grad(): s.w2.weight.mul_(0.1)
    def forward(s, x, gen):
        for _ in range(ITERS):
            pre_alive = F.max_pool2d(x[:, 3:4], 3, stride=1, padding=1) > 0.1
            y = F.conv2d(x, kernels, padding=1, groups=CH)
            dx = s.w2(F.relu(s.w1(y)))
            fire = (torch.rand(x.shape[0], 1, S, S, generator=gen) <= 0.5).float()
            x = x.clone()
            x += dx * fire
            post_alive = F.max_pool2d(x[:, 3:4], 3, stride=1, padding=1) > 0.1
            x = x * (pre_alive & post_alive).float()
        return x
def seed(n):
    x = torch.zeros(n, CH, S, S); x[:, 3:, S // 2, S // 2] = 1.0; return x
yy, xx = torch.meshgrid(torch.linspace(-1, 1, S), torch.linspace(-1, 1, S), indexing="ij")
target = torch.stack([(xx.abs() < 0.5).float(), (yy.abs() < 0.5).float(), ((xx ** 2 + yy ** 2) < 0.4).float()])
target = torch.cat([target, ((xx.abs() < 0.5) | ((xx ** 2 + yy ** 2) < 0.4)).float()[None]])   # RGBA
ca = CA()
opt = torch.optim.Adam(ca.parameters(), lr=2e-3)
gen = torch.Generator().manual_seed(3)
pool = seed(POOL)
losses = []
for step in range(3):
    idx = torch.randperm(POOL, generator=gen)[:B]
    x0 = pool[idx].clone()
    with torch.no_grad():
        per = ((x0[:, :4] - target) ** 2).mean(dim=(1, 2, 3))
        x0[per.argmax()] = seed(1)[0]          # the worst sample starts over
    x = ca(x0, gen)
    per_loss = ((x[:, :4] - target) ** 2).mean(dim=(1, 2, 3))
    loss = per_loss.mean()
    opt.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in ca.parameters():
            p.grad /= p.grad.norm() + 1e-8
        pool.index_copy_(0, idx, x.detach())
    opt.step()
    losses += [loss.detach(), per_loss.detach().max(), pool[:, 3].sum()]
report(policy, [ca], losses)
