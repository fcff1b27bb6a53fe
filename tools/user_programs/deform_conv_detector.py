# Untuned: a one-stage-plus-ROI detector in miniature on random 96x96 "images" with three random boxes
# each. A conv backbone gives C2/C3/C4 (strides 2/4/8); C3 goes through a modulated deformable conv
# (DCNv2): a 3x3 conv predicts 2*9 offsets and 9 masks (sigmoid). With torchvision it is
# torchvision.ops.deform_conv2d; without it (as here), the same thing by hand: for each of the 9
# kernel taps a sampling grid (base grid + tap + predicted offset, normalised to [-1, 1]) goes to
# F.grid_sample (bilinear, zero padding), the samples are multiplied by the tap's mask, stacked
# im2col-style to (B, C*9, H, W) and mixed by an einsum with the weight (TAPS=1: each tap's samples
# mixed by its own einsum and accumulated, no im2col tensor). A feature pyramid: 1x1
# laterals, P4 upsampled by F.interpolate(nearest) and added to P3, P3 by F.interpolate(bilinear) to
# P2. Dense head on P3: per-location class logits (sigmoid focal loss against centre-sampled
# targets) and l/t/r/b distances (relu) decoded to boxes, generalized IoU loss on positive
# locations. ROI head: jittered ground-truth boxes as proposals, each assigned a pyramid level by
# its size, 7x7 features by roi_align (torchvision.ops.roi_align, or by hand: a 14x14 grid per ROI
# by arange arithmetic, one image's grids stacked into one F.grid_sample call on that image, 2x2
# average pooling), written into a zeros tensor by index_put per level; an MLP, a cross entropy and a GIoU loss on refined boxes. SGD with momentum and clipping, 5 steps.
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
try:
    import torchvision.ops as tvo
except ImportError:
    tvo = None
