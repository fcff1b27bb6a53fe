# Untuned: a model whose forward leans on torch.linalg, each routine through its backward. Feature
# maps from an MLP over a batch of point sets; per set an orthogonal Procrustes alignment of two
# views by `linalg.svd` with a `linalg.det` reflection fix; a QR re-orthogonalised mixing layer
# (`linalg.qr` of a weight); a hand-written spectral normalisation by `linalg.eigh` of W^T W; a
# Gaussian-process head per set by `linalg.cholesky`, `cholesky_solve` and `linalg.solve`; a
# whitening by `linalg.lstsq`; a rotation generator through `linalg.matrix_exp` of a skew matrix;
# `linalg.inv_ex` on a damped Gram matrix and `linalg.slogdet` in a log-det regulariser. float64
# where the factorisations need it. Adam, five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
S, N, D, K = 48, 96, 128, 16
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.f = nn.Sequential(nn.Linear(3, D), nn.GELU(), nn.Linear(D, D), nn.GELU(), nn.Linear(D, D))
        s.mix = nn.Parameter(torch.randn(D, D) / D ** 0.5)
        s.sn = nn.Parameter(torch.randn(D, D) / D ** 0.5)
        s.proj = nn.Linear(D, K)
        s.skew = nn.Parameter(torch.zeros(3, 3))
        s.log_ls = nn.Parameter(torch.zeros(())); s.log_noise = nn.Parameter(torch.tensor(-2.0))
        s.out = nn.Linear(K, 1)
    def forward(s, a, b, y):
        fa, fb = s.f(a), s.f(b)                                   # S x N x D
        q, r = torch.linalg.qr(s.mix)
        q = q * torch.sign(torch.diagonal(r))                     # unique QR
        fa = fa @ q
        lam = torch.linalg.eigh(s.sn.t() @ s.sn).eigenvalues[-1]  # spectral norm by eigh
        fb = fb @ (s.sn / lam.sqrt())
        za, zb = s.proj(fa).double(), s.proj(fb).double()         # S x N x K
        m = zb.transpose(1, 2) @ za                               # K x K per set
        U, Sv, Vh = torch.linalg.svd(m)
        d = torch.linalg.det(U @ Vh).sign()
        fix = torch.ones(S, K, dtype=torch.float64); fix[:, -1] = d
        R = U @ torch.diag_embed(fix) @ Vh                        # Procrustes rotation
        zb_al = zb @ R
        align = (za - zb_al).square().mean()
        # GP head on the aligned features, per set
        x = za.float()
        d2 = torch.cdist(x, x).square()
        Kxx = torch.exp(-0.5 * d2 / s.log_ls.exp() ** 2).double() + (s.log_noise.exp().double() + 1e-3) * torch.eye(N, dtype=torch.float64)
        L = torch.linalg.cholesky(Kxx)
        alpha = torch.cholesky_solve(y.double()[..., None], L)
        nll = 0.5 * (y.double()[..., None] * alpha).sum((1, 2)) + torch.log(torch.diagonal(L, dim1=1, dim2=2)).sum(1)
        mean = Kxx @ torch.linalg.solve(Kxx, y.double()[..., None])
        # whitening by least squares, a generated rotation, a log-det term
        W = torch.linalg.lstsq(za, zb_al).solution                 # K x K per set
        G = za.transpose(1, 2) @ za / N + 1e-2 * torch.eye(K, dtype=torch.float64)
        Ginv, info = torch.linalg.inv_ex(G)
        logdet = torch.linalg.slogdet(G).logabsdet
        rot = torch.linalg.matrix_exp(s.skew - s.skew.t())
        pts = a @ rot
        pred = s.out((za @ Ginv).float()).squeeze(-1) + pts[..., 0]
        return pred, align, nll.mean() / N, (mean.squeeze(-1) - y.double()).square().mean(), (W - torch.eye(K, dtype=torch.float64)).square().mean(), logdet.mean(), info.sum()
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    a = torch.randn(S, N, 3, generator=g)
    th = torch.rand(S, generator=g) * 6.28
    rotz = torch.stack([torch.stack([th.cos(), -th.sin(), torch.zeros(S)], -1), torch.stack([th.sin(), th.cos(), torch.zeros(S)], -1),
                        torch.tensor([0.0, 0.0, 1.0]).expand(S, 3)], 1)
    b = a @ rotz + 0.01 * torch.randn(S, N, 3, generator=g)
    y = a.norm(dim=-1) + 0.1 * torch.randn(S, N, generator=g)
    pred, align, nll, fit, wl, logdet, info = model(a, b, y)
    loss = F.mse_loss(pred, y) + 0.1 * align.float() + 0.1 * nll.float() + fit.float() + 0.01 * wl.float() - 0.01 * logdet.float()
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [loss.detach(), align.detach(), nll.detach(), info.float()]
report(policy, [model], losses)
