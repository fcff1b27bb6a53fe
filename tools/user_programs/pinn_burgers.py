# Untuned: a physics-informed network for the viscous Burgers equation u_t + u u_x = nu u_xx on
# x in [-1, 1], t in [0, 1]. An MLP u(x, t) (tanh, Fourier-feature input) on a batch of
# collocation points that require grad; u_x and u_t from one torch.autograd.grad(create_graph=True)
# call on the concatenated (x, t) input, u_xx from a second autograd.grad on u_x; residual loss plus
# an initial-condition term (u(x, 0) = -sin(pi x)) and Dirichlet boundary terms at x = +-1 (their
# own u_x too, a Neumann-like penalty). Adam for 3 steps with fresh collocation points, then one
# LBFGS step (max_iter 3) on the last batch whose closure recomputes the second derivatives.
# FUNC=1: the residual's derivatives instead come from torch.func: vmap over points of
# grad(u)/grad(grad(u)) of a scalar functional_call of the model (parameters passed live, so the
# outer loss.backward() reaches them), jacrev for the boundary u_x.
import os, math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
NC, NB, H, NU = 6144, 512, 96, 0.01 / math.pi
class PINN(nn.Module):
    def __init__(s):
        super().__init__()
        s.register_buffer("B", torch.randn(2, 16) * 2.0)
        s.inp = nn.Linear(2 + 32, H)
        s.hid = nn.ModuleList([nn.Linear(H, H) for _ in range(4)])
        s.out = nn.Linear(H, 1)
    def forward(s, x, t):
        z = torch.cat([x, t], 1)
        proj = z @ s.B
        h = torch.tanh(s.inp(torch.cat([z, torch.sin(proj), torch.cos(proj)], 1)))
        for i, l in enumerate(s.hid):
            h = torch.tanh(l(h)) + (h if i % 2 else 0)
        return s.out(h)
model = PINN()
g = torch.Generator().manual_seed(1)
def sample():
    x = torch.rand(NC, 1, generator=g) * 2 - 1; t = torch.rand(NC, 1, generator=g)
    x0 = torch.rand(NB, 1, generator=g) * 2 - 1
    tb = torch.rand(NB, 1, generator=g)
    return x, t, x0, tb
FUNC = os.environ.get("FUNC") == "1"
from torch.func import functional_call, vmap, grad, jacrev
def u_point(params, x, t):
    return functional_call(model, params, (x.view(1, 1), t.view(1, 1))).squeeze()
def pinn_loss(x, t, x0, tb):
    if FUNC:
        params = dict(model.named_parameters()); params.update(model.named_buffers())
        xs, ts = x.squeeze(1), t.squeeze(1)
        u = vmap(u_point, in_dims=(None, 0, 0))(params, xs, ts).unsqueeze(1)
        u_x = vmap(grad(u_point, argnums=1), in_dims=(None, 0, 0))(params, xs, ts).unsqueeze(1)
        u_t = vmap(grad(u_point, argnums=2), in_dims=(None, 0, 0))(params, xs, ts).unsqueeze(1)
        u_xx = vmap(grad(grad(u_point, argnums=1), argnums=1), in_dims=(None, 0, 0))(params, xs, ts).unsqueeze(1)
    else:
        xt = torch.cat([x, t], 1).requires_grad_(True)
        u = model(xt[:, :1], xt[:, 1:])
        du = torch.autograd.grad(u, xt, grad_outputs=torch.ones_like(u), create_graph=True)[0]
        u_x, u_t = du[:, :1], du[:, 1:]
        u_xx = torch.autograd.grad(u_x.sum(), xt, create_graph=True)[0][:, :1]
    res = u_t + u * u_x - NU * u_xx
    l_res = res.pow(2).mean()
    u0 = model(x0, torch.zeros_like(x0))
    l_ic = F.mse_loss(u0, -torch.sin(math.pi * x0))
    xb = torch.cat([torch.full_like(tb, -1.0), torch.ones_like(tb)]).requires_grad_()
    ub = model(xb, torch.cat([tb, tb]))
    ub_x, = torch.autograd.grad(ub, xb, torch.ones_like(ub), create_graph=True)
    l_bc = ub.pow(2).mean() + 1e-3 * ub_x.pow(2).mean()
    return l_res + 10 * l_ic + l_bc, l_res
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
losses = []
for step in range(3):
    batch = sample()
    loss, l_res = pinn_loss(*batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses += [loss.detach(), l_res.detach()]
lb = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3, history_size=5)
def closure():
    lb.zero_grad()
    loss, _ = pinn_loss(*batch)
    loss.backward()
    return loss
losses.append(lb.step(closure).detach())
with torch.no_grad(): losses.append(model(batch[0], batch[1]).square().sum())
report(policy, [model], losses)
