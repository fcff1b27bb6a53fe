# Untuned: the monitoring a user bolts onto a ResNet while debugging a training run. Forward hooks
# on every block and ReLU log per-layer activation statistics each step: .mean().item(), .std(),
# .abs().max(), a 32-bin torch.histc histogram, and the fraction of exact zeros after each ReLU
# (dead units); a forward pre-hook checks the block input with torch.isfinite(...).all(). Tensor
# hooks registered on every parameter log p.grad-style norms during backward (grad.norm().item())
# and post-accumulate-grad hooks log p.grad.norm().item(). Before the optimizer step a NaN/Inf
# check over all gradients skips the step (a manual loss scale overflows at step 3); a data-dependent early exit stops training when
# the running loss drops under a threshold or the dead-ReLU fraction climbs too high. 6 steps
# at most, SGD with Nesterov momentum and a cosine schedule.
import math, torch, torch.nn as nn, torch.nn.functional as F
from collections import defaultdict
from common import setup, report
policy = setup()

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())
    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        return self.relu2(self.bn2(self.conv2(out)) + self.short(x))

class ResNet(nn.Module):
    def __init__(self, widths=(32, 64, 128), blocks=2, n=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, c = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks):
                layers.append(BasicBlock(c, w, 2 if (j == 0 and i > 0) else 1)); c = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c, n)
    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))

model = ResNet()
log = defaultdict(list)
def act_stats(name):
    def hook(mod, inp, out):
        with torch.no_grad():
            o = out.detach()
            log[name + ".mean"].append(o.mean().item())
            log[name + ".std"].append(o.std().item())
            log[name + ".absmax"].append(o.abs().max().item())
            hist = torch.histc(o.float(), bins=32, min=-4.0, max=4.0)
            log[name + ".hist"].append((hist / hist.sum()).tolist())
            if isinstance(mod, nn.ReLU):
                log[name + ".zeros"].append((o == 0).float().mean().item())
    return hook
def check_input(name):
    def pre(mod, inp):
        if not torch.isfinite(inp[0]).all():
            print("non-finite input to", name)
    return pre
for name, m in model.named_modules():
    if isinstance(m, (BasicBlock, nn.ReLU)):
        m.register_forward_hook(act_stats(name))
    if isinstance(m, BasicBlock):
        m.register_forward_pre_hook(check_input(name))
for name, p in model.named_parameters():
    p.register_hook(lambda grad, name=name: log[name + ".gradnorm_bw"].append(grad.norm().item()))
    p.register_post_accumulate_grad_hook(lambda p, name=name: log[name + ".gradnorm"].append(p.grad.norm().item()))

opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
g = torch.Generator().manual_seed(1)
losses, skipped, running = [], 0, None
for step in range(6):
    x = torch.randn(64, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    scale = 2.0 ** 127 if step == 3 else 1.0  # a manual loss scale that overflows at step 3
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    (loss * scale).backward()
    if scale != 1.0:
        for p in model.parameters():
            p.grad.div_(scale)
    finite = torch.isfinite(loss * scale) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    if not finite:
        skipped += 1
        losses.append(torch.tensor(-1.0))
        continue
    total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
    opt.step()
    sched.step()
    losses += [loss.detach(), total_norm]
    running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
    dead = sum(v[-1] for k, v in log.items() if k.endswith(".zeros")) / sum(1 for k in log if k.endswith(".zeros"))
    losses.append(torch.tensor(dead))
    if running < 0.5 or dead > 0.9:  # data-dependent early exit
        print("early exit at step", step)
        break
stats = torch.tensor([v[-1] for k, v in sorted(log.items()) if not k.endswith(".hist") and v])
losses += [stats.sum(), torch.tensor(float(skipped)), torch.tensor(float(len(log["layers.0.relu1.zeros"])))]
report(policy, [model], losses)
