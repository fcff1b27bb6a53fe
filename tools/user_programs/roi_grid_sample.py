# Untuned: a two-stage detector in miniature on random 64x64 "images" with two random ground-truth boxes
# each. A conv backbone (stride 4), then a deformable-conv-like layer: a conv predicts per-pixel
# sampling offsets (tanh-scaled), added to an identity grid from F.affine_grid, features resampled by
# F.grid_sample and mixed back by a conv with a residual add. A region proposal head predicts 3
# anchors' objectness and (dx, dy, dw, dh) per location; deltas are decoded into boxes (centre shift
# times anchor size, exp of clamped dw/dh), scores sorted by topk(16) per image and boxes gathered
# (not detached: the ROI loss reaches the proposals through the sampling grid). ROI pooling: one
# affine grid per ROI (theta built by torch.stack of box centre and half sizes, F.affine_grid to
# 7x7), the feature maps repeated per ROI by index_select with batch indices, F.grid_sample. A box
# head (MLP) gives class logits and refinement deltas. Targets by IoU with the ground truth under
# no_grad (argmax matches, boolean-masked positives); losses: RPN BCE-with-logits objectness + smooth
# L1 on positive anchors' deltas, ROI cross entropy + smooth L1 on positive ROIs' refined boxes.
# SGD with momentum, gradient clipping, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, R, C, NCLS, A, K, P, NGT = 4, 64, 64, 5, 3, 16, 7, 2
SIZES = torch.tensor([0.25, 0.5, 0.9])  # anchor side in normalised [-1, 1] units
def cxcywh_to_xyxy(b): return torch.cat([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], -1)
def box_iou(a, b):  # a (..., N, 4), b (..., M, 4) xyxy
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2]); rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])
    return inter / (area(a)[..., :, None] + area(b)[..., None, :] - inter + 1e-6)
def decode(anchors, d):
    cxy = anchors[..., :2] + d[..., :2] * anchors[..., 2:]
    wh = anchors[..., 2:] * torch.exp(d[..., 2:].clamp(max=math.log(1000.0 / 16)))
    return torch.cat([cxy, wh], -1)
class DeformSample(nn.Module):
    def __init__(s, ch):
        super().__init__()
        s.offset = nn.Conv2d(ch, 2, 3, padding=1)
        s.mix = nn.Conv2d(ch, ch, 3, padding=1)
    def forward(s, x):
        b, _, h, w = x.shape
        theta = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).expand(b, 2, 3)
        base = F.affine_grid(theta, (b, 1, h, w), align_corners=False)
        off = torch.tanh(s.offset(x)).permute(0, 2, 3, 1) * (2.0 / h)
        sampled = F.grid_sample(x, base + off, mode="bilinear", padding_mode="border", align_corners=False)
        return F.relu(x + s.mix(sampled))
