# Untuned: Deep Closest Point-style point cloud registration. A shared per-point MLP with an
# EdgeConv-like neighbour max (kNN by torch.cdist + topk on the source and target clouds), a
# Transformer-style cross attention between the two clouds, soft correspondences by a softmax over
# the (N x N) feature similarity, and the rigid transform by weighted orthogonal Procrustes:
# torch.linalg.svd (full_matrices=False) of the 3x3 cross covariance, with a reflection fix by
# torch.linalg.det and torch.diag_embed; a learned residual rotation by torch.linalg.matrix_exp of a
# skew-symmetric matrix predicted from pooled features; a per-cloud scale by torch.linalg.lstsq and a
# consistency check by torch.linalg.pinv; an orthogonality penalty through torch.linalg.qr. Losses:
# rotation (R^T R_gt against the identity) and translation errors, a cycle loss on the inverse
# transform, and the aligned point distance. Adam with an ExponentialLR, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, N, K, D = 6, 512, 12, 64
def knn_feat(x, k):                                  # x: (B, N, C) -> (B, N, k, 2C)
    d = torch.cdist(x, x)
    idx = d.topk(k, dim=-1, largest=False).indices
    nb = torch.gather(x.unsqueeze(1).expand(-1, x.shape[1], -1, -1), 2, idx.unsqueeze(-1).expand(-1, -1, -1, x.shape[-1]))
    return torch.cat([x.unsqueeze(2).expand_as(nb), nb - x.unsqueeze(2)], -1)
class Embed(nn.Module):
    def __init__(s):
        super().__init__()
        s.e1 = nn.Sequential(nn.Linear(6, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2))
        s.e2 = nn.Sequential(nn.Linear(128, 128), nn.LeakyReLU(0.2))
        s.out = nn.Linear(64 + 128, D)
    def forward(s, p):
        a = s.e1(knn_feat(p, K)).max(2).values
        b = s.e2(knn_feat(a, K)).max(2).values
        return s.out(torch.cat([a, b], -1))
class DCP(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = Embed()
        s.cross = nn.MultiheadAttention(D, 4, batch_first=True)
        s.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        s.rot = nn.Linear(2 * D, 3)
        s.log_t = nn.Parameter(torch.zeros(()))
    def forward(s, src, tgt):
        fs, ft = s.emb(src), s.emb(tgt)
        fs = fs + s.cross(fs, ft, ft, need_weights=False)[0]; ft = ft + s.cross(ft, fs, fs, need_weights=False)[0]
        fs = fs + s.ff(fs); ft = ft + s.ff(ft)
        att = torch.softmax(fs @ ft.transpose(1, 2) / (math.sqrt(D) * torch.exp(s.log_t)), -1)   # (B, N, N)
        corr = att @ tgt                                                                   # soft matches
        cs, cc = src.mean(1, keepdim=True), corr.mean(1, keepdim=True)
        H = (src - cs).transpose(1, 2) @ (corr - cc)                                       # (B, 3, 3)
        U, S, Vh = torch.linalg.svd(H, full_matrices=False)
        d = torch.sign(torch.linalg.det(Vh.transpose(1, 2) @ U.transpose(1, 2)))
        Dm = torch.diag_embed(torch.stack([torch.ones_like(d), torch.ones_like(d), d], -1))
        R = Vh.transpose(1, 2) @ Dm @ U.transpose(1, 2)
        w = s.rot(torch.cat([fs.max(1).values, ft.max(1).values], -1)) * 0.1
        zero = torch.zeros_like(w[:, 0])
        skew = torch.stack([torch.stack([zero, -w[:, 2], w[:, 1]], -1), torch.stack([w[:, 2], zero, -w[:, 0]], -1),
                            torch.stack([-w[:, 1], w[:, 0], zero], -1)], 1)
        R = torch.linalg.matrix_exp(skew) @ R
        t = cc.squeeze(1) - (R @ cs.transpose(1, 2)).squeeze(-1)
        return R, t, corr, S
def rand_rot(g, n):
    q, r = torch.linalg.qr(torch.randn(n, 3, 3, generator=g))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q * torch.sign(torch.linalg.det(q)).view(n, 1, 1)
model = DCP()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
g = torch.Generator().manual_seed(1)
eye = torch.eye(3)
losses = []
for step in range(3):
    src = torch.randn(B, N, 3, generator=g) * torch.tensor([1.0, 0.6, 0.3])
    Rg = rand_rot(g, B); tg = torch.randn(B, 3, generator=g) * 0.5
    tgt = (src @ Rg.transpose(1, 2) + tg.unsqueeze(1))[:, torch.randperm(N, generator=g)] + 0.01 * torch.randn(B, N, 3, generator=g)
    R, t, corr, S = model(src, tgt)
    Ri, ti = model(tgt, src)[:2]
    l_rot = F.mse_loss(R.transpose(1, 2) @ Rg, eye.expand(B, -1, -1))
    l_t = F.mse_loss(t, tg)
    l_cyc = F.mse_loss(Ri @ R, eye.expand(B, -1, -1)) + F.mse_loss((Ri @ t.unsqueeze(-1)).squeeze(-1) + ti, torch.zeros(B, 3))
    aligned = src @ R.transpose(1, 2) + t.unsqueeze(1)
    scale = torch.linalg.lstsq(aligned.reshape(-1, 1), corr.reshape(-1, 1)).solution
    pinv_gap = (torch.linalg.pinv(R) - R.transpose(1, 2)).pow(2).mean()
    Q, Rr = torch.linalg.qr(R)
    l_orth = (Rr.abs() - eye).pow(2).mean() + pinv_gap
    l_pts = (aligned - corr).norm(dim=-1).mean() + (scale.squeeze() - 1).pow(2)
    loss = l_rot + l_t + 0.5 * l_cyc + 0.1 * l_pts + 0.1 * l_orth
    opt.zero_grad()
    loss.backward()
    opt.step(); sched.step()
    losses += [loss.detach(), l_rot.detach(), l_t.detach(), l_cyc.detach(), l_pts.detach(), S.detach().sum()]
report(policy, [model], losses)
