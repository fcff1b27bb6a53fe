# Untuned: a PointPillars-style detector on random point clouds, all data-dependent shapes. Points
# are cropped to a range by a boolean mask (x[mask]); pillar coordinates by floor, then
# torch.unique(dim=0, return_inverse=True, return_counts=True) groups points into pillars; per-point
# features are decorated with offsets from the pillar mean (scatter_add_ / index_add by the
# inverse), run through a pointwise MLP (Linear, BatchNorm1d, ReLU), reduced per pillar by
# scatter_reduce("amax", include_self=False), and scattered into a dense BEV canvas by index_put_
# with accumulate=False. A 2D backbone with an upsampling neck (nn.Upsample, concatenation) predicts
# per-cell heatmap logits and box offsets. Targets: the cells holding ground-truth centres; positives
# found by torch.nonzero and torch.where(mask) (one-argument), a sigmoid focal loss on the heatmap,
# and an L1 loss on masked_select-ed offsets; points gathered back from the canvas per pillar for a
# point-segmentation loss. RAdam, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, NPTS, G, C = 2, 12000, 64, 64
RANGE = 8.0
class PillarNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.pfn = nn.Sequential(nn.Linear(9, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, C), nn.BatchNorm1d(C), nn.ReLU())
        def blk(i, o, st): return nn.Sequential(nn.Conv2d(i, o, 3, stride=st, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                                               nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        s.b1, s.b2 = blk(C, 64, 1), blk(64, 128, 2)
        s.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        s.neck = nn.Conv2d(64 + 128, 96, 1)
        s.heat = nn.Conv2d(96, 1, 3, padding=1); s.off = nn.Conv2d(96, 2, 3, padding=1)
        s.seg = nn.Linear(C + 96, 2)
    def forward(s, pts):
        canvases, per_point = [], []
        for b in range(pts.shape[0]):
            p = pts[b]
            keep = (p[:, :2].abs() < RANGE).all(1)
            p = p[keep]
            cell = ((p[:, :2] + RANGE) / (2 * RANGE) * G).floor().long().clamp(0, G - 1)
            uniq, inv, cnt = torch.unique(cell, dim=0, return_inverse=True, return_counts=True)
            sums = torch.zeros(uniq.shape[0], 3).index_add(0, inv, p[:, :3])
            mean = sums / cnt.unsqueeze(1)
            centre = (uniq.float() + 0.5) / G * (2 * RANGE) - RANGE
            dec = torch.cat([p[:, :4], p[:, :3] - mean[inv], p[:, :2] - centre[inv]], 1)
            f = s.pfn(dec)
            pill = torch.zeros(uniq.shape[0], C).scatter_reduce(0, inv.unsqueeze(1).expand(-1, C), f, "amax", include_self=False)
            canvas = torch.zeros(C, G, G)
            canvas = canvas.index_put((torch.arange(C)[:, None], uniq[:, 1][None, :], uniq[:, 0][None, :]), pill.T)
            canvases.append(canvas)
            per_point.append((f, cell, keep))
        x = torch.stack(canvases)
        h1 = s.b1(x); h2 = s.b2(h1)
        n = F.relu(s.neck(torch.cat([h1, s.up(h2)], 1)))
        segs = []
        for b, (f, cell, keep) in enumerate(per_point):
            back = n[b][:, cell[:, 1], cell[:, 0]].T
            segs.append(s.seg(torch.cat([f, back], 1)))
        return s.heat(n).squeeze(1), s.off(n), segs
def focal(logits, t, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, t, reduction="none")
    pt = p * t + (1 - p) * (1 - t)
    return ((alpha * t + (1 - alpha) * (1 - t)) * ce * (1 - pt) ** gamma).sum() / t.sum().clamp(min=1)
model = PillarNet()
opt = torch.optim.RAdam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
def batch():
    pts = torch.randn(B, NPTS, 4, generator=g) * torch.tensor([6.0, 6.0, 1.0, 1.0])
    centres = torch.rand(B, 5, 2, generator=g) * 12 - 6
    obj = torch.zeros(B, NPTS, dtype=torch.long)
    for b in range(B):  # clusters of points around the objects
        for k in range(5):
            sl = slice(k * 400, (k + 1) * 400)
            pts[b, sl, :2] = centres[b, k] + 0.4 * torch.randn(400, 2, generator=g)
            obj[b, sl] = 1
    return pts, centres, obj
losses = []
for step in range(3):
    pts, centres, obj = batch()
    heat, off, segs = model(pts)
    tgt = torch.zeros(B, G, G); otgt = torch.zeros(B, 2, G, G)
    cidx = ((centres + RANGE) / (2 * RANGE) * G)
    ci = cidx.floor().long()
    for b in range(B):
        tgt[b, ci[b, :, 1], ci[b, :, 0]] = 1.0
        otgt[b, :, ci[b, :, 1], ci[b, :, 0]] = (cidx[b] - ci[b]).T
    pos = tgt > 0
    bi, yi, xi = torch.where(pos)
    assert torch.equal(torch.nonzero(pos), torch.stack([bi, yi, xi], 1))
    m2 = pos.unsqueeze(1).expand(-1, 2, -1, -1)
    l_off = F.l1_loss(torch.masked_select(off, m2), torch.masked_select(otgt, m2))
    l_heat = focal(heat, tgt)
    l_seg = sum(F.cross_entropy(sg, obj[b][(pts[b, :, :2].abs() < RANGE).all(1)]) for b, sg in enumerate(segs)) / B
    loss = l_heat + l_off + l_seg
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), l_heat.detach(), l_off.detach(), l_seg.detach(), pos.sum()]
report(policy, [model], losses)