class Detector(nn.Module):
    def __init__(s):
        super().__init__()
        s.backbone = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                   nn.Conv2d(32, 48, 3, stride=2, padding=1), nn.BatchNorm2d(48), nn.ReLU(),
                                   nn.Conv2d(48, C, 3, stride=2, padding=1), nn.BatchNorm2d(C), nn.ReLU(),
                                   nn.Conv2d(C, C, 3, padding=1), nn.ReLU())
        s.deform = DeformSample(C)
        s.rpn_conv = nn.Conv2d(C, C, 3, padding=1)
        s.rpn_obj = nn.Conv2d(C, A, 1); s.rpn_box = nn.Conv2d(C, 4 * A, 1)
        s.head = nn.Sequential(nn.Flatten(), nn.Linear(C * P * P, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        s.cls = nn.Linear(256, NCLS + 1); s.reg = nn.Linear(256, 4)
    def anchors(s, h, w):
        ys = (torch.arange(h) + 0.5) / h * 2 - 1; xs = (torch.arange(w) + 0.5) / w * 2 - 1
        cy, cx = torch.meshgrid(ys, xs, indexing="ij")
        a = torch.stack([cx.expand(A, h, w), cy.expand(A, h, w), SIZES.view(A, 1, 1).expand(A, h, w), SIZES.view(A, 1, 1).expand(A, h, w)], -1)
        return a.reshape(-1, 4)  # (A*h*w, 4), anchor-major like the logits below
    def forward(s, x):
        f = s.deform(s.backbone(x))
        b, _, h, w = f.shape
        t = F.relu(s.rpn_conv(f))
        obj = s.rpn_obj(t).reshape(b, A * h * w)
        deltas = s.rpn_box(t).view(b, A, 4, h, w).permute(0, 1, 3, 4, 2).reshape(b, A * h * w, 4)
        anchors = s.anchors(h, w)
        boxes = decode(anchors, deltas)
        scores, idx = obj.sigmoid().topk(K, dim=1)
        props = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
        rois = props.reshape(b * K, 4)
        batch_idx = torch.arange(b).repeat_interleave(K)
        zero = torch.zeros_like(rois[:, 0])
        theta = torch.stack([torch.stack([rois[:, 2] / 2, zero, rois[:, 0]], -1),
                             torch.stack([zero, rois[:, 3] / 2, rois[:, 1]], -1)], 1)
        grid = F.affine_grid(theta, (b * K, C, P, P), align_corners=False)
        pooled = F.grid_sample(f.index_select(0, batch_idx), grid, align_corners=False)
        hfeat = s.head(pooled)
        refined = decode(rois.detach(), s.reg(hfeat) * 0.1).view(b, K, 4)
        return obj, deltas, anchors, props, s.cls(hfeat).view(b, K, -1), refined
model = Detector()
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
g = torch.Generator().manual_seed(1)
def batch():
    x = torch.rand(B, 3, R, R, generator=g)
    c = torch.rand(B, NGT, 2, generator=g) * 1.2 - 0.6; wh = torch.rand(B, NGT, 2, generator=g) * 0.6 + 0.3
    gt = torch.cat([c, wh], -1)
    labels = torch.randint(1, NCLS + 1, (B, NGT), generator=g)
    for i in range(B):  # paint the boxes so there is something to find
        for j in range(NGT):
            x0, y0, x1, y1 = ((cxcywh_to_xyxy(gt[i, j]) + 1) / 2 * R).clamp(0, R).long().tolist()
            x[i, :, y0:y1, x0:x1] = labels[i, j].float() / NCLS
    return x, gt, labels
losses = []
for step in range(3):
    x, gt, labels = batch()
    obj, deltas, anchors, props, cls_logits, refined = model(x)
    with torch.no_grad():
        iou_a = box_iou(cxcywh_to_xyxy(anchors).expand(B, -1, -1), cxcywh_to_xyxy(gt))
        best_a, match_a = iou_a.max(-1)
        obj_t = (best_a > 0.4).float()
        gt_a = gt.gather(1, match_a.unsqueeze(-1).expand(-1, -1, 4))
        d_t = torch.cat([(gt_a[..., :2] - anchors[..., :2]) / anchors[..., 2:], torch.log(gt_a[..., 2:] / anchors[..., 2:])], -1)
        iou_r = box_iou(cxcywh_to_xyxy(props), cxcywh_to_xyxy(gt))
        best_r, match_r = iou_r.max(-1)
        cls_t = torch.where(best_r > 0.3, labels.gather(1, match_r), torch.zeros_like(match_r))
        gt_r = gt.gather(1, match_r.unsqueeze(-1).expand(-1, -1, 4))
    pos_a = obj_t.bool()
    loss_obj = F.binary_cross_entropy_with_logits(obj, obj_t)
    loss_rpn_box = F.smooth_l1_loss(deltas[pos_a], d_t[pos_a], beta=1 / 9, reduction="sum") / max(int(pos_a.sum()), 1)
    loss_cls = F.cross_entropy(cls_logits.reshape(-1, NCLS + 1), cls_t.reshape(-1))
    pos_r = cls_t > 0
    loss_box = F.smooth_l1_loss(refined[pos_r], gt_r[pos_r], reduction="sum") / max(int(pos_r.sum()), 1)
    loss = loss_obj + loss_rpn_box + loss_cls + loss_box
    opt.zero_grad()
    loss.backward()
    gn = nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    losses += [loss.detach(), loss_obj.detach(), loss_rpn_box.detach(), loss_cls.detach(), loss_box.detach(), gn,
               pos_a.sum(), pos_r.sum(), props.detach().sum()]
report(policy, [model], losses)
