# Untuned: SuperGlue-style keypoint matching. A small CNN describes two images, keypoints are
# the top-k of a detector map (topk + gather), an attentional graph network alternates self-
# and cross-attention by einsum, the score matrix gets a learned dustbin row and column by
# cat, invalid keypoints are masked in place (masked_fill_ on the scores), and 40 iterations of
# log-domain Sinkhorn (logsumexp over rows and columns, every iterate kept by autograd) give
# the assignment; the loss is the negative log-assignment gathered at ground-truth matches
# (and at the dustbin for unmatched points). AdamW with a cosine schedule, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, C, H, W, K, D, LAYERS, ITERS = 4, 3, 48, 48, 96, 64, 4, 40
class Backbone(nn.Module):
    def __init__(s):
        super().__init__()
        s.body = nn.Sequential(nn.Conv2d(C, 32, 3, padding=1), nn.ReLU(inplace=True),
                               nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.ReLU(inplace=True),
                               nn.Conv2d(64, D, 3, padding=1))
        s.det = nn.Conv2d(D, 1, 1)
    def forward(s, img):
        f = s.body(img)                                   # (B, D, H/2, W/2)
        score = s.det(f).flatten(1)                       # (B, N)
        top = score.topk(K, dim=1)
        desc = f.flatten(2).transpose(1, 2)               # (B, N, D)
        idx = top.indices
        kp = torch.gather(desc, 1, idx[..., None].expand(-1, -1, D))
        xy = torch.stack([(idx % f.shape[-1]).float(), (idx // f.shape[-1]).float()], -1) / f.shape[-1]
        return kp, xy, torch.sigmoid(top.values), idx
class Attn(nn.Module):
    def __init__(s):
        super().__init__(); s.q = nn.Linear(D, D); s.kv = nn.Linear(D, 2 * D); s.o = nn.Linear(2 * D, D)
        s.norm = nn.LayerNorm(D)
    def forward(s, x, src):
        q = s.q(x).view(B, K, 4, D // 4)
        k, v = s.kv(src).view(B, K, 2, 4, D // 4).unbind(2)
        a = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(D // 4)
        m = torch.einsum("bhnm,bmhd->bnhd", a.softmax(-1), v).reshape(B, K, D)
        return x + s.o(torch.cat([s.norm(x), m], -1))
class Matcher(nn.Module):
    def __init__(s):
        super().__init__()
        s.pos = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, D))
        s.layers = nn.ModuleList(Attn() for _ in range(2 * LAYERS))
        s.proj = nn.Linear(D, D)
        s.bin = nn.Parameter(torch.tensor(1.0))
    def forward(s, k0, xy0, c0, k1, xy1, c1, valid0, valid1):
        d0 = k0 + s.pos(torch.cat([xy0, c0[..., None]], -1))
        d1 = k1 + s.pos(torch.cat([xy1, c1[..., None]], -1))
        for i, layer in enumerate(s.layers):
            if i % 2 == 0: d0, d1 = layer(d0, d0), layer(d1, d1)
            else: d0, d1 = layer(d0, d1), layer(d1, d0)
        scores = torch.einsum("bnd,bmd->bnm", s.proj(d0), s.proj(d1)) / math.sqrt(D)
        scores.masked_fill_(~(valid0[:, :, None] & valid1[:, None, :]), -1e4)
        bins_r = s.bin.expand(B, K, 1); bins_c = s.bin.expand(B, 1, K + 1)
        z = torch.cat([torch.cat([scores, bins_r], -1), bins_c], 1)   # (B, K+1, K+1)
        norm = -math.log(2 * K)
        log_mu = torch.cat([torch.full((K,), norm), torch.tensor([math.log(K) + norm])])
        u = torch.zeros(B, K + 1); v = torch.zeros(B, K + 1)
        for _ in range(ITERS):
            u = log_mu - torch.logsumexp(z + v[:, None, :], dim=2)
            v = log_mu - torch.logsumexp(z + u[:, :, None], dim=1)
        return z + u[:, :, None] + v[:, None, :] - norm
net, matcher = Backbone(), Matcher()
params = list(net.parameters()) + list(matcher.parameters())
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    img0 = torch.randn(B, C, H, W, generator=g)
    shift = int(torch.randint(1, 4, (1,), generator=g))
    img1 = torch.roll(img0, shifts=(shift, shift), dims=(2, 3)) + 0.05 * torch.randn(B, C, H, W, generator=g)
    k0, xy0, c0, i0 = net(img0); k1, xy1, c1, i1 = net(img1)
    valid0, valid1 = c0 > 0.2, c1 > 0.2
    P = matcher(k0, xy0, c0, k1, xy1, c1, valid0, valid1)
    # Ground truth: keypoint n of image 0 matches m of image 1 when they are the same cell
    # after the shift; else the dustbin.
    side = W // 2
    moved = ((i0 // side + (shift + 1) // 2) % side) * side + (i0 % side + (shift + 1) // 2) % side
    same = moved[:, :, None] == i1[:, None, :]
    target0 = torch.where(same.any(2), same.float().argmax(2), torch.full_like(i0, K))
    nll0 = -torch.gather(P[:, :K, :], 2, target0[..., None]).mean()
    unmatched1 = ~same.any(1)
    nll1 = -(P[:, K, :K] * unmatched1).sum() / unmatched1.sum().clamp(min=1)
    loss = nll0 + nll1
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step(); sched.step()
    losses += [nll0.detach(), nll1.detach(), P.detach().exp()[:, :K, :K].sum()]
report(policy, [net, matcher], losses)
