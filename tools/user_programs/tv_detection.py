# Untuned: a torchvision detection model built without weights (weights=None, weights_backbone=None,
# so every backbone layer trains, with BatchNorm2d rather than FrozenBatchNorm2d) and trained as
# torchvision's detection reference script does, for 3 steps on random images and targets: a list
# of images of two sizes (the transform batches and pads them), per-image target dicts of boxes,
# labels and, for Mask R-CNN, instance masks and, for Keypoint R-CNN, keypoints; the model's dict of
# losses summed; SGD (momentum 0.9, weight decay 1e-4) with a LinearLR warmup; clip_grad_norm_. Then
# inference in eval mode under no_grad (postprocessing: score thresholds, batched NMS, mask pasting).
# The models run torchvision's own C++ operators through the dispatcher (roi_align and its backward,
# nms), anchors, box coding and sampling with data-dependent shapes (nonzero, topk, where, index).
# MODEL: fasterrcnn_mobilenet_v3_large_fpn (default), fasterrcnn_resnet50_fpn, maskrcnn_resnet50_fpn,
# keypointrcnn_resnet50_fpn, retinanet_resnet50_fpn, fcos_resnet50_fpn, ssdlite320_mobilenet_v3_large.
# S=N: images of about N pixels a side, and the transform's min_size (default 128, where
# parameters, gradients and momentum are most of the peak; 320 makes activations most of it).
# Needs a torchvision whose C++ operators load beside the installed torch (the user-programs
# README: a matched torch and torchvision).
import os
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
import torchvision
from torchvision.models import detection as D
MODEL = os.environ.get("MODEL", "fasterrcnn_mobilenet_v3_large_fpn")
NC = 5
S = int(os.environ.get("S", "128"))  # S=N: images and the transform's scale (at 128 the weights dominate)
small = dict(min_size=S, max_size=S * 5 // 4)  # the transform resizes every image to this scale
if MODEL == "keypointrcnn_resnet50_fpn":
    model = D.keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=2, num_keypoints=5, **small)
elif MODEL == "ssdlite320_mobilenet_v3_large":
    model = D.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=NC)
else:
    model = getattr(D, MODEL)(weights=None, weights_backbone=None, num_classes=NC, **small)
model.train()
g = torch.Generator().manual_seed(1)

def targets_for(h, w):
    n = int(torch.randint(1, 5, (1,), generator=g))
    xy = torch.rand(n, 2, generator=g) * torch.tensor([w - 40.0, h - 40.0])
    wh = 16 + torch.rand(n, 2, generator=g) * 24
    boxes = torch.cat([xy, xy + wh], 1)
    t = {"boxes": boxes, "labels": torch.randint(1, 2 if "keypoint" in MODEL else NC, (n,), generator=g)}
    if "mask" in MODEL:
        m = torch.zeros(n, h, w, dtype=torch.uint8)
        for i, b in enumerate(boxes.round().long().tolist()):
            m[i, b[1]:b[3], b[0]:b[2]] = 1
        t["masks"] = m
    if "keypoint" in MODEL:
        kp = boxes[:, None, :2] + torch.rand(n, 5, 2, generator=g) * wh[:, None]
        t["keypoints"] = torch.cat([kp, torch.ones(n, 5, 1)], 2)
    return t

params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2)
losses = []
sizes = [(S, S * 5 // 4), (S * 9 // 8, S)]
for step in range(3):
    images = [torch.rand(3, h, w, generator=g) for h, w in sizes]
    targets = [targets_for(h, w) for h, w in sizes]
    loss_dict = model(images, targets)
    loss = sum(loss_dict.values())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 10.0)
    opt.step(); sched.step()
    losses += [loss.detach()] + [v.detach() for _, v in sorted(loss_dict.items())]
model.eval()
with torch.no_grad():
    out = model([torch.rand(3, *sizes[0], generator=g)])
    losses += [out[0]["boxes"].sum(), out[0]["scores"].sum(), torch.tensor(float(len(out[0]["boxes"])))]
report(policy, [model], losses)
