# Untuned: a hand-written optimizer and EMA, the way many research codebases carry them. A
# Lion optimizer (torch.optim.Optimizer subclass) whose momentum is made by zeros_like in its
# constructor, with grad mode on; an EMA of the weights made by full_like/copy_ at start and
# updated by lerp_ under no_grad; gradient centralisation done in place on .grad; a small
# ConvNet with BatchNorm trained on random images; the EMA model evaluated every step under
# torch.no_grad with its own BatchNorm statistics copied in. 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), wd=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, wd=wd))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["m"] = torch.zeros_like(p)          # made here, grad mode on
    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None: continue
                m = self.state[p]["m"]
                p.mul_(1 - group["lr"] * group["wd"])
                update = (m * b1 + p.grad * (1 - b1)).sign_()
                p.add_(update, alpha=-group["lr"])
                m.lerp_(p.grad, 1 - b2)
def net():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
model, ema = net(), net()
ema_params = [torch.full_like(p, 0.0) for p in model.parameters()]   # grad mode on, as users write it
for e, p in zip(ema_params, model.parameters()): e.data.copy_(p.data)
opt = Lion(model.parameters(), lr=3e-4, wd=0.01)
g = torch.Generator().manual_seed(2)
losses = []
for step in range(3):
    x = torch.randn(48, 3, 32, 32, generator=g); y = torch.randint(0, 10, (48,), generator=g)
    loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    opt.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():                # gradient centralisation
            if p.grad is not None and p.grad.dim() > 1:
                p.grad.sub_(p.grad.mean(dim=tuple(range(1, p.grad.dim())), keepdim=True))
    opt.step()
    with torch.no_grad():
        for e, p in zip(ema_params, model.parameters()): e.lerp_(p, 0.1)
        for pe, e in zip(ema.parameters(), ema_params): pe.copy_(e)
        for be, bm in zip(ema.buffers(), model.buffers()): be.copy_(bm)
        ema.eval()
        ema_loss = F.cross_entropy(ema(x), y)
    losses += [loss.detach(), ema_loss, sum(opt.state[p]["m"].abs().sum() for p in model.parameters())]
report(policy, [model, ema], losses)
