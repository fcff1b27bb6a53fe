"""A small conv net trained with a forward-mode AD smoothness regulariser: for each batch a
random unit tangent v on the input, the network's JVP J(x)v computed with
torch.autograd.forward_ad (dual_level, make_dual on the input, unpack_dual on the logits) in
the same forward that gives the logits, and ||J v||^2 added to the cross-entropy; backward
goes through the forward-mode computation (double backward of the tangent path: conv, BN in
train mode, ReLU, Tanh, max-pool, Linear (eight conv-BN-ReLU blocks at 16x16, then a pooled head), all with forward-AD formulas). SGD with momentum and
weight decay, 4 steps. JVP=func: logits and tangent by torch.func.jvp(net, (x,), (v,)) instead,
after torch.func.replace_all_batch_norm_modules_ (BN without running stats: functorch refuses
the in-place running-stat updates)."""
from common import setup, report
import os, torch, torch.nn as nn, torch.nn.functional as F
import torch.autograd.forward_ad as fwAD
policy = setup()
B, C, S, K, LAM, W, N = 32, 3, 16, 10, 0.05, 32, 8

def block(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
net = nn.Sequential(
    *block(C, W), *[l for _ in range(N - 1) for l in block(W, W)], nn.MaxPool2d(2),
    nn.Conv2d(W, 2 * W, 3, padding=1), nn.BatchNorm2d(2 * W), nn.Tanh(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(2 * W * (S // 4) ** 2, 128), nn.ReLU(), nn.Linear(128, K))
if os.environ.get("JVP") == "func":   # functorch refuses BN's in-place running-stat updates
    torch.func.replace_all_batch_norm_modules_(net)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
g = torch.Generator().manual_seed(1); losses = []
for step in range(4):
    x = torch.randn(B, C, S, S, generator=g); y = torch.randint(0, K, (B,), generator=g)
    v = torch.randn(B, C, S, S, generator=g); v = v / v.flatten(1).norm(dim=1).view(B, 1, 1, 1)
    if os.environ.get("JVP") == "func":
        logits, jv = torch.func.jvp(net, (x,), (v,))
    else:
        with fwAD.dual_level():
            out = net(fwAD.make_dual(x, v))
            logits, jv = fwAD.unpack_dual(out)
    loss = F.cross_entropy(logits, y) + LAM * jv.pow(2).sum(1).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.detach())
report(policy, [net], losses)
