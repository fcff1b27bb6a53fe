# Untuned: gradient surgery by every kind of autograd hook. A residual MLP whose blocks carry
# nn.Module.register_full_backward_pre_hook (scales grad_output by a per-block factor) and
# register_full_backward_hook (clamps grad_input by its norm: the module's inputs are wrapped in
# BackwardHookFunction nodes). On each step's graph: torch.autograd.graph.register_multi_grad_hook
# over the three branch outputs of the last block (mode="all": records their joint gradient norm,
# which sets the next step's loss scale) and over the two halves of the logits, each in a z-loss
# (mode="any": fires once, on the first gradient); Node.register_prehook on a block output's
# grad_fn (rescales grad_outputs before the node runs) and Node.register_hook on another grad_fn
# (replaces grad_inputs by a clipped-plus-scaled copy); a tensor hook on a mid-network activation
# that applies "gradient centralisation" (subtracts the per-feature mean of the gradient) and one
# that zeroes the gradient of dead ReLU units by a mask read from the forward. All handles removed
# after backward. SGD with momentum, four steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.autograd.graph import register_multi_grad_hook
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, DIN, D, NC = 1024, 96, 256, 16
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n = nn.LayerNorm(D); s.a = nn.Linear(D, 2 * D); s.b = nn.Linear(2 * D, D); s.g = nn.Linear(D, D)
    def forward(s, x):
        h = s.n(x)
        u = F.relu(s.a(h))
        v = s.b(u)
        w = torch.sigmoid(s.g(h))
        s.last = (u, v, w)
        return x + v * w
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Linear(DIN, D)
        s.blocks = nn.ModuleList(Block() for _ in range(4))
        s.head = nn.Linear(D, NC)
    def forward(s, x):
        h = F.gelu(s.stem(x))
        outs = []
        for blk in s.blocks:
            h = blk(h); outs.append(h)
        return s.head(h), outs
net = Net()
factors = [1.0, 0.5, 2.0, 0.75]
def make_pre(f):
    def pre(module, grad_output):
        return tuple(None if g is None else g * f for g in grad_output)
    return pre
def post(module, grad_input, grad_output):
    out = []
    for g in grad_input:
        if g is None: out.append(None); continue
        n = g.norm()
        out.append(g * torch.clamp(5.0 / (n + 1e-6), max=1.0))
    return tuple(out)
for blk, f in zip(net.blocks, factors):
    blk.register_full_backward_pre_hook(make_pre(f))
    blk.register_full_backward_hook(post)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses, scale, seen = [], 1.0, []
for step in range(4):
    x = torch.randn(B, DIN, generator=g); y = torch.randint(0, NC, (B,), generator=g)
    logits, outs = net(x)
    u, v, w = net.blocks[-1].last
    joint = []
    def all_hook(grads):
        joint.append(torch.stack([gg.norm() for gg in grads if gg is not None]).norm())
    h1 = register_multi_grad_hook((u, v, w), all_hook, mode="all")
    l1, l2 = logits[:, : NC // 2], logits[:, NC // 2 :]
    def any_hook(grad):
        seen.append(float(grad.abs().sum() > 0))
    h2 = register_multi_grad_hook((l1, l2), any_hook, mode="any")
    def node_pre(grad_outputs):
        return tuple(None if go is None else go * 0.9 for go in grad_outputs)
    h3 = outs[1].grad_fn.register_prehook(node_pre)
    def node_post(grad_inputs, grad_outputs):
        return tuple(None if gi is None else gi.clamp(-1e-3, 1e-3) + 0.5 * gi for gi in grad_inputs)
    h4 = outs[2].grad_fn.register_hook(node_post)
    mid = outs[0]
    h5 = mid.register_hook(lambda gr: gr - gr.mean(0, keepdim=True))
    dead = (net.blocks[1].last[0] <= 0)
    h6 = net.blocks[1].last[0].register_hook(lambda gr: gr.masked_fill(dead, 0.0) * 1.5)
    zl = 1e-3 * (l1.logsumexp(-1).square().mean() + l2.logsumexp(-1).square().mean())   # z-loss per half
    loss = F.cross_entropy(logits, y) + zl + 1e-3 * torch.stack([o.square().mean() for o in outs]).sum()
    opt.zero_grad()
    (loss * scale).backward()
    scale = float(torch.clamp(0.01 / (joint[0] + 1e-6), 0.5, 2.0))
    for h in (h1, h2, h3, h4, h5, h6): h.remove()
    opt.step()
    losses += [loss.detach(), joint[0].detach(), torch.tensor(scale)]
    del logits, outs, u, v, w, mid, l1, l2, dead
for blk in net.blocks: del blk.last
report(policy, [net], losses + [torch.tensor(sum(seen))])
