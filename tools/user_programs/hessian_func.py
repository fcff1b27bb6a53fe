# Untuned: curvature-regularised training with torch.func inside the loss. A small MLP energy model
# f(x) trained by Adam on a regression loss plus: (1) the exact input Hessian per sample by
# vmap(hessian(f)) on a subset, its Frobenius norm penalised; (2) a Hutchinson estimate of the trace
# of the parameter Hessian: Rademacher probes v, Hv by torch.autograd.grad(create_graph=True) twice,
# v.Hv averaged (the penalty itself differentiated); (3) input Jacobians by vmap(jacrev(f)) and a
# directional derivative by jvp, a smoothness term on both; functional_call with the module's own
# parameters so gradients reach them. Five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.func import hessian, jacrev, jvp, vmap, functional_call
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, DIN, H, NH = 512, 8, 192, 48
net = nn.Sequential(nn.Linear(DIN, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, H), nn.Softplus(), nn.Linear(H, 1))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
def f(params, x):                      # one sample: DIN -> scalar
    return functional_call(net, params, (x[None],)).squeeze()
losses = []
for step in range(5):
    x = torch.randn(B, DIN, generator=g)
    y = (x[:, :2].square().sum(1) + torch.sin(x[:, 2])) + 0.05 * torch.randn(B, generator=g)
    params = dict(net.named_parameters())
    pred = net(x).squeeze(-1)
    mse = F.mse_loss(pred, y)
    Hx = vmap(hessian(f, argnums=1), in_dims=(None, 0))(params, x[:NH])       # NH x DIN x DIN
    hpen = Hx.square().sum((1, 2)).mean()
    J = vmap(jacrev(f, argnums=1), in_dims=(None, 0))(params, x)              # B x DIN
    u = torch.randn(B, DIN, generator=g)
    _, dir_d = jvp(lambda xx: vmap(f, in_dims=(None, 0))(params, xx), (x,), (u,))
    smooth = J.square().sum(1).mean() + 0.1 * dir_d.square().mean()
    plist = list(net.parameters())
    gr = torch.autograd.grad(mse, plist, create_graph=True)
    tr = 0.0
    for k in range(2):
        v = [torch.randint(0, 2, p.shape, generator=g).float() * 2 - 1 for p in plist]
        hv = torch.autograd.grad(gr, plist, grad_outputs=v, create_graph=True)
        tr = tr + sum((a * b).sum() for a, b in zip(hv, v)) / 2
    loss = mse + 1e-3 * hpen + 1e-3 * smooth + 1e-4 * tr
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [loss.detach(), mse.detach(), hpen.detach(), tr.detach()]
report(policy, [net], losses)
