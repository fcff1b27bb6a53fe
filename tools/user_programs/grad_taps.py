# Untuned: gradients of activations, read back. A conv net (a residual trunk of 5 convs) whose intermediate activations get
# h.retain_grad() (one of them a view: a channel slice of a feature map, another a reshape), and
# after backward the retained .grad is reduced to a per-sample saliency statistic that weights the
# next step's per-sample loss. Tensor register_hook on activations returns modified gradients: a
# gradient-reversal hook (x -lambda) on a domain branch and clamp hooks on the trunk. A non-scalar
# output is backpropagated with y.backward(gradient=g); torch.autograd.grad with inputs= a mix of
# parameters and activations and retain_graph=True, then a second .backward() over the same graph.
# SGD with momentum, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, Cin, H, C = 16, 3, 32, 10
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1 = nn.Conv2d(Cin, 32, 3, padding=1); s.c2 = nn.Conv2d(32, 64, 3, padding=1)
        s.trunk = nn.ModuleList([nn.Conv2d(32, 32, 3, padding=1) for _ in range(5)])
        s.c3 = nn.Conv2d(64, 64, 3, padding=1); s.bn = nn.BatchNorm2d(64)
        s.fc = nn.Linear(64 * 4 * 4, 256); s.head = nn.Linear(256, C); s.dom = nn.Linear(256, 2)
        s.rec = nn.Linear(256, 48)
    def forward(s, x, taps):
        h1 = F.relu(s.c1(x)); h1.retain_grad(); taps["h1"] = h1
        h1s = h1[:, :16]; h1s.retain_grad(); taps["h1s"] = h1s          # a view of h1
        t = h1
        for i, c in enumerate(s.trunk):
            t = t + F.relu(c(t))
            if i == 2: t.register_hook(lambda g: g.clamp(-1e-2, 1e-2))
        h2 = F.relu(s.c2(t)); h2 = F.max_pool2d(h2, 2)
        h2.register_hook(lambda g: g.clamp(-1e-3, 1e-3)); taps["h2"] = h2
        h3 = F.max_pool2d(F.relu(s.bn(s.c3(h2))), 4); h3.retain_grad(); taps["h3"] = h3
        f = h3.reshape(h3.shape[0], -1); f.retain_grad(); taps["f"] = f  # a view (reshape) of h3
        z = torch.tanh(s.fc(f)); z.retain_grad(); taps["z"] = z
        rev = z.view_as(z) * 1.0
        rev.register_hook(lambda g: -0.3 * g)                            # gradient reversal
        return s.head(z), s.dom(rev), s.rec(z), h1s.square().mean()
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
weights = torch.ones(B)
for step in range(3):
    x = torch.randn(B, Cin, H, H, generator=g); y = torch.randint(0, C, (B,), generator=g)
    d = torch.randint(0, 2, (B,), generator=g)
    taps = {}
    logits, dl, rec, act_pen = model(x, taps)
    per = F.cross_entropy(logits, y, reduction="none")
    loss = (per * weights).mean() + 0.1 * F.cross_entropy(dl, d) + 0.01 * act_pen
    opt.zero_grad()
    # grads w.r.t. a mix of parameters and activations, graph kept for a second backward
    gw, gz, gh3 = torch.autograd.grad(loss, [model.fc.weight, taps["z"], taps["h3"]], retain_graph=True)
    losses += [gw.norm(), gz.abs().sum(), gh3.square().sum()]
    loss.backward(retain_graph=True)
    # a non-scalar output backpropagated with an explicit gradient
    gout = torch.linspace(-1, 1, rec.numel()).view_as(rec) / B
    rec.backward(gradient=gout)
    sal = taps["h1"].grad.abs().mean((1, 2, 3))
    sal_v = taps["h1s"].grad.abs().sum((1, 2, 3))
    losses += [sal.sum(), sal_v.sum(), taps["h3"].grad.norm(), taps["f"].grad.abs().max(), taps["z"].grad.sum()]
    weights = (sal / sal.mean()).clamp(0.5, 2.0).detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    losses += [loss.detach(), weights.sum()]
report(policy, [model], losses)
