# Untuned: a deep equilibrium model written after the locuslab DEQ tutorial and MDEQ. The cell
# f(z, x) = GroupNorm(relu(z + conv2(GroupNorm(relu(conv1(z)))) + inject(x))) on 48x16x16 feature maps;
# the fixed point z* = f(z*, x) is found under torch.no_grad by Anderson acceleration (history of 5,
# torch.bmm Gram matrix, torch.linalg.solve for the mixing weights, up to 25 iterations, stopping early
# on a relative residual read with .item()); then z1 = z*.requires_grad_() and one more f with grad.
# The implicit backward is a register_hook on f's output that removes itself and solves the adjoint
# fixed point g = J^T g + grad by up to 20 repeated torch.autograd.grad(f0, z1, g, retain_graph=True)
# calls inside the hook (early exit on the residual). A Jacobian regulariser ||v^T J||^2 with
# v = torch.randn_like(f0) via autograd.grad(create_graph=True) joins the loss. Adam, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, Cin, Ch, R, C = 48, 3, 48, 16, 10
class Cell(nn.Module):
    def __init__(s):
        super().__init__()
        s.conv1 = nn.Conv2d(Ch, Ch, 3, padding=1, bias=False); s.conv2 = nn.Conv2d(Ch, Ch, 3, padding=1, bias=False)
        s.n1 = nn.GroupNorm(8, Ch); s.n2 = nn.GroupNorm(8, Ch); s.n3 = nn.GroupNorm(8, Ch)
        for c in (s.conv1, s.conv2): nn.init.normal_(c.weight, 0, 0.01)
    def forward(s, z, xi):
        y = s.n1(F.relu(s.conv1(z)))
        return s.n3(F.relu(z + s.n2(s.conv2(y)) + xi))
def anderson(f, x0, m=5, lam=1e-4, max_iter=25, tol=1e-3, beta=1.0):
    bsz = x0.shape[0]
    X = torch.zeros(bsz, m, x0[0].numel()); Fx = torch.zeros(bsz, m, x0[0].numel())
    X[:, 0], Fx[:, 0] = x0.reshape(bsz, -1), f(x0).reshape(bsz, -1)
    X[:, 1], Fx[:, 1] = Fx[:, 0], f(Fx[:, 0].view_as(x0)).reshape(bsz, -1)
    H = torch.zeros(bsz, m + 1, m + 1); H[:, 0, 1:] = H[:, 1:, 0] = 1
    y = torch.zeros(bsz, m + 1, 1); y[:, 0] = 1
    res = []
    for k in range(2, max_iter):
        n = min(k, m)
        G = Fx[:, :n] - X[:, :n]
        H[:, 1:n + 1, 1:n + 1] = torch.bmm(G, G.transpose(1, 2)) + lam * torch.eye(n)[None]
        alpha = torch.linalg.solve(H[:, :n + 1, :n + 1], y[:, :n + 1])[:, 1:n + 1, 0]
        X[:, k % m] = beta * (alpha[:, None] @ Fx[:, :n])[:, 0] + (1 - beta) * (alpha[:, None] @ X[:, :n])[:, 0]
        Fx[:, k % m] = f(X[:, k % m].view_as(x0)).reshape(bsz, -1)
        res.append((Fx[:, k % m] - X[:, k % m]).norm().item() / (1e-5 + Fx[:, k % m].norm().item()))
        if res[-1] < tol: break
    return X[:, k % m].view_as(x0), res
def fixed_point_iter(f, g0, max_iter=20, tol=1e-4):
    g = g0
    for k in range(max_iter):
        gn = f(g)
        r = (gn - g).norm().item() / (1e-5 + gn.norm().item())
        g = gn
        if r < tol: break
    return g, k
class DEQ(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(Cin, Ch, 3, padding=1), nn.BatchNorm2d(Ch))
        s.inject = nn.Conv2d(Ch, Ch, 1); s.f = Cell()
        s.head = nn.Sequential(nn.Conv2d(Ch, 64, 3, padding=1, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, C))
        s.hook = None; s.stats = []
    def forward(s, x):
        xi = s.inject(s.stem(x))
        with torch.no_grad():
            zs, res = anderson(lambda z: s.f(z, xi), torch.zeros_like(xi))
        s.stats = [len(res), res[-1]]
        z1 = zs.clone().requires_grad_()
        new_z1 = s.f(z1, xi)
        if s.training:
            def backward_hook(grad):
                if s.hook is not None:
                    s.hook.remove(); s.hook = None
                g, k = fixed_point_iter(lambda y: torch.autograd.grad(new_z1, z1, y, retain_graph=True)[0] + grad, grad)
                s.stats.append(k)
                return g
            s.hook = new_z1.register_hook(backward_hook)
            v = torch.randn_like(new_z1)
            vJ = torch.autograd.grad(new_z1, z1, v, create_graph=True)[0]
            jac = vJ.pow(2).sum() / v.numel()
        else:
            jac = None
        return s.head(new_z1), jac
model = DEQ()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, Cin, R, R, generator=g); y = torch.randint(0, C, (B,), generator=g)
    logits, jac = model(x)
    loss = F.cross_entropy(logits, y) + 0.02 * jac
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), jac.detach()] + [torch.tensor(float(v)) for v in model.stats]
model.eval()
with torch.no_grad():
    logits, _ = model(torch.randn(B, Cin, R, R, generator=g))
losses += [logits.sum()]
report(policy, [model], losses)
