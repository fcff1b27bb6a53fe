# Untuned: a semi-supervised image classifier (a supervised head plus a BYOL-style consistency loss)
# built from hand-written modules that keep state in registered buffers and mutate things in place.
# HandBN: BatchNorm written by hand, batch statistics in training, running_mean/running_var updated
# under torch.no_grad() by mul_/add_ and num_batches_tracked by += 1 (eval uses the buffers). A
# target encoder (deepcopy of the online one, requires_grad False) updated inside the wrapper's
# forward by lerp_ of its parameters towards the online ones (tau from a cosine schedule on a step
# counter buffer incremented with += 1) and copy_ of its buffers. In-place activations where autograd
# allows them: relu_ on HandBN outputs, a channel-dropout mask multiplied in by mul_ on a conv output,
# masked_fill_ of dropped features on a Linear output, clamp_ of the logits. Prototypes (SwAV-style)
# renormalised by copy_ into the parameter under no_grad before each forward; the head's rows
# re-projected onto a norm ball by assigning weight.data (a new tensor) after each step; a forward
# pre-hook re-projects the first conv's filters through .data before it runs (MIDSTEP=1: the head is
# also re-projected onto a smaller ball by .data between forward and backward, so its backward reads
# the new values).
# The eval pass every other step uses the running statistics. SGD with Nesterov momentum, 6 steps.
import copy, math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, NCLS, STEPS = 48, 10, 6
class HandBN(nn.Module):
    def __init__(s, c, momentum=0.1, eps=1e-5):
        super().__init__()
        s.weight, s.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))
        s.register_buffer("running_mean", torch.zeros(c)); s.register_buffer("running_var", torch.ones(c))
        s.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        s.m, s.eps = momentum, eps
    def forward(s, x):
        if s.training:
            mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
            with torch.no_grad():
                n = x.numel() / x.shape[1]
                s.running_mean.mul_(1 - s.m).add_(mean, alpha=s.m)
                s.running_var.mul_(1 - s.m).add_(var * n / (n - 1), alpha=s.m)
                s.num_batches_tracked += 1
        else:
            mean, var = s.running_mean, s.running_var
        return (x - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + s.eps) * s.weight[:, None, None] + s.bias[:, None, None]
class Encoder(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1, s.b1 = nn.Conv2d(3, 32, 3, 1, 1, bias=False), HandBN(32)
        s.c2, s.b2 = nn.Conv2d(32, 64, 3, 2, 1, bias=False), HandBN(64)
        s.c3, s.b3 = nn.Conv2d(64, 64, 3, 1, 1, bias=False), HandBN(64)
        s.c4, s.b4 = nn.Conv2d(64, 128, 3, 2, 1, bias=False), HandBN(128)
        s.proj = nn.Linear(128, 128)
    def forward(s, x, drop=None):
        h = s.b1(s.c1(x)).relu_()
        h = s.b2(s.c2(h)).relu_()
        h3 = s.c3(h)
        if drop is not None: h3.mul_(drop)                           # channel dropout, in place
        h = s.b3(h3).relu_() + h
        h = s.b4(s.c4(h)).relu_()
        return s.proj(h.mean((2, 3)))
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.online = Encoder(); s.target = copy.deepcopy(s.online).requires_grad_(False)
        s.pred = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128))
        s.protos = nn.Linear(128, 32, bias=False); s.head = nn.Linear(32, NCLS)
        s.register_buffer("step", torch.zeros((), dtype=torch.long))
    def forward(s, v1, v2, drop):
        if s.training:
            with torch.no_grad():
                s.step += 1
                tau = 1 - 0.01 * (math.cos(math.pi * int(s.step) / STEPS) + 1) / 2
                for pt, po in zip(s.target.parameters(), s.online.parameters()): pt.lerp_(po, 1 - tau)
                for bt, bo in zip(s.target.buffers(), s.online.buffers()): bt.copy_(bo)
        z1 = s.online(v1, drop)
        with torch.no_grad(): t2 = s.target(v2)
        byol = (2 - 2 * F.cosine_similarity(s.pred(z1), t2, dim=-1)).mean()
        f = s.protos(F.normalize(z1, dim=-1))
        f.masked_fill_(drop[:, :32, 0, 0] == 0, 0.0)                 # feature dropout, in place
        logits = s.head(F.relu(f) * 5.0)
        logits.clamp_(-8.0, 8.0)
        return logits, byol
model = Model()
def max_norm_pre(mod, args):
    with torch.no_grad():
        w = mod.weight.data
        mod.weight.data = w * (0.4 / w.flatten(1).norm(dim=1).clamp(min=1e-6)).clamp(max=1.0)[:, None, None, None]
model.online.c1.register_forward_pre_hook(max_norm_pre)
def reproject_head(r=1.0):
    w = model.head.weight.data
    model.head.weight.data = w * (0.4 * r / w.norm(dim=1, keepdim=True)).clamp(max=1.0)
opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(STEPS):
    x = torch.randn(B, 3, 32, 32, generator=g); y = torch.randint(0, NCLS, (B,), generator=g)
    x = x + y.float()[:, None, None, None] * 0.1
    v1 = x + 0.1 * torch.randn(x.shape, generator=g); v2 = torch.flip(x, dims=[3]) + 0.1 * torch.randn(x.shape, generator=g)
    drop = (torch.rand(B, 64, 1, 1, generator=g) > 0.1).float() / 0.9
    with torch.no_grad(): model.protos.weight.copy_(F.normalize(model.protos.weight, dim=1))
    model.train()
    logits, byol = model(v1, v2, drop)
    loss = F.cross_entropy(logits, y) + byol
    if os.environ.get("MIDSTEP") == "1": reproject_head(0.5)
    opt.zero_grad(); loss.backward(); opt.step()
    reproject_head()
    losses += [loss.detach(), byol.detach()]
    if step % 2 == 1:
        model.eval()
        with torch.no_grad():
            el, _ = model(x, x, torch.ones(B, 64, 1, 1))
            losses.append(F.cross_entropy(el, y))
report(policy, [model], losses)