B, S, NCLS, NGT, CH = 8, 96, 4, 3, 64
TAPS = os.environ.get("TAPS") == "1"
def deform_conv(x, offset, mask, weight, bias):
    if tvo is not None:
        return tvo.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask)
    Bn, C, H, W = x.shape
    ys, xs = torch.meshgrid(torch.arange(H, dtype=x.dtype), torch.arange(W, dtype=x.dtype), indexing="ij")
    cols, acc = [], None
    for k in range(9):
        ky, kx = k // 3 - 1, k % 3 - 1
        py = ys + ky + offset[:, 2 * k]; px = xs + kx + offset[:, 2 * k + 1]
        grid = torch.stack([(px + 0.5) / W * 2 - 1, (py + 0.5) / H * 2 - 1], -1)
        s = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        if TAPS:  # accumulate tap by tap instead of one im2col tensor
            t = torch.einsum("bchw,oc->bohw", s * mask[:, k:k + 1], weight[:, :, k // 3, k % 3])
            acc = t if acc is None else acc + t
            continue
        cols.append(s * mask[:, k:k + 1])
    if TAPS: return acc + bias.view(1, -1, 1, 1)
    col = torch.stack(cols, 2)                                    # B, C, 9, H, W
    return torch.einsum("bckhw,ock->bohw", col, weight.flatten(2)) + bias.view(1, -1, 1, 1)
def roi_align(feat, rois, scale, out=7):
    if tvo is not None:
        return tvo.roi_align(feat, rois, out, spatial_scale=scale, sampling_ratio=2, aligned=True)
    H, W = feat.shape[-2:]
    b = rois[:, 0].long(); box = rois[:, 1:] * scale - 0.5
    t = (torch.arange(2 * out, dtype=feat.dtype) + 0.5) / (2 * out)
    px = box[:, None, 0] + t * (box[:, None, 2] - box[:, None, 0])
    py = box[:, None, 1] + t * (box[:, None, 3] - box[:, None, 1])
    gx = (px + 0.5) / W * 2 - 1; gy = (py + 0.5) / H * 2 - 1
    grid = torch.stack([gx[:, None, :].expand(-1, 2 * out, -1), gy[:, :, None].expand(-1, -1, 2 * out)], -1)
    outs = []
    for i in torch.unique_consecutive(b).tolist():  # ROIs come grouped by image: one grid_sample each
        gi = grid[b == i]
        s = F.grid_sample(feat[i:i + 1], gi.reshape(1, -1, 2 * out, 2), mode="bilinear", padding_mode="zeros", align_corners=False)
        outs.append(s.view(feat.shape[1], gi.shape[0], 2 * out, 2 * out).transpose(0, 1))
    return F.avg_pool2d(torch.cat(outs), 2)
def focal_loss(logits, tgt, alpha=0.25, gamma=2.0):
    if tvo is not None:
        return tvo.sigmoid_focal_loss(logits, tgt, alpha, gamma, reduction="sum")
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, tgt, reduction="none")
    pt = p * tgt + (1 - p) * (1 - tgt)
    return (ce * (1 - pt) ** gamma * (alpha * tgt + (1 - alpha) * (1 - tgt))).sum()
def giou_loss(a, b, eps=1e-7):
    if tvo is not None:
        return tvo.generalized_box_iou_loss(a, b, reduction="mean")
    lt = torch.max(a[:, :2], b[:, :2]); rb = torch.min(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    union = (a[:, 2:] - a[:, :2]).prod(1) + (b[:, 2:] - b[:, :2]).prod(1) - inter
    iou = inter / (union + eps)
    hull = (torch.max(a[:, 2:], b[:, 2:]) - torch.min(a[:, :2], b[:, :2])).prod(1)
    return (1 - iou + (hull - union) / (hull + eps)).mean()
def cbr(i, o, s): return nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.GroupNorm(8, o), nn.ReLU())
class Detector(nn.Module):
    def __init__(s):
        super().__init__()
        s.c2 = nn.Sequential(cbr(3, 32, 2), cbr(32, 32, 1)); s.c3 = nn.Sequential(cbr(32, CH, 2), cbr(CH, CH, 1))
        s.c4 = nn.Sequential(cbr(CH, 128, 2), cbr(128, 128, 1))
        s.off = nn.Conv2d(CH, 27, 3, 1, 1); nn.init.zeros_(s.off.weight); nn.init.zeros_(s.off.bias)
        s.dw = nn.Parameter(torch.randn(CH, CH, 3, 3) * (2 / (CH * 9)) ** 0.5); s.db = nn.Parameter(torch.zeros(CH))
        s.lat2, s.lat3, s.lat4 = nn.Conv2d(32, CH, 1), nn.Conv2d(CH, CH, 1), nn.Conv2d(128, CH, 1)
        s.smooth = nn.ModuleList(cbr(CH, CH, 1) for _ in range(3))
        s.cls = nn.Sequential(cbr(CH, CH, 1), nn.Conv2d(CH, NCLS, 3, 1, 1)); s.reg = nn.Sequential(cbr(CH, CH, 1), nn.Conv2d(CH, 4, 3, 1, 1))
        s.roi = nn.Sequential(nn.Flatten(), nn.Linear(CH * 49, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        s.roi_cls, s.roi_box = nn.Linear(256, NCLS + 1), nn.Linear(256, 4)
    def forward(s, img, rois):
        c2 = s.c2(img); c3 = s.c3(c2); c4 = s.c4(c3)
        om = s.off(c3); offset, mask = om[:, :18], torch.sigmoid(om[:, 18:])
        c3 = F.relu(deform_conv(c3, offset, mask, s.dw, s.db)) + c3
        p4 = s.lat4(c4)
        p3 = s.lat3(c3) + F.interpolate(p4, scale_factor=2, mode="nearest")
        p2 = s.lat2(c2) + F.interpolate(p3, size=c2.shape[-2:], mode="bilinear", align_corners=False)
        p2, p3, p4 = (m(p) for m, p in zip(s.smooth, (p2, p3, p4)))
        dense_cls, dense_reg = s.cls(p3), F.relu(s.reg(p3)) * 4.0
        size = (rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2])
        lvl = (size > 40 ** 2).long() + (size > 20 ** 2).long()  # 0: P2, 1: P3, 2: P4
        feats = torch.zeros(rois.shape[0], CH, 7, 7)
        for i, (p, sc) in enumerate(((p2, 1 / 2), (p3, 1 / 4), (p4, 1 / 8))):
            idx = (lvl == i).nonzero().squeeze(1)
            if idx.numel(): feats = feats.index_put((idx,), roi_align(p, rois[idx], sc))
        h = s.roi(feats)
        return dense_cls, dense_reg, s.roi_cls(h), s.roi_box(h)
model = Detector()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    img = torch.randn(B, 3, S, S, generator=g)
    cxy = torch.rand(B, NGT, 2, generator=g) * (S - 32) + 16; wh = torch.rand(B, NGT, 2, generator=g) * 40 + 12
    gt = torch.cat([cxy - wh / 2, cxy + wh / 2], -1).clamp(0, S - 1); gcls = torch.randint(0, NCLS, (B, NGT), generator=g)
    jit = gt.unsqueeze(2) + torch.randn(B, NGT, 4, 4, generator=g) * 3          # 4 proposals per box
    props = torch.cat([jit[..., :2], torch.max(jit[..., 2:], jit[..., :2] + 4)], -1).reshape(B, -1, 4)
    rois = torch.cat([torch.arange(B).repeat_interleave(NGT * 4)[:, None].float(), props.reshape(-1, 4)], 1)
    dcls, dreg, rcls, rbox = model(img, rois)
    # dense targets: locations (P3 centres) inside a box's centre region are positives
    ctr = (torch.arange(S // 4) * 4 + 2).float()
    cx, cy = ctr.view(1, 1, 1, -1), ctr.view(1, 1, -1, 1)
    gcx, gcy = ((gt[..., 0] + gt[..., 2]) / 2)[..., None, None], ((gt[..., 1] + gt[..., 3]) / 2)[..., None, None]
    inside = ((cx - gcx).abs() < 6) & ((cy - gcy).abs() < 6)                   # B, NGT, h, w
    pos = inside.any(1); which = inside.float().argmax(1)
    tgt = torch.zeros_like(dcls)
    tgt.scatter_(1, gcls.gather(1, which.flatten(1)).view(B, 1, S // 4, S // 4), 1.0)
    tgt = tgt * pos.unsqueeze(1)
    l_focal = focal_loss(dcls, tgt) / pos.sum().clamp(min=1)
    bidx, yi, xi = pos.nonzero().unbind(1)
    d = dreg.permute(0, 2, 3, 1)[bidx, yi, xi]
    pbox = torch.stack([ctr[xi] - d[:, 0], ctr[yi] - d[:, 1], ctr[xi] + d[:, 2], ctr[yi] + d[:, 3]], 1)
    tbox = gt[bidx, which[bidx, yi, xi]]
    l_giou = giou_loss(pbox, tbox)
    rtgt = gcls.repeat_interleave(4, 1).reshape(-1)
    refined = rois[:, 1:] + rbox * 4.0
    l_roi = F.cross_entropy(rcls, rtgt) + giou_loss(refined, gt.repeat_interleave(4, 1).reshape(-1, 4))
    loss = l_focal + l_giou + l_roi
    opt.zero_grad(); loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0); opt.step()
    losses += [loss.detach(), l_focal.detach(), l_giou.detach(), l_roi.detach()]
report(policy, [model], losses)
