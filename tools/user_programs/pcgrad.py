# Untuned: multi-task learning with PCGrad. Shared conv trunk, three heads (classification, regression,
# dense segmentation). Per-task shared-trunk gradients via autograd.grad(retain_graph=True), flattened,
# projected on conflict, written into p.grad; heads' grads via one backward(inputs=head_params). Adam.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, H, NC = 16, 32, 10
trunk = nn.Sequential(
    nn.Conv2d(3, 48, 3, padding=1), nn.BatchNorm2d(48), nn.ReLU(),
    nn.Conv2d(48, 48, 3, padding=1), nn.BatchNorm2d(48), nn.ReLU(),
    nn.Conv2d(48, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
    nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
cls_head = nn.Sequential(nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, NC))
reg_head = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64 * 16, 128), nn.Tanh(), nn.Linear(128, 4))
seg_head = nn.Sequential(nn.Conv2d(64, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 3, 1))
heads = [cls_head, reg_head, seg_head]
shared = list(trunk.parameters())
head_params = [p for h in heads for p in h.parameters()]
opt = torch.optim.Adam(shared + head_params, lr=1e-3)
g = torch.Generator().manual_seed(1)
xs = torch.randn(3, B, 3, H, H, generator=g)
yc = torch.randint(0, NC, (3, B), generator=g)
yr = torch.randn(3, B, 4, generator=g)
ys = torch.randint(0, 3, (3, B, H, H), generator=g)
losses = []
for step in range(3):
    opt.zero_grad(set_to_none=True)
    feat = trunk(xs[step])
    task_losses = [F.cross_entropy(cls_head(feat), yc[step]),
                   F.smooth_l1_loss(reg_head(feat), yr[step]),
                   F.cross_entropy(seg_head(feat), ys[step])]
    grads = []
    for l in task_losses:
        gs = torch.autograd.grad(l, shared, retain_graph=True)
        grads.append(torch.cat([x.reshape(-1) for x in gs]))
    pc = [gr.clone() for gr in grads]
    order = torch.randperm(len(grads)).tolist()
    for i in range(len(pc)):
        for j in order:
            if i == j: continue
            dot = torch.dot(pc[i], grads[j])
            if dot < 0:
                pc[i] -= dot / (grads[j].norm() ** 2) * grads[j]
    merged = torch.stack(pc).sum(0)
    off = 0
    for p in shared:
        n = p.numel(); p.grad = merged[off:off + n].view_as(p).clone(); off += n
    total = sum(task_losses)
    total.backward(inputs=head_params)
    opt.step()
    losses += [l.detach() for l in task_losses]
    losses.append(merged.norm())
report(policy, [trunk] + heads, losses)
