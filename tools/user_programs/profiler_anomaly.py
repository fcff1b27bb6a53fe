# Untuned: the debugging and profiling tools users leave switched on. The first two steps run
# under torch.autograd.set_detect_anomaly(True) (anomaly mode records forward stacks on every
# node, check_nan on); the next two under torch.profiler.profile(record_shapes=True,
# profile_memory=True, with_stack=True) with record_function labels around forward, backward
# and the optimizer, prof.step() each step and key_averages() read afterwards; a
# torch.jit.trace'd conv stem; a grad_fn prehook and a post hook on the loss's autograd node
# (grad_fn.register_prehook / register_hook); torch.set_grad_enabled(False) for a metric pass
# and torch.autograd.grad_mode.set_grad_enabled(True) around the loss. A CNN with a residual
# MLP head, AdamW. Five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.profiler import profile, record_function, ProfilerActivity
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                     nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = torch.jit.trace(stem, torch.randn(2, 3, 32, 32))
        s.body = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.SiLU(),
                               nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.SiLU())
        s.fc1, s.fc2 = nn.Linear(64, 256), nn.Linear(256, 64); s.head = nn.Linear(64, 10)
    def forward(s, x):
        h = s.body(s.stem(x)).mean((2, 3))
        h = h + s.fc2(F.gelu(s.fc1(h)))
        return s.head(h)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses, seen = [], []
def step_fn(x, y):
    with record_function("forward"):
        with torch.autograd.grad_mode.set_grad_enabled(True):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
    loss.grad_fn.register_prehook(lambda gO: seen.append(float(gO[0])))
    loss.grad_fn.register_hook(lambda gI, gO: seen.append(float(gI[0].abs().sum())))
    with record_function("backward"):
        opt.zero_grad(); loss.backward()
    with record_function("optimizer"):
        opt.step()
    with torch.set_grad_enabled(False):
        acc = (model(x).argmax(-1) == y).float().mean()
    return loss.detach(), acc
for step in range(5):
    x = torch.randn(32, 3, 32, 32, generator=g); y = torch.randint(0, 10, (32,), generator=g)
    if step < 2:
        with torch.autograd.set_detect_anomaly(True, check_nan=True):
            l, a = step_fn(x, y)
    elif step < 4:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True) as prof:
            l, a = step_fn(x, y); prof.step()
        ka = prof.key_averages()
        names = {e.key for e in ka}
        assert "forward" in names and "backward" in names, sorted(names)[:20]
        losses.append(torch.tensor(float(sum(e.count for e in ka if e.key == "aten::convolution"))))
    else:
        l, a = step_fn(x, y)
    losses += [l, a]
losses += [torch.tensor(v) for v in seen]
report(policy, [model], losses)
