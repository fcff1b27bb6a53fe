# Untuned: training mechanics over 6 steps on a small BatchNorm conv net. OneCycleLR drives the first
# two steps, then SWALR (anneal_epochs=2) takes over; from step 2 on an SWA AveragedModel and an EMA
# AveragedModel (multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True) are updated after every
# optimizer step. At step 2 the first half of the trunk is frozen with requires_grad_(False) (its
# .grad set to None, skipped by SGD) and unfrozen at step 4; at step 3 an auxiliary head on pooled
# features is created and added with optimizer.add_param_group (with its own swa_lr). At the end
# torch.optim.swa_utils.update_bn recomputes the SWA model's BatchNorm statistics over 4 batches and
# the averaged models run an eval forward whose outputs join the report. SGD with nesterov momentum.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, SWALR, update_bn, get_ema_multi_avg_fn
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, Cin, R, C = 24, 3, 32, 10
def block(i, o, s=1): return nn.Sequential(nn.Conv2d(i, o, 3, stride=s, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.trunk = nn.Sequential(block(Cin, 32), block(32, 32), block(32, 32), block(32, 64, 2), block(64, 64), block(64, 64))
        s.pool = nn.AdaptiveAvgPool2d(1); s.fc = nn.Linear(64, C)
    def forward(s, x):
        f = s.pool(s.trunk(x)).flatten(1)
        return s.fc(f), f
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=6)
swa_model = AveragedModel(model)
ema_model = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
swa_sched = None
aux = None
g = torch.Generator().manual_seed(1)
losses = []
for step in range(6):
    x = torch.randn(B, Cin, R, R, generator=g); y = torch.randint(0, C, (B,), generator=g)
    if step == 2:
        for m in model.trunk[:3]: m.requires_grad_(False)
        swa_sched = SWALR(opt, swa_lr=0.02, anneal_epochs=2, anneal_strategy="cos")
    if step == 3:
        aux = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, C))
        opt.add_param_group({"params": aux.parameters(), "lr": 0.02, "swa_lr": 0.01, "initial_lr": 0.02})
    if step == 4:
        for m in model.trunk[:3]: m.requires_grad_(True)
    logits, f = model(x)
    loss = F.cross_entropy(logits, y)
    if aux is not None: loss = loss + 0.5 * F.cross_entropy(aux(f), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step >= 2:
        swa_model.update_parameters(model); ema_model.update_parameters(model)
        swa_sched.step()
    else:
        sched.step()
    losses += [loss.detach()] + [torch.tensor(pg["lr"]) for pg in opt.param_groups]
    losses.append(torch.tensor(float(sum(p.grad is None for p in model.parameters()))))
loader = [torch.randn(B, Cin, R, R, generator=g) for _ in range(4)]
update_bn(loader, swa_model)
swa_model.eval(); ema_model.eval(); model.eval()
xv = torch.randn(B, Cin, R, R, generator=g)
with torch.no_grad():
    for m in (swa_model, ema_model, model):
        out, f = m(xv)
        losses += [out.sum(), out.square().sum(), f.abs().sum()]
report(policy, [model, swa_model, ema_model, aux], losses)
