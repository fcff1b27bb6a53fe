# Untuned: a NeRF-style renderer on random rays. Positional encoding of points and view directions
# (x, then sin/cos of 2^k pi x for many frequencies, torch.cat), of the flattened samples, run through
# the MLP in chunks of NETCHUNK rows (slices of the encodings, torch.cat of the raw outputs, reshape
# back) as the original code's batchify does. Coarse and fine MLPs (ReLU, a skip concatenation of the
# encoded input half-way, a density head and a view-dependent colour head).
# Volume rendering: deltas between sorted depths (last one 1e10), alpha = 1 - exp(-relu(sigma + noise)
# * delta) with the original code's raw-noise regularisation (torch.randn_like(sigma) * 1.0 while
# training), transmittance by an exclusive torch.cumprod (cat of ones and 1 - alpha + 1e-10),
# weights, colour sum, white background by rgb + (1 - acc). Hierarchical sampling for the fine pass: a pdf from the detached coarse weights, cdf by
# cumsum (cat of zeros), torch.searchsorted of uniform samples, torch.gather of bin edges and cdf
# values, inverse-cdf interpolation, then the coarse and fine depths merged with torch.sort. MSE
# on the rendered colours of both passes, Adam, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
R, NC, NF, LX, LD, W, NETCHUNK = 128, 24, 24, 8, 4, 64, 1000
def posenc(x, L):
    out = [x]
    for k in range(L):
        out += [torch.sin((2.0 ** k) * math.pi * x), torch.cos((2.0 ** k) * math.pi * x)]
    return torch.cat(out, -1)
class NeRF(nn.Module):
    def __init__(s):
        super().__init__()
        dx, dd = 3 + 6 * LX, 3 + 6 * LD
        s.l1 = nn.ModuleList([nn.Linear(dx, W)] + [nn.Linear(W, W) for _ in range(3)])
        s.l2 = nn.ModuleList([nn.Linear(W + dx, W)] + [nn.Linear(W, W) for _ in range(2)])
        s.sigma = nn.Linear(W, 1)
        s.feat = nn.Linear(W, W)
        s.rgb = nn.Sequential(nn.Linear(W + dd, W // 2), nn.ReLU(), nn.Linear(W // 2, 3))
    def forward(s, ex, ed):                            # embedded points and directions -> raw (N, 4)
        h = ex
        for l in s.l1: h = F.relu(l(h))
        h = torch.cat([h, ex], -1)                      # skip connection
        for l in s.l2: h = F.relu(l(h))
        rgb = s.rgb(torch.cat([s.feat(h), ed], -1))
        return torch.cat([rgb, s.sigma(h)], -1)
def run_network(model, pts, dirs, chunk=NETCHUNK):
    flat = pts.reshape(-1, 3)
    ex = posenc(flat, LX)
    ed = posenc(dirs[:, None, :].expand(pts.shape).reshape(-1, 3), LD)
    raw = torch.cat([model(ex[i:i + chunk], ed[i:i + chunk]) for i in range(0, flat.shape[0], chunk)], 0)
    raw = raw.reshape(*pts.shape[:-1], 4)
    return torch.sigmoid(raw[..., :3]), raw[..., 3]
def render(rgb, sigma, z, dirs, noise_std=1.0):
    if noise_std > 0: sigma = sigma + torch.randn_like(sigma) * noise_std
    delta = z[..., 1:] - z[..., :-1]
    delta = torch.cat([delta, torch.full_like(delta[..., :1], 1e10)], -1) * dirs.norm(dim=-1, keepdim=True)
    alpha = 1.0 - torch.exp(-F.relu(sigma) * delta)
    T = torch.cumprod(torch.cat([torch.ones_like(alpha[..., :1]), 1.0 - alpha + 1e-10], -1), -1)[..., :-1]
    w = alpha * T
    acc = w.sum(-1, keepdim=True)
    return (w[..., None] * rgb).sum(-2) + (1.0 - acc), w
def sample_pdf(bins, weights, n, gen):
    weights = weights + 1e-5
    pdf = weights / weights.sum(-1, keepdim=True)
    cdf = torch.cat([torch.zeros_like(pdf[..., :1]), torch.cumsum(pdf, -1)], -1)
    u = torch.rand(cdf.shape[0], n, generator=gen).contiguous()
    idx = torch.searchsorted(cdf, u, right=True)
    below = (idx - 1).clamp(min=0); above = idx.clamp(max=cdf.shape[-1] - 1)
    ig = torch.stack([below, above], -1)                                    # (R, n, 2)
    cdf_g = torch.gather(cdf[:, None, :].expand(-1, n, -1), 2, ig)
    bins_g = torch.gather(bins[:, None, :].expand(-1, n, -1), 2, ig)
    denom = cdf_g[..., 1] - cdf_g[..., 0]
    denom = torch.where(denom < 1e-5, torch.ones_like(denom), denom)
    t = (u - cdf_g[..., 0]) / denom
    return bins_g[..., 0] + t * (bins_g[..., 1] - bins_g[..., 0])
coarse, fine = NeRF(), NeRF()
opt = torch.optim.Adam(list(coarse.parameters()) + list(fine.parameters()), lr=5e-4)
g = torch.Generator().manual_seed(1)
near, far = 2.0, 6.0
losses = []
for step in range(3):
    o = torch.randn(R, 3, generator=g) * 0.1
    d = F.normalize(torch.randn(R, 3, generator=g), dim=-1)
    target = torch.rand(R, 3, generator=g)
    t = torch.linspace(0, 1, NC)
    z = near * (1 - t) + far * t
    mids = 0.5 * (z[1:] + z[:-1])
    lo, hi = torch.cat([z[:1], mids]), torch.cat([mids, z[-1:]])
    z = (lo + (hi - lo) * torch.rand(R, NC, generator=g))                    # stratified
    pts = o[:, None, :] + d[:, None, :] * z[..., None]
    rgb_c, sig_c = run_network(coarse, pts, d)
    col_c, w_c = render(rgb_c, sig_c, z, d)
    zm = 0.5 * (z[..., 1:] + z[..., :-1])
    zf = sample_pdf(zm, w_c[..., 1:-1].detach(), NF, g).detach()
    zall, _ = torch.sort(torch.cat([z, zf], -1), -1)
    pts_f = o[:, None, :] + d[:, None, :] * zall[..., None]
    rgb_f, sig_f = run_network(fine, pts_f, d)
    col_f, _ = render(rgb_f, sig_f, zall, d)
    loss = F.mse_loss(col_c, target) + F.mse_loss(col_f, target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), F.mse_loss(col_f, target).detach()]
report(policy, [coarse, fine], losses)
