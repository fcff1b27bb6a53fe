# Untuned: the ways of calling backward. A conv trunk feeding two heads; per step (6 steps, a variant
# each): 0 non-scalar y.backward(gradient=g) on the per-sample loss vector; 1
# torch.autograd.backward([l1, l2], grad_tensors=[a, b]) with 0-dim weights; 2 loss.backward(inputs=
# [head params], retain_graph=True) then loss.backward(inputs=[trunk params]); 3 torch.autograd.grad(
# loss, params (one unused), allow_unused=True, materialize_grads=True) assigned into .grad by hand;
# 4 a user torch.autograd.graph.saved_tensors_hooks that packs saved tensors as bfloat16 and unpacks
# them to their dtype (lossy, but the same in plain PyTorch); 5 torch.autograd.graph.save_on_cpu(
# pin_memory=False). Both hook contexts wrap the trunk's last stage and the heads (a context manager
# passed into forward). SGD with Nesterov momentum.
import contextlib, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, C = 32, 10
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        def blk(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.ReLU())
        s.trunk = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), blk(32, 32), blk(32, 32), blk(32, 48), nn.MaxPool2d(2),
                                blk(48, 64), blk(64, 64), blk(64, 96))
        s.cls = nn.Linear(96, C)
        s.aux = nn.Sequential(nn.Conv2d(96, 32, 1), nn.ReLU(), nn.Conv2d(32, 1, 1))
        s.unused = nn.Linear(4, 4)
    def forward(s, x, ctx=None):
        f = s.trunk[:-1](x)
        with ctx or contextlib.nullcontext():  # the last stage and the heads under the user's hooks
            f = s.trunk[-1](f)
            return s.cls(f.mean((2, 3))), s.aux(f), f
model = Net()
head = list(model.cls.parameters()) + list(model.aux.parameters())
trunk = list(model.trunk.parameters())
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
def pack(t): return (t.dtype, t.to(torch.bfloat16))
def unpack(p): return p[1].to(p[0])
g = torch.Generator().manual_seed(1)
losses = []
for step in range(6):
    x = torch.randn(B, 3, 40, 40, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    tgt = torch.rand(B, 1, 10, 10, generator=g)
    opt.zero_grad()
    if step == 4:
        logits, dense, f = model(x, torch.autograd.graph.saved_tensors_hooks(pack, unpack))
    elif step == 5:
        logits, dense, f = model(x, torch.autograd.graph.save_on_cpu(pin_memory=False))
    else:
        logits, dense, f = model(x)
    l1 = F.cross_entropy(logits, y)
    l2 = F.mse_loss(torch.sigmoid(dense), tgt)
    if step == 0:
        per = F.cross_entropy(logits, y, reduction="none") + F.mse_loss(torch.sigmoid(dense), tgt, reduction="none").mean((1, 2, 3))
        w = torch.linspace(0.5, 1.5, B) / B
        per.backward(gradient=w)
        loss = (per * w).sum()
    elif step == 1:
        torch.autograd.backward([l1, l2], grad_tensors=[torch.tensor(1.0), torch.tensor(0.5)])
        loss = l1 + 0.5 * l2
    elif step == 2:
        loss = l1 + l2
        loss.backward(inputs=head, retain_graph=True)
        losses.append(sum(p.grad.sum() for p in head))
        losses.append(torch.tensor(float(sum(p.grad is None for p in trunk))))
        loss.backward(inputs=trunk)
    elif step == 3:
        loss = l1 + l2 + 1e-3 * f.square().mean()
        params = list(model.parameters())
        grads = torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)
        for p, gr in zip(params, grads): p.grad = gr
        losses.append(model.unused.weight.grad.abs().sum())
    else:
        loss = l1 + l2
        loss.backward()
    losses += [loss.detach(), l1.detach(), l2.detach(), sum(p.grad.double().norm() for p in model.parameters() if p.grad is not None)]
    opt.step()
report(policy, [model], losses)
