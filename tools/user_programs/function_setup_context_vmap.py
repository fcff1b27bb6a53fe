# Untuned: custom autograd.Functions written in the new style (a static forward without ctx plus
# setup_context(ctx, inputs, output)) with generate_vmap_rule = True, so torch.func can transform
# them. ClipSoftplus returns the activation and a bool mask of clipped entries; setup_context saves
# the input and the mask by ctx.save_for_backward, keeps beta and the clip threshold (Python floats)
# on ctx, marks the mask non-differentiable (ctx.mark_non_differentiable) and calls
# ctx.set_materialize_grads(False), so backward sees None for outputs nobody used. GatedMix returns
# two differentiable outputs (a gated mix and an auxiliary sparsity score) of which the model uses
# the second only every other layer: backward handles a None gradient. Both backwards are written
# in differentiable torch ops. They run inside an MLP classifier; the loss adds a per-sample
# gradient-norm penalty computed by torch.func: vmap(grad(per_sample_loss)) over a slice of the
# batch through functional_call, the Functions' forward and backward traced by the generated vmap
# rule, and the penalty differentiated again by loss.backward(). Adam, four steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.func import functional_call, grad, vmap
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, DIN, D, NC, NP = 1024, 64, 256, 10, 16
class ClipSoftplus(torch.autograd.Function):
    generate_vmap_rule = True
    @staticmethod
    def forward(x, beta, clip):
        y = F.softplus(x, beta=beta)
        mask = y > clip
        return torch.where(mask, clip + 0.1 * (y - clip), y), mask
    @staticmethod
    def setup_context(ctx, inputs, output):
        x, beta, clip = inputs
        _, mask = output
        ctx.save_for_backward(x, mask)
        ctx.beta, ctx.clip = beta, clip
        ctx.mark_non_differentiable(mask)
        ctx.set_materialize_grads(False)
    @staticmethod
    def backward(ctx, gy, gmask):
        if gy is None:
            return None, None, None
        x, mask = ctx.saved_tensors
        s = torch.sigmoid(ctx.beta * x)
        return gy * torch.where(mask, 0.1 * s, s), None, None
class GatedMix(torch.autograd.Function):
    generate_vmap_rule = True
    @staticmethod
    def forward(a, b, temp):
        gate = torch.sigmoid(b / temp)
        return a * gate, gate.mean(-1)
    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, temp = inputs
        ctx.save_for_backward(a, b)
        ctx.temp = temp
        ctx.set_materialize_grads(False)
    @staticmethod
    def backward(ctx, gout, gaux):
        a, b = ctx.saved_tensors
        gate = torch.sigmoid(b / ctx.temp)
        dgate = gate * (1 - gate) / ctx.temp
        ga = gb = None
        if gout is not None:
            ga = gout * gate
            gb = gout * a * dgate
        if gaux is not None:
            gb2 = gaux[..., None] * dgate / b.shape[-1]
            gb = gb2 if gb is None else gb + gb2
        return ga, gb, None
class Layer(nn.Module):
    def __init__(s, din, use_aux):
        super().__init__()
        s.a, s.b = nn.Linear(din, D), nn.Linear(din, D); s.use_aux = use_aux
    def forward(s, x):
        h, aux = GatedMix.apply(s.a(x), s.b(x), 2.0)
        h, clipped = ClipSoftplus.apply(h, 1.5, 0.6)
        pen = aux.mean() if s.use_aux else h.new_zeros(())
        return h, pen, clipped.float().mean()
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.layers = nn.ModuleList([Layer(DIN, True), Layer(D, False), Layer(D, True), Layer(D, False)])
        s.head = nn.Linear(D, NC)
    def forward(s, x):
        pen, frac = 0.0, 0.0
        for l in s.layers:
            x, p, c = l(x); pen = pen + p; frac = frac + c
        return s.head(x), pen, frac
net = Net()
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
def per_sample_loss(params, x, y):
    logits, _, _ = functional_call(net, params, (x[None],))
    return F.cross_entropy(logits, y[None])
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    x = torch.randn(B, DIN, generator=g); y = torch.randint(0, NC, (B,), generator=g)
    logits, pen, frac = net(x)
    ce = F.cross_entropy(logits, y)
    params = dict(net.named_parameters())
    gs = vmap(grad(per_sample_loss), in_dims=(None, 0, 0))(params, x[:NP], y[:NP])
    gnorm = torch.stack([v.flatten(1).square().sum(1) for v in gs.values()]).sum(0).sqrt()   # NP
    loss = ce + 0.01 * pen + 0.01 * gnorm.mean()
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [loss.detach(), gnorm.detach().max(), frac.detach()]
report(policy, [net], losses)
