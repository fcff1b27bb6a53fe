# Untuned: deep kernel learning. A conv feature extractor maps 32x32 "images" to 16-d features; an
# RBF-plus-linear kernel on them is built by torch.cdist, in float64 (.double()), with a learned
# log lengthscale, signal and noise. The exact GP negative log marginal likelihood on each batch:
# torch.linalg.cholesky, torch.cholesky_solve for alpha, the log determinant from the Cholesky
# diagonal; a second term by torch.linalg.slogdet of the same matrix, a third by
# torch.linalg.solve_triangular, and a spectral regulariser on the features by torch.linalg.svdvals
# and torch.linalg.eigh of their covariance (eigenvalues and eigenvectors, both with backward).
# Predictions on a held-out half by the GP posterior mean (torch.linalg.solve). Adamax on the
# network and the kernel hyperparameters, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
N, R, DF = 96, 32, 16
class Features(nn.Module):
    def __init__(s):
        super().__init__()
        s.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.InstanceNorm2d(32, affine=True), nn.SELU(),
                               nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.InstanceNorm2d(64, affine=True), nn.SELU(),
                               nn.Conv2d(64, 64, 3, padding=1), nn.SELU(),
                               nn.Conv2d(64, 96, 3, padding=1, stride=2), nn.SELU(), nn.AdaptiveMaxPool2d(2))
        s.proj = nn.Linear(96 * 4, DF)
    def forward(s, x): return s.proj(s.body(x).flatten(1))
class GP(nn.Module):
    def __init__(s):
        super().__init__()
        s.log_ls = nn.Parameter(torch.zeros(()))
        s.log_sf = nn.Parameter(torch.zeros(()))
        s.log_sn = nn.Parameter(torch.tensor(-1.0))
        s.lin = nn.Parameter(torch.tensor(0.1))
    def kernel(s, a, b):
        d2 = torch.cdist(a, b).pow(2)
        return torch.exp(2 * s.log_sf.double()) * torch.exp(-0.5 * d2 / torch.exp(2 * s.log_ls.double())) + F.softplus(s.lin.double()) * (a @ b.T)
feat, gp = Features(), GP()
opt = torch.optim.Adamax(list(feat.parameters()) + list(gp.parameters()), lr=2e-3)
g = torch.Generator().manual_seed(1)
w_true = torch.randn(3 * 8 * 8, generator=g)
losses = []
for step in range(3):
    x = torch.randn(N, 3, R, R, generator=g)
    y = torch.sin(F.avg_pool2d(x, 4).flatten(1) @ w_true / 8) + 0.05 * torch.randn(N, generator=g)
    z = feat(x)
    zt, zv = z[: N // 2].double(), z[N // 2:].double()
    yt, yv = y[: N // 2].double(), y[N // 2:].double()
    n = zt.shape[0]
    K = gp.kernel(zt, zt) + (torch.exp(2 * gp.log_sn.double()) + 1e-4) * torch.eye(n, dtype=torch.float64)
    L = torch.linalg.cholesky(K)
    alpha = torch.cholesky_solve(yt.unsqueeze(1), L)
    nll = 0.5 * (yt.unsqueeze(1) * alpha).sum() + torch.log(torch.diagonal(L)).sum() + 0.5 * n * math.log(2 * math.pi)
    sign, logabs = torch.linalg.slogdet(K)
    v = torch.linalg.solve_triangular(L, yt.unsqueeze(1), upper=False)
    consistency = (0.5 * logabs - torch.log(torch.diagonal(L)).sum()).pow(2) + (v.pow(2).sum() - (yt.unsqueeze(1) * alpha).sum()).pow(2)
    Ks = gp.kernel(zv, zt)
    mean = Ks @ torch.linalg.solve(K, yt)
    pred = F.mse_loss(mean, yv)
    zc = z - z.mean(0)
    cov = zc.T @ zc / (N - 1)
    evals, evecs = torch.linalg.eigh(cov + 1e-3 * torch.eye(DF))
    sv = torch.linalg.svdvals(zc)
    spec = (evals.clamp(min=1e-6).log().var() + (sv / sv.max()).sum() * 0.01 + evecs[:, -1].abs().sum() * 1e-3)
    loss = (nll / n).float() + pred.float() + 1e-3 * consistency.float() + 0.1 * spec
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), nll.detach(), pred.detach(), spec.detach(), sign]
report(policy, [feat, gp], losses)
