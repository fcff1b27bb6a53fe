# Untuned: torchvision's optical flow and its C++ operators with backward passes. MODEL=raft (default):
# RAFT-small built without weights (raft_small(weights=None)) and trained as torchvision's optical
# flow reference script does: a pair of frames, the list of flow predictions from 12 recurrent
# refinement steps (an all-pairs correlation pyramid looked up by grid_sample, a ConvGRU update
# block, convex upsampling by unfold), the sequence loss (every prediction's L1 error to the flow,
# weighted by gamma ** (n - i - 1), masked by a validity mask from the flow's magnitude), AdamW with
# OneCycleLR, clip_grad_norm_. MODEL=ops: a small detector-style net of torchvision.ops with their own
# backward kernels: DeformConv2d whose offsets and mask come from a conv (modulated deformable
# convolution v2), PSRoIAlign and RoIPool on boxes per image, DropBlock2d, StochasticDepth on residual
# branches, sigmoid_focal_loss and generalized_box_iou_loss. Needs torchvision's C++ operators (the
# user-programs README: a matched torch and torchvision). S=N: image side (default 128 for RAFT,
# its least; 96 for ops).
import os
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
import torchvision
from torchvision import ops
MODEL = os.environ.get("MODEL", "raft")
S = int(os.environ.get("S", "128" if MODEL == "raft" else "96"))  # RAFT needs 128 or more
g = torch.Generator().manual_seed(1)

class OpsNet(nn.Module):
    def __init__(s, nc=4):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU())
        s.offset = nn.Conv2d(32, 3 * 9, 3, 1, 1)  # 2 * 9 offsets and 9 mask logits
        nn.init.zeros_(s.offset.weight); nn.init.zeros_(s.offset.bias)
        s.deform = ops.DeformConv2d(32, 64, 3, padding=1)
        s.block = nn.Sequential(nn.Conv2d(64, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 64, 3, 1, 1))
        s.drop_block = ops.DropBlock2d(p=0.1, block_size=3)
        s.depth = ops.StochasticDepth(0.2, "row")
        s.ps = ops.PSRoIAlign(output_size=3, spatial_scale=0.5, sampling_ratio=2)
        s.pool = ops.RoIPool(output_size=3, spatial_scale=0.5)
        s.to_ps = nn.Conv2d(64, 9 * 8, 1)
        s.cls = nn.Linear(8 * 9 + 64 * 9, nc); s.reg = nn.Linear(8 * 9 + 64 * 9, 4)
    def forward(s, x, boxes):
        h = s.stem(x)
        o = s.offset(h)
        h = F.relu(s.deform(h, o[:, :18], torch.sigmoid(o[:, 18:])))
        h = h + s.depth(s.drop_block(s.block(h)))
        f = torch.cat([s.ps(s.to_ps(h), boxes).flatten(1), s.pool(h, boxes).flatten(1)], 1)
        return s.cls(f), s.reg(f)

if MODEL == "raft":
    from torchvision.models.optical_flow import raft_small
    model = raft_small(weights=None)
else:
    model = OpsNet()
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-4, total_steps=10, pct_start=0.3)
losses = []
for step in range(3):
    if MODEL == "raft":
        img1 = torch.rand(2, 3, S, S + 32, generator=g) * 2 - 1
        flow = torch.randn(2, 2, S, S + 32, generator=g) * 3
        img2 = torch.roll(img1, shifts=(1, 2), dims=(2, 3)) + 0.05 * torch.randn(img1.shape, generator=g)
        preds = model(img1, img2, num_flow_updates=12)
        valid = (flow.abs().sum(1) < 8).float()
        n = len(preds)
        loss = sum(0.8 ** (n - i - 1) * ((p - flow).abs().sum(1) * valid).mean() for i, p in enumerate(preds))
    else:
        x = torch.randn(4, 3, S, S, generator=g)
        xy = torch.rand(12, 2, generator=g) * (S - 24)
        boxes = torch.cat([torch.arange(4).repeat_interleave(3)[:, None].float(), xy, xy + 8 + torch.rand(12, 2, generator=g) * 16], 1)
        logits, deltas = model(x, boxes)
        target = F.one_hot(torch.randint(0, 4, (12,), generator=g), 4).float()
        pred_boxes = boxes[:, 1:] + deltas
        loss = ops.sigmoid_focal_loss(logits, target, reduction="mean") + ops.generalized_box_iou_loss(
            ops.box_convert(ops.box_convert(pred_boxes, "xyxy", "cxcywh").abs(), "cxcywh", "xyxy"), boxes[:, 1:], reduction="mean")
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step()
    losses.append(loss.detach())
model.eval()
with torch.no_grad():
    if MODEL == "raft":
        losses.append(model(img1[:1], img2[:1], num_flow_updates=4)[-1].abs().mean())
    else:
        losses.append(model(x, boxes)[0].sum())
report(policy, [model], losses)
